"""Each control passes on the state it guards and raises, loudly and specifically, on the
states it must not mistake for it."""

from __future__ import annotations

import socket

import pytest
import trio

from faultnet import controls
from faultnet.addresses import format_address, parse_address
from faultnet.controls import ControlFailed
from faultnet.probe import ProbeKind, probe
from faultnet.proxy import open_proxy
from faultnet.sockopts import attach_drop_all
from faultnet.testing import accept_server, echo_server, open_link, read_exactly

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")


def _closed_port() -> tuple[str, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = s.getsockname()
    s.close()
    return addr


async def test_probe_classifies_connected_refused_hung() -> None:
    async with echo_server() as up:
        assert (await probe(up, 1)).kind is ProbeKind.CONNECTED
    assert (await probe(_closed_port(), 1)).kind is ProbeKind.REFUSED
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    attach_drop_all(listener)
    try:
        result = await probe(listener.getsockname(), 0.3)
        assert result.kind is ProbeKind.HUNG and result.elapsed_s >= 0.3
        # The timed-out socket was closed: nothing completes the handshake later.
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


async def test_syn_dropped_control_is_loud_about_a_merely_refused_port() -> None:
    with pytest.raises(ControlFailed, match="REFUSES: the listener is closed") as info:
        await controls.assert_syn_dropped(_closed_port(), timeout=0.5)
    assert info.value.expected == "hung" and info.value.seen == "refused"
    assert "ms" in str(info.value)


async def test_syn_dropped_control_goes_red_on_a_paused_accept_loop() -> None:
    # A listener nobody accepts on, normal backlog: the kernel completes the handshake.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    try:
        with pytest.raises(ControlFailed, match="handshake completed"):
            await controls.assert_syn_dropped(listener.getsockname(), timeout=0.5)
    finally:
        listener.close()


async def test_accepting_and_refusing_controls_go_red_on_each_other() -> None:
    async with echo_server() as up:
        await controls.assert_accepting(up)
        with pytest.raises(ControlFailed, match="still listening"):
            await controls.assert_refusing(up)
    with pytest.raises(ControlFailed, match="expected connected, saw refused"):
        await controls.assert_accepting(_closed_port())


async def test_stream_controls_on_a_healthy_link_go_red() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        s = await trio.open_tcp_stream(*proxy.address)
        with pytest.raises(ControlFailed, match="still forwards"):
            await controls.assert_frozen(s, s, window=0.5)
        with pytest.raises(ControlFailed, match="saw nothing"):
            await controls.assert_severed(s, timeout=0.2)
        with pytest.raises(ControlFailed, match="saw nothing"):
            await controls.assert_reset(s, timeout=0.2)


async def test_sever_and_reset_controls_tell_fin_from_rst() -> None:
    async with accept_server() as (addr, accepted), open_proxy(addr) as proxy:
        a = await trio.open_tcp_stream(*proxy.address)
        await accepted.receive()
        await proxy.reset()
        with pytest.raises(ControlFailed, match="a reset is not a sever"):
            await controls.assert_severed(a)
        b = await trio.open_tcp_stream(*proxy.address)
        await accepted.receive()
        await proxy.sever()
        with pytest.raises(ControlFailed, match="a clean close is not a reset"):
            await controls.assert_reset(b)


async def test_frozen_control_goes_red_when_a_close_gets_through() -> None:
    async with open_link() as (proxy, s, server):
        await server.send_all(b"x")
        await read_exactly(s, 1)
        await server.aclose()
        with pytest.raises(ControlFailed, match="a close got through"):
            await controls.assert_frozen(s, s, window=1)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_address("[::1]:8474") == ("::1", 8474)
    assert parse_address(":80", default_host="127.0.0.1") == ("127.0.0.1", 80)
    assert format_address(("::1", 8474)) == "[::1]:8474"
    assert format_address(("127.0.0.1", 80)) == "127.0.0.1:80"
    for bad, why in (
        ("nope", "not HOST:PORT"),
        ("h:x", "not a number"),
        ("h:99999", "range"),
        ("::1:80", "brackets"),
        (":80", "not HOST:PORT"),
        ("a b:80", "invalid host"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_address(bad)
    with pytest.raises(ValueError, match="range"):
        parse_address("h:0", port_zero=False)
