"""``slicer``: chunks split into pieces of ``average_size`` ± ``size_variation`` bytes,
``delay`` microseconds apart.

Theory of operation: the pauses are a schedule, not a sleep after each send. Piece *i*
of a run is due ``delay`` after piece *i - 1* was *due* (not after it was sent), so the
time a send, a wake-up or the scheduler takes is not added to every pause. The wait for
a due time is a timerfd (nanosecond resolution) whose readiness trio's own epoll
reports: trio's timer sleeps in whole milliseconds (``epoll_wait``'s timeout, rounded
up), so a 100 µs pause took ~1.5 ms and 500 KB in 64-byte slices 15.2 s instead of
~0.8 s. Pieces already due (after a late wake-up) go out back to back, each its own
write; a schedule that fell more than ``_MAX_LAG`` behind (a write held up by a slow
reader, a starved process) starts again from now rather than paying the debt in a burst.
Under trio's MockClock (tests) the wait is an ordinary trio sleep.
"""

from __future__ import annotations

import trio

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.clock import sleep_until_precisely
from faultnet.toxics.draws import draws_of
from faultnet.toxics.registry import register

__all__ = ["Slicer"]

#: How far behind its schedule a stream may fall and still catch up with pieces sent back
#: to back; beyond it the schedule restarts from now. Wake-ups measured here were late by
#: 50-150 µs at a load of 7 on 2 cores; a write blocked by a slow reader can be late by
#: anything.
_MAX_LAG = 0.002


@register
class Slicer(AttributeToxic):
    """Split every chunk into small pieces, with a pause between consecutive pieces.

    Piece sizes are drawn uniformly from ``average_size ± size_variation`` (at least 1
    byte) from the stage's seeded :class:`~faultnet.toxics.draws.Draws`, a piece's size
    when it comes to be cut. ``average_size`` 0 passes chunks whole. The
    pause separates every two consecutive pieces of the stream, across chunks too, kept
    as a schedule (piece *i* due ``delay`` after piece *i - 1* was due), so it holds to
    within ~20 % down to 100 µs (the median of the gaps between pieces, measured). Bytes
    are kept exact and in order.

    Compiled: on the native plane a chain of this one toxic runs on the plane's thread
    (``slice_head`` in faultnet/planes/_native.c: the same sizes from the same draws, the
    same schedule, its timer to the microsecond, at most 16 pieces per turn of the
    thread); the schedule starts afresh when the chain moves between trio and the plane.
    """

    type = "slicer"
    ATTRIBUTES = (
        Attribute("average_size", 0, "mean size of a piece, in bytes"),
        Attribute("size_variation", 0, "random variation of a piece's size, ± bytes"),
        Attribute("delay", 0, "pause between two pieces, in microseconds"),
    )
    average_size: int
    size_variation: int
    delay: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: (kind, average_size, size_variation,
        delay us)."""
        return ("slicer", float(self.average_size), float(self.size_variation), float(self.delay))

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        pos = 0
        while pos < len(data):
            size = self.average_size
            if size <= 0:
                size = len(data) - pos
            elif self.size_variation > 0:
                draws = draws_of(ctx.state, ctx.rng)
                size = max(1, size + draws.integer(-self.size_variation, self.size_variation))
            piece = data[pos : pos + size]
            delay = max(0, self.delay) / 1_000_000
            due = t_read
            scheduled = ctx.state.get("next_due")
            if scheduled is not None and delay > 0:
                due = max(due, scheduled)
                now = trio.current_time()
                if due > now:
                    await sleep_until_precisely(due)
                elif now - due > _MAX_LAG:
                    due = now  # too far behind to catch up: the schedule restarts
            await ctx.forward(piece, due)
            ctx.state["next_due"] = due + delay
            pos += len(piece)
