"""Redis faults on the commands a client sends (RESP2 and RESP3), as one toxic type,
on top of :mod:`faultnet.protocols.resp`.

``redis`` matches commands by ``command`` (names, comma-separated, any case; ``""``
any) and ``key`` (a glob on the command's first argument, where Redis keeps the key of
most commands; ``""`` any, with or without one), ``percent`` of them drawn per command
from the proxy's seed, the toxic's name and the command's identity (its name, its first
argument and its ordinal on its connection: the client's to decide, never the arrival
order, as the HTTP toxics draw), at most ``count`` of them (0: no limit; ``count=2``
fails the first two, for retry tests). A matching command meets ``fault``:

======== ============================================== ==============================
fault    what is done                                   what a client sees
======== ============================================== ==============================
error    answered with ``error`` (``-READONLY ...``);   the server's error reply, in
         the server never sees the command              its place among the replies
delay    its reply held ``delay_ms`` from when it       a slow reply (replies after
         reached the proxy                              it wait: RESP keeps order)
hold     never forwarded, nor anything after it; the    no reply: the read times out
         replies owed before it still come
close    its reply's first line sent without its CRLF,  the connection closed
         then the connection closed (FIN both ways)     mid-reply
======== ============================================== ==============================

One type with a ``fault`` attribute rather than a type per fault (``redis_error``,
``redis_delay``...), as the ``dns`` toxic has an ``action``: the faults share every
other attribute, a rule reads the same whatever it does, and a switch of fault is a
live update of one toxic. ``error`` is the reply's text, its ``-`` optional: a client
library picks its exception by the text's first word and, for some, the whole message
(redis-py's ``OOM command not allowed when used memory > 'maxmemory'.`` is an
``OutOfMemoryError``, another OOM text a ``ResponseError``), so copy the real server's.
``MOVED`` and ``ASK`` must name their target: ``MOVED 3999 127.0.0.1:6381``.

``SUBSCRIBE``, ``PSUBSCRIBE``, ``SSUBSCRIBE`` and ``MONITOR`` turn the connection into
pushes, passed untouched from then on; they meet ``error`` and ``hold`` only (delay and
close pass them, uncounted). Inside ``MULTI`` an error fault answers the queued command
and the server never sees it: ``EXEC`` then runs without it (a real server's queuing
error aborts the ``EXEC`` with ``-EXECABORT``).

One ``redis_fault`` record per faulted command (its name, key, the fault and its
figures) when the fault takes effect. Commands no rule faults cross byte-identical.
The toxic sees both streams (``both_streams``), whatever its ``stream`` says.
"""

from __future__ import annotations

import fnmatch
import itertools
import random
from collections.abc import Mapping
from typing import Any, cast

import trio

from faultnet.protocols.resp import PUSH_COMMANDS, Plan, Request, Session, error_reply
from faultnet.seeds import derive_seed
from faultnet.toxics._attributes import Attribute, AttributeToxic, TextAttribute
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.http import carry_out
from faultnet.toxics.registry import register

__all__ = ["FAULTS", "Redis"]

#: What a matching command meets (the table above).
FAULTS = ("error", "delay", "hold", "close")


def _error(text: str) -> None:
    """An error reply's text: one line, a word first; ``MOVED``/``ASK`` with a slot
    (0-16383) and a ``host:port`` (ValueError otherwise)."""
    error_reply(text)
    words = text.removeprefix("-").split()
    if not words:
        raise ValueError("error must say something: 'ERR ...', 'READONLY ...'")
    if words[0] in ("MOVED", "ASK"):
        slot = words[1] if len(words) > 1 else ""
        target = words[2] if len(words) > 2 else ""
        host, sep, port = target.rpartition(":")
        if not (slot.isdigit() and int(slot) <= 16383 and host and sep and port.isdigit()):
            raise ValueError(
                f"error {words[0]} names a slot and a target: "
                f"'{words[0]} 3999 127.0.0.1:6381', not {text!r}"
            )


