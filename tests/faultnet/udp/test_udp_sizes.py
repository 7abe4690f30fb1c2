"""The largest datagrams: what IPv6 carries (65,527 bytes of payload, 20 more than IPv4)
crosses whole, and a datagram the proxy cannot carry whole is never cut or lost
silently: it is counted and logged."""

from __future__ import annotations

import socket

import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.testing import udp_echo_server, wait_for_record, wait_until
from faultnet.udp import open_udp_proxy

#: 65,535 (the IPv6 payload length field) - 8 bytes of UDP header.
IPV6_MAX = 65527


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1)")


async def _send(address: tuple[str, int], payload: bytes, family: int) -> trio.socket.SocketType:
    sock = trio.socket.socket(family, socket.SOCK_DGRAM)
    await sock.connect(address)
    await sock.send(payload)
    return sock


@needs_ipv6
async def test_the_largest_ipv6_datagram_crosses_whole_both_ways() -> None:
    payload = bytes(range(256)) * (IPV6_MAX // 256) + b"z" * (IPV6_MAX % 256)
    async with (
        udp_echo_server("::1") as (up, _),
        open_udp_proxy(up, listen=("::1", 0)) as proxy,
    ):
        with await _send(proxy.address, payload, socket.AF_INET6) as sock, trio.fail_after(5):
            echo = await sock.recv(65536)
        assert len(echo) == IPV6_MAX and echo == payload
        counts = proxy.sessions()[0].counts
        assert counts["upstream"]["sent"] == counts["downstream"]["sent"] == 1


@needs_ipv6
async def test_a_datagram_too_long_for_the_upstreams_family_is_counted_and_logged(
    tmp_path,
) -> None:
    # IPv6 in, IPv4 out: 65,527 bytes do not fit in an IPv4 datagram (EMSGSIZE).
    log = tmp_path / "udp.jsonl"
    async with (
        udp_echo_server() as (up, echoed),
        open_udp_proxy(up, listen=("::1", 0), event_log=str(log)) as proxy,
    ):
        with await _send(proxy.address, b"x" * IPV6_MAX, socket.AF_INET6):
            record = await wait_for_record(log, event="send_failed", session=1)
            assert record["stream"] == "upstream" and record["bytes"] == IPV6_MAX
            assert record["error"] == "Message too long"
            counts = proxy.sessions()[0].counts["upstream"]
            assert counts["send_errors"] == 1 and counts["sent"] == 0 and echoed[0] == 0


async def test_a_datagram_longer_than_the_receive_buffer_is_counted_and_logged(
    tmp_path, monkeypatch
) -> None:
    # No real datagram exceeds the buffer (65,536 bytes); a smaller one shows the check.
    monkeypatch.setattr("faultnet.udp.proxy.RECV_BUFFER", 1000)
    log = tmp_path / "udp.jsonl"
    async with (
        udp_echo_server() as (up, _),
        open_udp_proxy(up, event_log=str(log)) as proxy,
    ):
        with await _send(proxy.address, b"y" * 1500, socket.AF_INET) as sock:
            await sock.send(b"z" * 1200)
            await wait_until(lambda: proxy.sessions()[0].counts["upstream"]["received"] == 2)
            assert proxy.sessions()[0].counts["upstream"]["cut_on_receive"] == 2
    records = [r for r in read_jsonl(log).records if r["event"] == "datagram_cut"]
    # Logged once per session and direction; the session's close record counts them all.
    assert [(r["stream"], r["bytes"], r["kept"]) for r in records] == [("upstream", 1500, 1000)]
    close = next(r for r in read_jsonl(log).records if r["event"] == "session_close")
    assert close["counts"]["upstream"]["cut_on_receive"] == 2
