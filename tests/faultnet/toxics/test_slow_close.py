"""The slow_close toxic (faultnet.toxics.slow_close) on trio's mock clock."""

from __future__ import annotations

from typing import Any

import pytest

from faultnet.toxics import SlowClose
from tests.faultnet.toxics.fake import FakeContext, update_while_waiting


async def test_slow_close_delays_fin_and_update_moves_it(autojump_clock: Any) -> None:
    t = SlowClose("s", delay=1000)
    ctx = FakeContext()
    t0 = await update_while_waiting(t, t.on_eof, ctx, 0.2, delay=300)  # due at t0 + 0.3
    assert ctx.events == [("eof", pytest.approx(t0 + 0.3))]
    ctx2 = FakeContext()
    await t.on_chunk(ctx2, b"data", 0.0)
    assert ctx2.data == b"data"  # data untouched
