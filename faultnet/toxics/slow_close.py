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

    Compiled: on the native plane a chain of this one toxic runs on the plane's thread
    (``STAGE_SLOW_CLOSE``: the FIN due ``delay`` after it came to the head of the queue).
    """

    type = "slow_close"
    ATTRIBUTES = (Attribute("delay", 0, "delay before the close is forwarded, in milliseconds"),)
    delay: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: (kind, delay ms, unused, unused)."""
        return ("slow_close", float(self.delay), 0.0, 0.0)

    async def on_eof(self, ctx: ToxicContext) -> None:
        await self.wait_until(trio.current_time(), "delay", zero_is_never=False)
        await ctx.forward_eof()
