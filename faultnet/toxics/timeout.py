"""``timeout``: the stream becomes a black hole; the connection closes after ``timeout``
milliseconds (0 = never)."""

from __future__ import annotations

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.registry import register

__all__ = ["Timeout"]


@register
class Timeout(AttributeToxic):
    """Drop every byte of the stream and hold its FIN; close the connection after a time.

    Better than Toxiproxy's: the FIN is held too (a true black hole, nothing at all comes
    out), and the timer does not re-arm on each chunk: it runs from when the toxic began
    to apply to the connection (its creation, or the toxic's addition for a connection
    already open). ``timeout`` 0 never closes. An update moves the deadline. When it
    fires, the whole connection is closed with a clean FIN both ways, as Toxiproxy does.

    Compiled: on the native plane a chain of this one toxic drops and holds on the
    plane's thread (``STAGE_DROP``); the timer stays this toxic's task (:meth:`run`).
    """

    type = "timeout"
    ATTRIBUTES = (
        Attribute("timeout", 0, "time before the connection is closed, in milliseconds; 0 = never"),
    )
    timeout: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: the drop (its timer is :meth:`run`)."""
        return ("timeout", 0.0, 0.0, 0.0)

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        ctx.state["dropped"] = ctx.state.get("dropped", 0) + len(data)

    async def on_eof(self, ctx: ToxicContext) -> None:
        ctx.state["eof_held"] = True

    async def run(self, ctx: ToxicContext) -> None:
        await self.wait_until(self.applied_at(ctx), "timeout", zero_is_never=True)
        await ctx.close()
