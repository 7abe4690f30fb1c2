"""``reset_peer``: the connection reset (RST both ways) ``timeout`` milliseconds after the
toxic starts to apply."""

from __future__ import annotations

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["ResetPeer"]


@register
class ResetPeer(AttributeToxic):
    """Reset the connection (SO_LINGER 0, so both peers see ECONNRESET) after a time.

    Better than Toxiproxy's, whose timer starts at the first chunk and which only reaches
    connections opened while it exists: here the timer runs from when the toxic began to
    apply to the connection, so connections already open (and idle ones) are reset too,
    ``timeout`` ms after the toxic was added. ``timeout`` 0 resets at once. Data passes
    untouched until the reset. An update moves the deadline.

    Compiled: on the native plane a chain of this one toxic leaves the bytes on the
    plane's plain path; the timer stays this toxic's task (:meth:`run`).
    """

    type = "reset_peer"
    ATTRIBUTES = (Attribute("timeout", 0, "time before the connection is reset, in milliseconds"),)
    timeout: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: bytes pass (the reset is :meth:`run`)."""
        return ("reset_peer", 0.0, 0.0, 0.0)

    async def run(self, ctx: ToxicContext) -> None:
        await self.wait_until(self.applied_at(ctx), "timeout", zero_is_never=False)
        await ctx.reset()
