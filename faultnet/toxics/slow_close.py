"""``slow_close``: the end of the stream (FIN) forwarded ``delay`` milliseconds late."""

from __future__ import annotations

import trio

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["SlowClose"]


@register
class SlowClose(AttributeToxic):
    """Hold this stream's FIN for ``delay`` ms, then forward it; data passes untouched.

    Half-close is kept: only this direction's FIN is delayed, the other direction goes on.
    The delay is measured from when the FIN reached the toxic; an update moves it.
    """

    type = "slow_close"
    ATTRIBUTES = (Attribute("delay", 0, "delay before the close is forwarded, in milliseconds"),)
    delay: int

    async def on_eof(self, ctx: ToxicContext) -> None:
        await self.wait_until(trio.current_time(), "delay", zero_is_never=False)
        await ctx.forward_eof()
