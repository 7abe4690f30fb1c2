"""The UDP control test: every UDP control passes on its real mode and goes red on each
breakage; and it goes red itself when a real mode is broken."""

from __future__ import annotations

import pytest
import trio

from faultnet.controls import ControlFailed
from faultnet.udp.controls import assert_udp_delayed
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


async def test_the_delay_control_is_not_fooled_by_one_late_echo() -> None:
    """A loaded machine can make one echo late with no delay in force (the suite at load
    ~10 saw this breakage pass). A delay is a floor: one echo under it is proof that no
    delay is in force, so the control probes more than once and goes red on any fast
    echo. The stand-in for the load spike: an echo server whose first answer is late."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))

    async def echo_first_late() -> None:
        first = True
        while True:
            data, peer = await sock.recvfrom(2048)
            if first:
                first = False
                await trio.sleep(0.15)  # the spike: the server itself is late, once
            await sock.sendto(data, peer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo_first_late)
        with pytest.raises(ControlFailed, match="no delay in force"):
            await assert_udp_delayed(sock.getsockname(), 100.0)
        nursery.cancel_scope.cancel()
    sock.close()
