"""`faultnet proxy control-test`: all controls pass on their modes and go red on every
breakage; and the control test itself goes red when a real mode is broken."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import faultnet.controltest as ct
from faultnet.modes import MODES
from faultnet.proxy import Proxy
from tests.faultnet.udp.test_udp_controls import MODES as UDP_MODES

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")


def test_control_test_cli_passes_and_every_breakage_goes_red() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "faultnet", "proxy", "control-test", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    steps = report["steps"]
    modes = {s["mode"] for s in steps}
    tcp = {ct.NEGATIVE, *(m.name for m in MODES.values() if m.control)}
    assert {m for m in modes if not m.startswith("udp:")} == tcp
    assert {m for m in modes if m.startswith("udp:")} == {f"udp:{m}" for m in UDP_MODES}
    for mode in modes:
        arms = [s for s in steps if s["mode"] == mode]
        assert any(s["arm"].startswith("real") and s["outcome"] == "pass" for s in arms)
        breakages = [s for s in arms if s["arm"].startswith("breakage")]
        assert breakages and all(s["outcome"] == "red" for s in breakages), mode
    names = " ".join(s["arm"] for s in steps)
    for required in (
        "listener closed",
        "drop_syn as a no-op",
        "kernel backlog",
        "still forwards",
        "sever that resets",
        "reset that closes cleanly",
        "filter is never attached",
        "real (both_ways)",
        "the client's own segments dropped",
        "another peer partitioned",
        "every SYN dropped",
        "held datagrams dropped",
    ):
        assert required in names


async def test_control_test_fails_when_a_real_mode_is_broken(monkeypatch) -> None:
    # Break the proxy itself (drop_syn does nothing, sever resets): the control test must
    # report those real-mode steps as wrong. Patching is the breakage under test here.
    async def noop(self: Proxy) -> None:
        return None

    async def sever_resets(self: Proxy) -> int:
        return await self.reset()

    async def loss_never_attached(self: Proxy, percent: float, stream: str = "both", **_) -> int:
        return 0

    monkeypatch.setattr(Proxy, "drop_syn", noop)
    monkeypatch.setattr(Proxy, "loss", loss_never_attached)
    monkeypatch.setattr(Proxy, "sever", sever_resets)
    steps = await ct.run_control_test(timings=ct.Timings(blackhole_s=0.1))
    wrong = {(s.mode, s.arm) for s in steps if not s.ok}
    assert ("drop_syn", "real") in wrong
    assert ("sever", "real") in wrong
    assert ("loss", "real") in wrong
    assert ("freeze", "real") not in wrong
