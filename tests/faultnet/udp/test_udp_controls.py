"""The UDP control test: every UDP control passes on its real mode and goes red on each
breakage; and it goes red itself when a real mode is broken."""

from __future__ import annotations

import pytest

from faultnet.udp.controltest import run_udp_control_test
from faultnet.udp.modes import UDP_MODES
from faultnet.udp.proxy import UdpProxy

#: The negative control, and every UDP mode with a control (the table's).
MODES = {"pass", *(m.name for m in UDP_MODES.values() if m.control)}


async def test_every_udp_control_passes_on_its_mode_and_goes_red_on_every_breakage() -> None:
    steps = await run_udp_control_test()
    bad = [f"{s.mode} / {s.arm}: {s.outcome} ({s.detail})" for s in steps if not s.ok]
    assert not bad, bad
    assert {s.mode for s in steps} == {f"udp:{m}" for m in MODES}
    for mode in MODES:
        arms = [s for s in steps if s.mode == f"udp:{mode}"]
        assert any(s.arm.startswith("real") and s.outcome == "pass" for s in arms), mode
        assert any(s.arm.startswith("breakage") and s.outcome == "red" for s in arms), mode
    # Either side of every switch the proxy answered: each step starts and ends healthy.
    assert all(s.after == "answered" for s in steps)


async def test_the_control_test_goes_red_when_freeze_drops_instead_of_holding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(UdpProxy, "freeze", UdpProxy.blackhole)
    steps = await run_udp_control_test()
    wrong = [(s.mode, s.arm) for s in steps if not s.ok]
    assert wrong == [("udp:freeze", "real")]
