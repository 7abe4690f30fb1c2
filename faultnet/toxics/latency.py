"""``latency``: each chunk delayed by ``latency`` ± ``jitter`` milliseconds, one way."""

from __future__ import annotations

import trio

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.clock import sleep_until_precisely
from faultnet.toxics.draws import draws_of
from faultnet.toxics.registry import register

__all__ = ["Latency"]


@register
class Latency(AttributeToxic):
    """Delay every chunk of the stream; bytes are kept exact and never reordered.

    The delay is measured from when the proxy read the chunk (``t_read``), so a stream of
    chunks is pipelined: chunks read 1 ms apart leave about 1 ms apart. With jitter, each
    chunk's delay is drawn uniformly from ``[latency - jitter, latency + jitter]`` (never
    below 0) from the stage's seeded :class:`~faultnet.toxics.draws.Draws`; a chunk that
    would be due before the one ahead of it leaves right after it instead (one writer, so
    order is kept).

    Compiled: on the native plane a chain of this one toxic runs as a stage on the
    plane's thread (:meth:`compiled`), the same delays from the same draws; this method
    is the reference and the other planes' path.
    """

    type = "latency"
    ATTRIBUTES = (
        Attribute("latency", 0, "delay added to each chunk, in milliseconds"),
        Attribute("jitter", 0, "random variation of the delay, ± milliseconds"),
    )
    latency: int
    jitter: int

    def compiled(self) -> tuple[str, float, float, float]:
        """This toxic as a plane's compiled stage: (kind, latency ms, jitter ms, unused)."""
        return ("latency", float(self.latency), float(self.jitter), 0.0)

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        delay_ms = float(self.latency)
        if self.jitter > 0:
            delay_ms += draws_of(ctx.state, ctx.rng).uniform(-self.jitter, self.jitter)
        due = t_read + max(delay_ms, 0.0) / 1000
        if due > trio.current_time():
            await sleep_until_precisely(due)  # trio's own timer: up to +1 ms
        # else due already (latency 0, or read long ago): on at once, no scheduling round
        # of its own; the toxic link's write still yields to the loop (it checkpoints).
        # Pass the due time on, so a later latency toxic in the chain adds to this one.
        await ctx.forward(data, due)
