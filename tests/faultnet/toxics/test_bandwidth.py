"""The bandwidth toxic (faultnet.toxics.bandwidth) on trio's mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.server.toxic_codec import toxic_from_json
from faultnet.toxics import Bandwidth
from tests.faultnet.toxics.fake import FakeContext


def test_bandwidth_rate_may_be_negative_meaning_unlimited() -> None:
    assert toxic_from_json({"type": "bandwidth", "attributes": {"rate": -1}}).rate == -1


async def test_bandwidth_paces_at_rate(autojump_clock: Any) -> None:
    t = Bandwidth("b", rate=10)  # 10 KB/s = 10,000 B/s
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"x" * 10_000, t0)
    assert ctx.data == b"x" * 10_000
    assert ctx.out[-1][0] - t0 == pytest.approx(1.0)
    assert max(len(d) for _, d, _ in ctx.out) == 1000  # 100 ms worth per piece
    # Idle time earns no burst credit: the next chunk is paced from its own read time.
    await trio.sleep(5)
    t1 = trio.current_time()
    await t.on_chunk(ctx, b"y" * 2000, t1)
    assert ctx.out[-1][0] - t1 == pytest.approx(0.2)


async def test_bandwidth_zero_or_negative_is_unlimited_and_live(autojump_clock: Any) -> None:
    t = Bandwidth("b", rate=0)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"z" * 100_000, t0)
    assert len(ctx.out) == 1 and ctx.out[0][0] == t0
    t.update({"rate": 100})  # 100 KB/s: 50 KB in 0.5 s
    await t.on_chunk(ctx, b"z" * 50_000, t0)
    assert ctx.out[-1][0] - t0 == pytest.approx(0.5)
