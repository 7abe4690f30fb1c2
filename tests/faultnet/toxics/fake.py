"""A fake ToxicContext for the toxics' unit tests, on trio's mock clock.

The autojump clock makes every timing exact: a toxic that sleeps 100 ms is seen to
forward at exactly t + 0.1. The same toxics are measured through the real proxy on real
sockets in test_toxics_e2e.py.
"""

from __future__ import annotations

import random
from typing import Any

import trio


class FakeContext:
    """Records what a toxic passes on, with the (mock) time it did so."""

    def __init__(self, seed: int = 0, stream: str = "downstream") -> None:
        self.conn_id = 1
        self.stream = stream
        self.rng = random.Random(seed)
        self.state: dict[str, Any] = {}
        self.out: list[tuple[float, bytes, float]] = []
        self.events: list[tuple[str, float]] = []

    async def forward(self, data: bytes, t_read: float) -> None:
        self.out.append((trio.current_time(), data, t_read))

    async def forward_eof(self) -> None:
        self.events.append(("eof", trio.current_time()))

    async def close(self) -> None:
        self.events.append(("close", trio.current_time()))

    async def reset(self) -> None:
        self.events.append(("reset", trio.current_time()))

    @property
    def data(self) -> bytes:
        return b"".join(d for _, d, _ in self.out)


async def update_while_waiting(
    toxic: Any, hook: Any, ctx: FakeContext, wait_s: float, **attributes: int
) -> float:
    """Run ``hook(ctx)``; after *wait_s* (mock time) with nothing seen, update *toxic*
    with *attributes*; return the start time once the hook has returned."""
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hook, ctx)
        await trio.sleep(wait_s)
        assert ctx.events == []
        toxic.update(attributes)
    return t0


class SlowForward(FakeContext):
    """A context whose forward takes time, as a real write and wake-up do: *cost* per
    piece, or *costs[i]* for piece i."""

    def __init__(self, cost: float = 0.0, costs: dict[int, float] | None = None) -> None:
        super().__init__()
        self.cost, self.costs = cost, costs or {}

    async def forward(self, data: bytes, t_read: float) -> None:
        await super().forward(data, t_read)
        await trio.sleep(self.costs.get(len(self.out) - 1, self.cost))


def starts(ctx: FakeContext, t0: float) -> list[float]:
    """When each piece was passed on, in microseconds from *t0*."""
    return [round((t - t0) * 1e6, 3) for t, _, _ in ctx.out]
