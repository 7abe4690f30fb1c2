"""What the protocol toxics share (HTTP's, Redis's, PostgreSQL's): a rule's seeded
share, a pure session per connection, and the driver that carries its commands out.

A protocol toxic judges the requests of one connection with a pure session
(:mod:`faultnet.protocols`: bytes in, commands out). A request its rule picks is
faulted when the ``count`` allows (0: no limit; the first drawn count) and the
``percent`` draw says so: a draw seeded by the proxy's seed, the toxic's name and the
request's identity, which only the client decides (never the arrival order, so the same
seed faults the same requests however clients interleave). :class:`ProtocolToxic`
declares that once, with the session kept in the connection's stage state and fed by
``on_chunk``/``on_eof``; :func:`carry_out` does what the session said, in order.

``fault`` (:func:`fault_attribute`) is the Redis and PostgreSQL toxics' one switch of
fault (:data:`FAULTS`): one type with a ``fault`` attribute rather than a type a fault,
as the ``dns`` toxic has an ``action``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import trio

from faultnet.protocols.http import (
    DATA_COMMANDS,
    Close,
    Command,
    Eof,
    Forward,
    Hold,
    Reset,
    Resume,
)
from faultnet.seeds import derive_seed
from faultnet.toxics._attributes import Attribute, AttributeToxic, TextAttribute
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage

__all__ = [
    "FAULTS",
    "ProtocolToxic",
    "TimedSession",
    "carry_out",
    "drawn_attributes",
    "end_or_wake",
    "fault_attribute",
]

#: What a matching request meets, in the Redis and PostgreSQL toxics (their tables).
FAULTS = ("error", "delay", "hold", "close")


def fault_attribute(unit: str) -> TextAttribute:
    """The ``fault`` attribute (:data:`FAULTS`) of a toxic whose requests are *unit*."""
    return TextAttribute("fault", "error", f"what a matching {unit} meets", FAULTS)


def drawn_attributes(unit: str, units: str) -> tuple[Attribute, Attribute]:
    """``percent`` and ``count`` of a rule on *units* (``"command"``, ``"commands"``):
    the share of matching ones faulted, drawn per *unit*, and the most faulted (a
    count of requests, whatever the protocol calls them)."""
    counted = "requests" if units == "requests" else f"requests ({units})"
    return (
        Attribute("percent", 100, f"percent of matching {units} faulted, drawn per {unit}", 0, 100),
        Attribute("count", 0, f"most {counted} faulted, the first drawn; 0: no limit"),
    )


class TimedSession(Protocol):
    """A protocol session whose holds :func:`carry_out` waits out (HTTP's, RESP's,
    PostgreSQL's)."""

    def receive(self, stream: str, data: bytes, now: float) -> list[Command]: ...

    def receive_eof(self, stream: str, now: float) -> list[Command]: ...

    def timer(self, stream: str, now: float) -> list[Command]: ...


async def end_or_wake(stage: ToxicStage, wake: dict[str, trio.Event], cmd: object) -> bool | None:
    """Carry out *cmd* if it ends the connection (:class:`Close`, :class:`Reset`: True)
    or wakes a held stream (:class:`Resume`, whose event is in *wake*: False); None for
    any other command, left to the caller."""
    if isinstance(cmd, Close):
        await stage.close()
        return True
    if isinstance(cmd, Reset):
        await stage.reset()
        return True
    if isinstance(cmd, Resume):
        event = wake.pop(cmd.stream, None)
        if event is not None:
            event.set()
        return False
    return None


async def carry_out(stage: ToxicStage, session: TimedSession, commands: list[Command]) -> None:
    """Do what *session* said, in order, in the task of *stage*'s stream; a
    :class:`Hold` waits here (so the stream is not read meanwhile) until its time or a
    :class:`Resume`, then asks the session again. The stage's ``state`` keeps the
    events a held stream waits on (``http_wake``: set up by whoever made the session)."""
    wake: dict[str, trio.Event] = stage.state["http_wake"]
    while True:
        hold: Hold | None = None
        for cmd in commands:
            if isinstance(cmd, DATA_COMMANDS):
                if cmd.data:
                    target = stage.on(cmd.stream)
                    assert target is not None, "a protocol toxic sees both streams"
                    t = cmd.t_read if isinstance(cmd, Forward) else None
                    await target.inject(cmd.data, t)
            elif isinstance(cmd, Eof):
                target = stage.on(cmd.stream)
                assert target is not None
                await target.inject_eof()
            elif (ended := await end_or_wake(stage, wake, cmd)) is not None:
                if ended:
                    return
            else:
                assert isinstance(cmd, Hold)
                hold = cmd
        if hold is None:
            return
        event = wake[hold.stream] = trio.Event()
        with trio.move_on_at(math.inf if hold.until is None else hold.until):
            await event.wait()
        wake.pop(hold.stream, None)
        commands = session.timer(hold.stream, trio.current_time())


class ProtocolToxic(AttributeToxic):
    """Base of the protocol toxics: the rule's count and draw (:meth:`_drawn`), and the
    connection's session (:meth:`new_session`), fed both streams. A subclass declares
    ``percent`` and ``count`` (:func:`drawn_attributes`) among its attributes."""

    both_streams = True
    layer = 1
    #: Where a connection's session is kept in its stage's state.
    session_key = ""
    percent: int
    count: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Requests this toxic matched, and faulted, over every connection.
        self.matched = 0
        self.faulted = 0

    @classmethod
    def _refuse_inconsistent(cls, values: Mapping[str, Any]) -> None:
        """Raise ValueError for attribute *values* that make a rule meaning nothing: a
        ``fault`` of ``delay`` without ``delay_ms``."""
        if values.get("fault") == "delay" and not values.get("delay_ms"):
            raise ValueError("fault delay needs delay_ms, a time in milliseconds above 0")

    def check_update(self, attributes: Any) -> dict[str, Any]:
        """The checked *attributes*; ValueError when, with the values in force, they make
        a rule that means nothing (:meth:`_refuse_inconsistent`)."""
        checked = self.check_attributes(attributes)
        self._refuse_inconsistent({**self.attributes(), **checked})
        return checked

    def _drawn(self, seed: int, kind: str, identity: Callable[[], tuple[object, ...]]) -> bool:
        """Whether a request the rule matched is faulted: the count, then the draw (from
        *seed*, this toxic's name, *kind* and the request's *identity*, asked only when
        a draw is made)."""
        self.matched += 1
        if self.count and self.faulted >= self.count:
            return False
        if self.percent < 100:
            draw = random.Random(derive_seed(seed, self.name, kind, *identity())).random()
            if draw * 100 >= self.percent:
                return False
        self.faulted += 1
        return True

    def new_session(self, stage: ToxicStage) -> TimedSession:
        """A fresh session for *stage*'s connection."""
        raise NotImplementedError

    def _session(self, ctx: ToxicContext) -> TimedSession:
        session: TimedSession | None = ctx.state.get(self.session_key)
        if session is None:
            session = ctx.state[self.session_key] = self.new_session(cast(ToxicStage, ctx))
            ctx.state["http_wake"] = {}  # carry_out's
        return session

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        session = self._session(ctx)
        await carry_out(cast(ToxicStage, ctx), session, session.receive(ctx.stream, data, t_read))

    async def on_eof(self, ctx: ToxicContext) -> None:
        session = self._session(ctx)
        now = trio.current_time()
        await carry_out(cast(ToxicStage, ctx), session, session.receive_eof(ctx.stream, now))
