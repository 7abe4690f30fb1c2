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
import functools
import itertools

from faultnet.protocols.resp import PUSH_COMMANDS, Plan, Request, Session, error_reply
from faultnet.toxics._attributes import Attribute, TextAttribute
from faultnet.toxics._protocol import FAULTS, ProtocolToxic, drawn_attributes, fault_attribute
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = ["FAULTS", "Redis"]


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


@functools.lru_cache(maxsize=64)
def _names(command: str) -> frozenset[str]:
    """The names a ``command`` attribute lists, upper case: parsed once per text, not
    per command (the set built per command was ~5 % of a non-matching toxic's time)."""
    return frozenset(n.strip().upper() for n in command.split(",") if n.strip())


@register
class Redis(ProtocolToxic):
    """Redis faults on matching commands (see the module docstring)."""

    type = "redis"
    session_key = "redis"
    ATTRIBUTES = (
        fault_attribute("command"),
        TextAttribute("command", "", "command names matched, comma-separated, any case; empty: any"),
        TextAttribute("key", "", "a glob on the command's first argument; empty: any"),
        TextAttribute(
            "error", "ERR injected by faultnet", "the error reply's text (fault error)",
            parse=_error,
        ),
        Attribute("delay_ms", 0, "how long the reply is held, in milliseconds (fault delay)"),
        *drawn_attributes("command", "commands"),
    )  # fmt: skip
    fault: str
    command: str
    key: str
    error: str
    delay_ms: int

    def matches(self, request: Request) -> bool:
        """Whether ``command`` and ``key`` name *request* (not percent, not count)."""
        if self.command:
            if request.name.decode("latin-1") not in _names(self.command):
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
        key = b"" if request.key is None else request.key
        drawn = self._drawn(seed, "command", lambda: (request.name, key, f"#{ordinal}"))
        return self.plan() if drawn else None

    def plan(self) -> Plan:
        """What the fault in force does to one command."""
        if self.fault == "error":
            return Plan("error", {"error": self.error}, error=error_reply(self.error))
        if self.fault == "delay":
            return Plan("delay", {"delay_ms": self.delay_ms}, delay=self.delay_ms / 1000)
        if self.fault == "hold":
            return Plan("hold", hold=True)
        return Plan("close", close=True)

    def new_session(self, stage: ToxicStage) -> Session:
        seed = stage.seed
        ordinals = itertools.count()  # every command on this connection, in order
        return Session(lambda r: self.decide(r, seed, next(ordinals)), stage.log_event)
