"""The timeout toxic (faultnet.toxics.timeout) on trio's mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.toxics import Timeout
from tests.faultnet.toxics.fake import FakeContext, update_while_waiting


async def test_timeout_drops_holds_fin_and_closes_after_time(autojump_clock: Any) -> None:
    t = Timeout("t", timeout=500)
    ctx = FakeContext()
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.run, ctx)
        for _ in range(10):  # chunks do not re-arm the timer
            await trio.sleep(0.04)
            await t.on_chunk(ctx, b"lost", trio.current_time())
        await t.on_eof(ctx)
    assert ctx.out == []
    assert ctx.events == [("close", pytest.approx(t0 + 0.5))]  # the FIN was held
    assert ctx.state["dropped"] == 40 and ctx.state["eof_held"]


async def test_timeout_zero_never_closes_until_updated(autojump_clock: Any) -> None:
    t = Timeout("t", timeout=0)
    ctx = FakeContext()
    # The new deadline is measured from when the toxic began: long past.
    t0 = await update_while_waiting(t, t.run, ctx, 100, timeout=50)
    assert ctx.events == [("close", pytest.approx(t0 + 100))]
