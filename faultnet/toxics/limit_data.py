"""``limit_data``: at most ``bytes`` bytes forwarded on the stream, then the connection
closes."""

from __future__ import annotations

import builtins

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["LimitData"]


@register
class LimitData(AttributeToxic):
    """Forward exactly the first ``bytes`` bytes, then close the connection (clean FIN).

    The count is per connection and survives updates; it covers the bytes that passed
    while the toxic applied. The close happens as soon as the limit is reached (as in
    Toxiproxy, the whole connection closes, both ways); bytes beyond it are dropped. A
    limit lowered below what already passed closes on the next chunk.

    Compiled: on the native plane a chain of this one toxic runs on the plane's thread
    (``STAGE_LIMIT`` in faultnet/planes/_native.c), the count handed over with it
    (:meth:`stage_word`); the close is asked of trio (the plane's CLOSE event).
    """

    type = "limit_data"
    ATTRIBUTES = (Attribute("bytes", 0, "bytes forwarded before the connection closes"),)
    bytes: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: (kind, bytes, unused, unused)."""
        return ("limit_data", float(self.bytes), 0.0, 0.0)

    def stage_word(self, ctx: ToxicContext) -> int:
        """The bytes passed so far on *ctx*'s connection: the count the stage goes on with."""
        sent: int = ctx.state.get("sent", 0)
        return sent

    def set_stage_word(self, ctx: ToxicContext, word: int) -> None:
        ctx.state["sent"] = word

    # builtins.bytes: in this class, ``bytes`` is the attribute (Toxiproxy's name).
    async def on_chunk(self, ctx: ToxicContext, data: builtins.bytes, t_read: float) -> None:
        if ctx.state.get("closed"):
            return
        sent: int = ctx.state.get("sent", 0)
        remaining = self.bytes - sent
        if remaining > 0:
            piece = data[:remaining]
            await ctx.forward(piece, t_read)
            sent += len(piece)
            ctx.state["sent"] = sent
        if self.bytes - sent <= 0:
            ctx.state["closed"] = True
            await ctx.close()
