"""The UDP control test: every UDP control passes on its real mode and goes red on each
breakage; and it goes red itself when a real mode is broken."""

from __future__ import annotations

import time

import pytest
import trio

from faultnet.controls import ControlFailed
from faultnet.testing import udp_echo_server
from faultnet.udp.controls import assert_udp_delayed, assert_udp_silent
from faultnet.udp.controltest import run_udp_control_test
from faultnet.udp.modes import UDP_MODES
from faultnet.udp.proxy import UdpProxy, open_udp_proxy

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


async def test_the_silence_control_sees_a_delayed_reply_across_a_stall() -> None:
    """The breakage that passed once in a loaded suite run: datagrams only delayed
    (20 ms), yet no reply inside the 300 ms window. The proxy runs in this process, and
    a machine that stalls the whole process past the window let the window's deadline
    expire in the same pass as the proxy's delay, before the reply could be sent. The
    stand-in for the stall: a task that blocks the loop for 400 ms (the window must
    count the time this process ran, not the time it was stalled)."""

    async def stall() -> None:
        await trio.sleep(0.005)  # the datagram is out, its delay under way
        time.sleep(0.4)  # noqa: ASYNC251 - the stall itself: nothing in the loop runs

    async with (
        udp_echo_server() as (upstream, _),
        open_udp_proxy(upstream, seed=1) as proxy,
    ):
        await proxy.latency(20)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stall)
            with pytest.raises(ControlFailed, match="datagrams still cross"):
                await assert_udp_silent(proxy.address)
