"""The limit_data toxic (faultnet.toxics.limit_data)."""

from __future__ import annotations

from faultnet.toxics import LimitData
from tests.faultnet.toxics.fake import FakeContext


async def test_limit_data_forwards_exactly_n_then_closes() -> None:
    t = LimitData("l", bytes=10)
    ctx = FakeContext()
    await t.on_chunk(ctx, b"0123", 0.0)
    assert ctx.events == []
    await t.on_chunk(ctx, b"456789ABCD", 0.0)
    assert ctx.data == b"0123456789"
    assert [e for e, _ in ctx.events] == ["close"]
    await t.on_chunk(ctx, b"more", 0.0)  # dropped, closed once
    assert ctx.data == b"0123456789" and len(ctx.events) == 1


async def test_limit_data_zero_closes_on_first_chunk() -> None:
    ctx = FakeContext()
    await LimitData("l", bytes=0).on_chunk(ctx, b"x", 0.0)
    assert ctx.data == b"" and [e for e, _ in ctx.events] == ["close"]
