"""The protocol sessions' tables, played (mitmproxy's ``tutils.Playbook``): each step is
an event with its time, and the commands the session must give out for it, written as
short tuples (:func:`simple`). No socket."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from faultnet.protocols.http import Close, Command, Eof, Forward, Hold, Inject, Resume

U, D = "upstream", "downstream"

#: One step: ``up``/``down`` (bytes read), ``up_eof``/``down_eof``, or ``timer`` (a
#: hold of a stream came due); what it carries (the bytes, or the timer's stream); the
#: time; the commands expected, simple.
Step = tuple[str, object, float, list[tuple[object, ...]]]


class Played(Protocol):
    def receive(self, stream: str, data: bytes, now: float) -> list[Command]: ...

    def receive_eof(self, stream: str, now: float) -> list[Command]: ...

    def timer(self, stream: str, now: float) -> list[Command]: ...


def simple(cmd: Command) -> tuple[object, ...]:
    """A command as a short tuple: (kind, stream, data or time)."""
    if isinstance(cmd, Forward):
        return ("fwd", cmd.stream, cmd.data)
    if isinstance(cmd, Inject):
        return ("inject", cmd.stream, cmd.data)
    if isinstance(cmd, Hold):
        return ("hold", cmd.stream, cmd.until)
    if isinstance(cmd, Resume):
        return ("resume", cmd.stream)
    if isinstance(cmd, Eof):
        return ("eof", cmd.stream)
    return ("close",) if isinstance(cmd, Close) else ("reset",)


def event(session: Played, kind: str, arg: object, now: float) -> list[Command]:
    """Give *session* one event (see :data:`Step`); the commands it gives out."""
    if kind in ("up", "down"):
        assert isinstance(arg, bytes)
        return session.receive(U if kind == "up" else D, arg, now)
    if kind in ("up_eof", "down_eof"):
        return session.receive_eof(U if kind == "up_eof" else D, now)
    assert kind == "timer" and isinstance(arg, str), (kind, arg)
    return session.timer(arg, now)


def play(session: Played, steps: Iterable[Step], timer: str | None = None) -> None:
    """Each step's event, and its commands as the step expects; *timer*: the stream
    every ``timer`` step is of (a session that holds one stream only)."""
    for i, (kind, arg, now, expected) in enumerate(steps):
        got = event(session, kind, timer if kind == "timer" and timer else arg, now)
        assert [simple(c) for c in got] == expected, (i, kind, arg)


def in_chunks(data: bytes, size: int) -> list[bytes]:
    """*data* as reads of *size* bytes (the last one shorter): a stream at a chunk size."""
    return [data[at : at + size] for at in range(0, len(data), size)]
