"""``bandwidth``: the stream limited to ``rate`` KB/s (KB = 1000 bytes)."""

from __future__ import annotations

import trio

from faultnet.toxics._attributes import INT64_MIN, Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["Bandwidth"]

#: A chunk is passed on in pieces of at most this much transmission time, so the output
#: is smooth and a rate change applies within this bound (Toxiproxy uses 100 ms too).
PIECE_SECONDS = 0.1


@register
class Bandwidth(AttributeToxic):
    """Pace the stream at ``rate`` KB/s; ``rate <= 0`` means unlimited.

    Each piece leaves when the virtual clock of the stream says its bytes have been
    "transmitted": the clock starts at the chunk's read time or where the previous piece
    left off, whichever is later, so an idle stream earns no burst credit.

    Compiled: on the native plane a chain of this one toxic runs on the plane's thread
    (the same pieces and clock, its timer to the microsecond); the clock starts afresh
    when the chain moves between trio and the plane.
    """

    type = "bandwidth"
    ATTRIBUTES = (
        Attribute("rate", 0, "rate limit in KB/s, KB = 1000 bytes; <= 0 is unlimited", INT64_MIN),
    )
    rate: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: (kind, rate KB/s, unused, unused)."""
        return ("bandwidth", float(self.rate), 0.0, 0.0)

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        pos = 0
        while pos < len(data):
            rate = self.rate  # read per piece: an update applies within PIECE_SECONDS
            if rate <= 0:
                ctx.state.pop("clock", None)
                await ctx.forward(data[pos:], t_read)
                return
            bytes_per_second = rate * 1000
            piece = data[pos : pos + max(1, int(bytes_per_second * PIECE_SECONDS))]
            start = max(ctx.state.get("clock", t_read), t_read)
            due = start + len(piece) / bytes_per_second
            ctx.state["clock"] = due
            await trio.sleep_until(due)
            await ctx.forward(piece, due)
            pos += len(piece)
