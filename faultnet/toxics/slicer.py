"""``slicer``: chunks split into pieces of ``average_size`` ± ``size_variation`` bytes,
``delay`` microseconds apart."""

from __future__ import annotations

import trio

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["Slicer"]


@register
class Slicer(AttributeToxic):
    """Split every chunk into small pieces, with a pause between consecutive pieces.

    Piece sizes are drawn uniformly from ``average_size ± size_variation`` (at least 1
    byte) with the connection's seeded rng. ``average_size`` 0 passes chunks whole. The
    pause separates every two consecutive pieces of the stream, across chunks too. Bytes
    are kept exact and in order.
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

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        pos = 0
        while pos < len(data):
            size = self.average_size
            if size <= 0:
                size = len(data) - pos
            elif self.size_variation > 0:
                size = max(1, size + ctx.rng.randint(-self.size_variation, self.size_variation))
            piece = data[pos : pos + size]
            due = t_read
            last = ctx.state.get("last_sent")
            if last is not None and self.delay > 0:
                due = max(due, last + self.delay / 1_000_000)
                await trio.sleep_until(due)
            await ctx.forward(piece, due)
            ctx.state["last_sent"] = trio.current_time()
            pos += len(piece)
