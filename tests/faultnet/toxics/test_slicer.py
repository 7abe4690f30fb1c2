"""The slicer toxic (faultnet.toxics.slicer) on trio's mock clock, and once on the real one."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.toxics import Slicer
from tests.faultnet.toxics.fake import FakeContext, SlowForward, starts


async def test_slicer_splits_exactly_with_delay(autojump_clock: Any) -> None:
    t = Slicer("s", average_size=10, size_variation=4, delay=1000)  # 1 ms between pieces
    ctx = FakeContext(seed=7)
    data = bytes(range(256)) * 4
    t0 = trio.current_time()
    await t.on_chunk(ctx, data[:500], t0)
    await t.on_chunk(ctx, data[500:], t0)
    assert ctx.data == data
    sizes = [len(d) for _, d, _ in ctx.out]
    assert all(6 <= s <= 14 for s in sizes[:-1]) and 1 <= sizes[-1] <= 14
    assert sizes.count(sizes[0]) < len(sizes)  # sizes do vary
    gaps = [b[0] - a[0] for a, b in zip(ctx.out, ctx.out[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.001)  # across the chunk boundary too


async def test_slicer_paces_by_a_schedule_so_send_costs_do_not_add_up(
    autojump_clock: Any,
) -> None:
    # Each forward costs 30 us; the pause is 100 us from one piece's due time to the
    # next's, so the pieces still leave 100 us apart (a sleep after each send: 130 us).
    ctx = SlowForward(cost=30e-6)
    t0 = trio.current_time()
    await Slicer("s", average_size=64, delay=100).on_chunk(ctx, b"p" * 640, t0)
    assert starts(ctx, t0) == [i * 100.0 for i in range(10)]


async def test_slicer_catches_up_a_small_lag_and_restarts_after_a_stall(
    autojump_clock: Any,
) -> None:
    # Piece 3's write takes 500 us: pieces 4-7, already due, go back to back, and the
    # schedule goes on from 800 us. Piece 12's takes 10 ms (a slow reader), beyond the
    # lag caught up: the schedule restarts from its end rather than a burst of 100.
    ctx = SlowForward(costs={3: 500e-6, 12: 10e-3})
    t0 = trio.current_time()
    await Slicer("s", average_size=1, delay=100).on_chunk(ctx, b"q" * 16, t0)
    assert starts(ctx, t0) == [
        *(0.0, 100.0, 200.0, 300.0),
        *(800.0, 800.0, 800.0, 800.0, 800.0),
        *(900.0, 1000.0, 1100.0, 1200.0),
        *(11200.0, 11300.0, 11400.0),
    ]


async def test_slicer_holds_a_100_us_delay_on_the_real_clock() -> None:
    # One loose real check (no mock clock): the median gap between 500 pieces. Measured
    # 76-98 us at a load of 11 on 2 cores; sleeping through trio's timer (whole
    # milliseconds) it was 1,250 us or more, whatever the load.
    ctx = FakeContext()
    await Slicer("s", average_size=64, delay=100).on_chunk(ctx, b"r" * 64 * 500, 0.0)
    gaps = sorted(b[0] - a[0] for a, b in zip(ctx.out, ctx.out[1:], strict=False))
    assert gaps[len(gaps) // 2] < 500e-6


async def test_slicer_zero_average_passes_whole() -> None:
    ctx = FakeContext()
    await Slicer("s").on_chunk(ctx, b"abc" * 100, 0.0)
    assert [d for _, d, _ in ctx.out] == [b"abc" * 100]