@register
class Redis(AttributeToxic):
    """Redis faults on matching commands (see the module docstring)."""

    type = "redis"
    both_streams = True
    layer = 1
    ATTRIBUTES = (
        TextAttribute("fault", "error", "what a matching command meets", choices=FAULTS),
        TextAttribute("command", "", "command names matched, comma-separated, any case; empty: any"),
        TextAttribute("key", "", "a glob on the command's first argument; empty: any"),
        TextAttribute(
            "error", "ERR injected by faultnet", "the error reply's text (fault error)",
            parse=_error,
        ),
        Attribute("delay_ms", 0, "how long the reply is held, in milliseconds (fault delay)"),
        Attribute("percent", 100, "percent of matching commands faulted, drawn per command", 0, 100),
        Attribute("count", 0, "most requests (commands) faulted, the first drawn; 0: no limit"),
    )  # fmt: skip
    fault: str
    command: str
    key: str
    error: str
    delay_ms: int
    percent: int
    count: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Commands this toxic matched, and faulted, over every connection.
        self.matched = 0
        self.faulted = 0

    def check_update(self, attributes: Any) -> dict[str, Any]:
        """The checked *attributes*; ValueError when, with the values in force, they
        ask for a delay of 0 ms."""
        checked = self.check_attributes(attributes)
        merged = {**self.attributes(), **checked}
        if merged["fault"] == "delay" and not merged["delay_ms"]:
            raise ValueError("fault delay needs delay_ms, a time in milliseconds above 0")
        return checked

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Merge *attributes*, all or nothing (refused as :meth:`check_update` says)."""
        self.check_update(attributes)
        super().update(attributes)

    def matches(self, request: Request) -> bool:
        """Whether ``command`` and ``key`` name *request* (not percent, not count)."""
        if self.command:
            names = {n.strip().upper() for n in self.command.split(",") if n.strip()}
            if request.name.decode("latin-1") not in names:
                return False
        if self.key:  # Redis's keys are binary-safe and case-sensitive
            key = request.key
            return key is not None and fnmatch.fnmatchcase(key.decode("latin-1"), self.key)
        return True

    def decide(self, request: Request, seed: int, ordinal: int) -> Plan | None:
        """The plan for *request*, the *ordinal*-th (from 0) on its connection, or None
        to pass it: the rule, then the count, then the draw."""
        if not self.matches(request):
            return None
        if self.fault in ("delay", "close") and request.name in PUSH_COMMANDS:
            return None
        self.matched += 1
        if self.count and self.faulted >= self.count:
            return None
        if self.percent < 100:
            key = b"" if request.key is None else request.key
            identity = (request.name, key, f"#{ordinal}")
            draw = random.Random(derive_seed(seed, self.name, "command", *identity)).random()
            if draw * 100 >= self.percent:
                return None
        self.faulted += 1
        return self.plan()

    def plan(self) -> Plan:
        """What the fault in force does to one command."""
        if self.fault == "error":
            return Plan("error", {"error": self.error}, error=error_reply(self.error))
        if self.fault == "delay":
            return Plan("delay", {"delay_ms": self.delay_ms}, delay=self.delay_ms / 1000)
        if self.fault == "hold":
            return Plan("hold", hold=True)
        return Plan("close", close=True)

    def _session(self, ctx: ToxicContext) -> Session:
        session: Session | None = ctx.state.get("redis")
        if session is None:
            stage = cast(ToxicStage, ctx)
            seed = stage.seed
            ordinals = itertools.count()  # every command on this connection, in order
            session = Session(lambda r: self.decide(r, seed, next(ordinals)), stage.log_event)
            ctx.state["redis"] = session
            ctx.state["http_wake"] = {}  # carry_out's
        return session

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        session = self._session(ctx)
        await carry_out(cast(ToxicStage, ctx), session, session.receive(ctx.stream, data, t_read))

    async def on_eof(self, ctx: ToxicContext) -> None:
        session = self._session(ctx)
        now = trio.current_time()
        await carry_out(cast(ToxicStage, ctx), session, session.receive_eof(ctx.stream, now))
