"""The reset_peer toxic (faultnet.toxics.reset_peer) on trio's mock clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.toxics import ResetPeer
from tests.faultnet.toxics.fake import FakeContext


async def test_reset_peer_resets_after_timeout(autojump_clock: Any) -> None:
    t = ResetPeer("r", timeout=250)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"passes", t0)
    await t.run(ctx)
    assert ctx.data == b"passes"
    assert ctx.events == [("reset", pytest.approx(t0 + 0.25))]
    ctx0 = FakeContext()
    t.update({"timeout": 0})
    t1 = trio.current_time()
    await t.run(ctx0)
    assert ctx0.events == [("reset", t1)]
