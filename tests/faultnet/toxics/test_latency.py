"""The latency toxic (faultnet.toxics.latency) on trio's mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.toxics import Latency
from tests.faultnet.toxics.fake import FakeContext


async def test_latency_delays_from_read_time_and_pipelines(autojump_clock: Any) -> None:
    t = Latency("l", latency=100)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"a", t0)
    await t.on_chunk(ctx, b"b", t0 + 0.001)  # read 1 ms later: leaves 1 ms later
    assert [round(at - t0, 6) for at, _, _ in ctx.out] == [0.1, 0.101]
    assert ctx.data == b"ab"
    assert ctx.out[0][2] == pytest.approx(t0 + 0.1)  # due time passed on down the chain


async def test_latency_jitter_bounded_reproducible_never_reordered(autojump_clock: Any) -> None:
    async def offsets(seed: int) -> list[float]:
        t = Latency("l", latency=50, jitter=40)
        ctx = FakeContext(seed)
        t0 = trio.current_time()
        for i in range(50):
            await t.on_chunk(ctx, bytes([i]), t0 + i * 0.001)
        assert ctx.data == bytes(range(50))
        times = [at - t0 for at, _, _ in ctx.out]
        assert times == sorted(times)
        return [at - t0 - i * 0.001 for i, (at, _, _) in enumerate(ctx.out)]

    a, b, c = await offsets(1), await offsets(1), await offsets(2)
    assert a == pytest.approx(b) and a != pytest.approx(c)  # the seed decides every draw
    # Each delay is within latency +- jitter, or later only to keep the order.
    assert all(d >= 0.010 - 1e-9 for d in a)
    assert 0.010 - 1e-9 <= a[0] <= 0.090 + 1e-9
    assert sum(d <= 0.090 + 1e-9 for d in a) > 40
