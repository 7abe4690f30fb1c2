"""Loss of both directions (``loss(both_ways=True)``), on the connection's internal hop,
over real loopback sockets: the segments the proxy sends toward a peer are lost too
(where one-way loss of the same share loses none of them), bytes arrive intact, thaw
takes the loss off and the hop stays; half-close, a server's reset, freeze and sever
still act through it; new connections get it with include_new."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from faultnet import bpf
from faultnet.controls import LOSS_MARGIN
from faultnet.eventlog import read_jsonl
from faultnet.modes import ModeArgumentError, request
from faultnet.proxy import Proxy, _hop, open_proxy
from faultnet.proxy._connection import Connection
from faultnet.proxy._faultstate import client_leg_loss
from faultnet.proxy._hop import HopLink
from faultnet.sockopts import (
    attach_drop_all,
    filter_length,
    set_keepalive,
    set_linger_reset,
    set_user_timeout,
    socket_drops,
    tcp_retransmits_needed,
    tcp_unacked,
)
from faultnet.testing import echo_back, echo_server, read_exactly, start_server, wait_until
from faultnet.toxics import Latency

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

#: 8 MiB is 128 loopback segments: at 10 % the chance that not one is dropped is 1e-6.
DOWNLOAD = os.urandom(8 << 20)
#: The client-facing socket's filter under two-way loss of 10 % (the probes' share).
CLIENT_LEG = bpf.drop_bare_fraction(client_leg_loss(0.10))
#: A lossy route has tails (the kernel's own: 27.6 s for 16 MB at 20 %, issue 21), and
#: this bounds them, not the typical transfer (about a second).
LOSSY_BOUND_S = 120


async def _serve(stream: trio.SocketStream) -> None:
    """``GET`` -> the download, then until EOF; ``RST`` -> an abort (SO_LINGER 0);
    anything else is echoed, and a FIN answered with a FIN."""
    try:
        first = await stream.receive_some(65536)
        if first == b"GET":
            await stream.send_all(DOWNLOAD)
        elif first == b"RST":
            set_linger_reset(stream.socket)
            await stream.aclose()
            return
        else:
            while first:
                await stream.send_all(first)
                first = await stream.receive_some(65536)
            await stream.send_eof()
            return
        while await stream.receive_some(65536):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


@asynccontextmanager
async def served() -> AsyncIterator[tuple[str, int]]:
    async with trio.open_nursery() as nursery:
        yield await start_server(nursery, _serve)
        nursery.cancel_scope.cancel()


def only_connection(proxy: Proxy) -> Connection:
    (conn,) = proxy._connections.values()
    return conn


async def download(stream: trio.SocketStream) -> bytes:
    await stream.send_all(b"GET")
    with trio.fail_after(LOSSY_BOUND_S):
        return await read_exactly(stream, len(DOWNLOAD))


def lost_toward_client(conn: Connection) -> dict[str, int]:
    """What says the proxy's own segments toward the client were lost: the needed
    retransmits of the socket that sent the download on its way to the client (the
    hop's server end B, or with no hop the client-facing socket), and the segments
    dropped into the hop's client end A (the download's data)."""
    if conn.hop is None:
        return {"needed": tcp_retransmits_needed(conn.client), "dropped_at_a": 0}
    return {
        "needed": tcp_retransmits_needed(conn.hop.b),
        "dropped_at_a": socket_drops(conn.hop.a),
        "dropped_at_b": socket_drops(conn.hop.b),
    }


def assert_lost_toward_client(seen: dict[str, int]) -> None:
    """The detector: segments the proxy sent toward the client were lost on the way
    (its data and so its retransmits, above a loss-free transfer's margin)."""
    assert seen["needed"] > LOSS_MARGIN and seen["dropped_at_a"] > 0, seen


async def test_two_way_loss_loses_what_the_proxy_sends_toward_the_client() -> None:
    async with served() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        assert await proxy.loss(10, both_ways=True) == 1
        got = await download(stream)
        assert hashlib.sha256(got).digest() == hashlib.sha256(DOWNLOAD).digest()
        conn = only_connection(proxy)
        seen = lost_toward_client(conn)
        assert_lost_toward_client(seen)
        # ...and the ACKs the client's side sends back are lost too (dropped into B).
        assert seen["dropped_at_b"] > 0, seen
        # The client-facing socket loses only the client's bare segments (its ACKs
        # here), never its data, and the proxy has nothing toward the client to resend.
        assert tcp_retransmits_needed(conn.client) <= LOSS_MARGIN
        assert filter_length(conn.client) == len(CLIENT_LEG.instructions)
        (info,) = proxy.connections()
        assert info.on_hop and info.loss_both_ways == ["downstream", "upstream"]
        assert info.hop_dropped >= seen["dropped_at_a"] + seen["dropped_at_b"] > 0
        assert info.hop_retransmits > 0
        assert info.dropped_upstream > 0 and info.dropped_downstream == 0
        await stream.aclose()


async def test_one_way_loss_of_the_same_share_loses_nothing_the_proxy_sends() -> None:
    # The contrast the detector is held against: one-way loss on both streams drops the
    # client's ACKs, never the proxy's data, so nothing it sent needed resending.
    async with served() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(10)
        await download(stream)
        conn = only_connection(proxy)
        assert conn.hop is None
        seen = lost_toward_client(conn)
        with pytest.raises(AssertionError):
            assert_lost_toward_client(seen)
        await stream.aclose()


def _attach_except(monkeypatch: pytest.MonkeyPatch, skipped: Callable[[Any], bool]) -> None:
    """Break the loss on purpose: the loss filters go on every socket but those
    *skipped* names."""
    attach = _hop.bpf.attach

    def attach_others(sock: Any, program: Any) -> None:
        if not skipped(sock):
            attach(sock, program)

    monkeypatch.setattr(_hop.bpf, "attach", attach_others)


async def test_the_detector_goes_red_when_the_hop_loses_one_way_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Broken on purpose: the filter on the hop's server end only, so what travels
    # toward the client (arriving at A) is never lost.
    def hop_a(sock: Any) -> bool:  # the client-facing socket and B keep theirs
        hop = only_connection(proxy).hop
        return hop is not None and sock is hop.a

    _attach_except(monkeypatch, hop_a)
    async with served() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(10, both_ways=True)
        await download(stream)
        seen = lost_toward_client(only_connection(proxy))
        with pytest.raises(AssertionError):
            assert_lost_toward_client(seen)
        await stream.aclose()


async def _keepalive_client(proxy: Proxy) -> trio.SocketStream:
    """A client with keepalive 1/1/1 and TCP_USER_TIMEOUT 1 s, after one round trip: on
    a route that answers none of its probes its kernel gives up about 2 s later."""
    stream = await trio.open_tcp_stream(*proxy.address)
    set_keepalive(stream.socket, 1, 1, 1)
    set_user_timeout(stream.socket, 1000)
    await stream.send_all(b"ping")
    assert await read_exactly(stream, 4) == b"ping"
    return stream


async def _gives_up(stream: trio.SocketStream, within: float) -> bool:
    """Whether the client's kernel gives up on its connection (ETIMEDOUT) within
    *within* seconds, the client parked in receive."""
    with trio.move_on_after(within):
        try:
            while await stream.receive_some(100):
                pass
        except trio.BrokenResourceError as exc:
            return getattr(exc.__cause__, "errno", None) == errno.ETIMEDOUT
        return False  # EOF
    return False


# Measured (10 runs, load 10): the client gave up 2.03-2.06 s after the loss (kernel
# timers: idle 1 s, one probe, then the user timeout), so 10 s is about 5x.
GIVE_UP_BOUND_S = 10.0


async def test_under_two_way_loss_a_client_s_keepalive_gives_up_as_on_a_lossy_route() -> None:
    # All lost both ways: a route that answers none of the client's probes. Through the
    # hop alone the proxy's kernel answered every one and the client never gave up.
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await _keepalive_client(proxy)
        await proxy.loss(100, both_ways=True)
        assert await _gives_up(stream, GIVE_UP_BOUND_S)
        await stream.aclose()


async def test_the_client_leg_s_detector_goes_red_without_the_client_leg_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Broken on purpose: the client-facing socket gets no filter (the loss on the hop
    # only, as before): the proxy's kernel answers the probes and the client lives on.
    _attach_except(monkeypatch, lambda sock: sock is only_connection(proxy).client)
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await _keepalive_client(proxy)
        await proxy.loss(100, both_ways=True)
        assert not await _gives_up(stream, GIVE_UP_BOUND_S / 2)  # 2.5x the usual time
        await stream.aclose()


async def test_the_client_leg_loses_no_data_of_the_client_s() -> None:
    # Only bare segments are lost on the client's leg: its data is acknowledged by the
    # proxy's kernel even when the hop loses everything (the hop loses the data, once).
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(100, both_ways=True)
        await stream.send_all(b"x" * 100_000)
        await wait_until(lambda: tcp_unacked(stream.socket) == 0, 5.0, what="the data acked")
        assert only_connection(proxy).hop is not None
        await stream.aclose()


async def test_bytes_cross_intact_both_ways_under_20_percent_and_thaw_keeps_the_hop(
    tmp_path: Any,
) -> None:
    log = tmp_path / "events.jsonl"
    # 1 MiB each way (32 segments and their ACKs on the hop: none dropped at 20 % but
    # once in a million). 3 MiB echoed both ways once took over 120 s (1 of 10 suites),
    # not diagnosed; the likely way: while the echo's other direction waits out a
    # timeout this one's window closes, and zero-window probes back off toward TCP's
    # 120 s as they would on a real route.
    data = os.urandom(1 << 20)
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        assert await proxy.loss(20, both_ways=True) == 1
        with trio.fail_after(LOSSY_BOUND_S):
            got = await echo_back(stream, data)
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        conn = only_connection(proxy)
        assert conn.hop is not None and conn.hop.program is not None
        assert await proxy.thaw() == 1
        (info,) = proxy.connections()
        assert info.on_hop and info.loss is None and info.loss_both_ways is None
        assert conn.hop.program is None  # the hop stays, its filters off
        ends = (conn.hop.a, conn.hop.b)
        assert [filter_length(end) for end in ends] == [0, 0]
        # sk_drops also counts what TCP itself discards: a retransmission of data the
        # other end already has (its ACK lost before the thaw) is dropped as old data
        # (one suite run in ten: 19 against 18). So the count is taken once neither end
        # has anything unacknowledged, when no such retransmission is still to come.
        await wait_until(
            lambda: not any(tcp_unacked(end) for end in ends),
            timeout=LOSSY_BOUND_S,
            what="the hop's ends acknowledged everything",
        )
        dropped = sum(socket_drops(end) for end in ends)
        await stream.send_all(data[: 1 << 20])
        with trio.fail_after(10):
            assert await read_exactly(stream, 1 << 20) == data[: 1 << 20]
        assert sum(socket_drops(end) for end in ends) == dropped
        await stream.aclose()
        await wait_until(lambda: not proxy.connections(), what="the connection ended")
    records = read_jsonl(log).records
    (applied,) = [r for r in records if r["event"] == "fault_applied"]
    assert applied["mode"] == "loss" and applied["both_ways"] is True
    assert [r["conn"] for r in records if r["event"] == "hop_opened"] == [conn.id]
    (closed,) = [r for r in records if r["event"] == "conn_close"]
    assert closed["hop_dropped"] > 0 and closed["hop_retransmits"] >= 0


async def test_half_close_crosses_the_hop_each_way_on_its_own() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(5, both_ways=True)
        await stream.send_all(b"last words")
        await stream.send_eof()  # the client's FIN: the echo still answers, then FINs
        with trio.fail_after(LOSSY_BOUND_S):
            assert await read_exactly(stream, 10) == b"last words"
            assert await stream.receive_some(10) == b""
        await stream.aclose()


async def test_a_reset_from_the_server_reaches_the_client_as_a_reset() -> None:
    async with served() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(5, both_ways=True)
        assert only_connection(proxy).hop is not None
        await stream.send_all(b"RST")
        with trio.fail_after(LOSSY_BOUND_S), pytest.raises(trio.BrokenResourceError) as err:
            while await stream.receive_some(100):
                pass
        assert isinstance(err.value.__cause__, ConnectionResetError)


async def test_freeze_holds_bytes_on_the_hop_and_thaw_delivers_them_in_order() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(5, both_ways=True)
        await stream.send_all(b"before")
        with trio.fail_after(LOSSY_BOUND_S):
            assert await read_exactly(stream, 6) == b"before"
        await proxy.freeze()
        conn = only_connection(proxy)
        crossed = conn.counts()
        await stream.send_all(b"held")
        with trio.move_on_after(0.5):  # a bound on a negative: nothing may arrive
            assert await stream.receive_some(10) == b"", "a frozen link forwarded"
        conn.proxy._plane.settle()  # type: ignore[attr-defined]
        assert conn.counts() == crossed
        await proxy.thaw()
        with trio.fail_after(10):
            assert await read_exactly(stream, 4) == b"held"
        await stream.aclose()


async def test_sever_ends_a_connection_on_the_hop_with_eof_and_closes_the_hop() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(5, both_ways=True)
        hop = only_connection(proxy).hop
        assert hop is not None
        assert await proxy.sever() == 1
        with trio.fail_after(5):
            assert await stream.receive_some(10) == b""
        assert hop.closed and hop.a.fileno() == hop.b.fileno() == -1
        await stream.aclose()


async def test_include_new_puts_later_connections_on_the_hop_until_thaw() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        assert await proxy.loss(20, both_ways=True, include_new=True) == 0
        assert proxy.state["loss_new"] == {"upstream": 20.0, "downstream": 20.0}
        assert proxy.state["loss_new_both_ways"] == ["downstream", "upstream"]
        stream = await trio.open_tcp_stream(*proxy.address)
        await stream.send_all(b"ping")
        with trio.fail_after(LOSSY_BOUND_S):
            assert await read_exactly(stream, 4) == b"ping"
        (info,) = proxy.connections()
        assert info.on_hop and info.loss_both_ways == ["downstream", "upstream"]
        await proxy.thaw()
        assert proxy.state["loss_new"] is None
        later = await trio.open_tcp_stream(*proxy.address)
        await later.send_all(b"pong")
        with trio.fail_after(10):
            assert await read_exactly(later, 4) == b"pong"
        assert [c.on_hop for c in sorted(proxy.connections(), key=lambda c: c.id)] == [
            True,
            False,
        ]
        await stream.aclose()
        await later.aclose()


def test_both_ways_is_checked_once_by_the_mode_table() -> None:
    assert request("loss", percent=20, both_ways=True).both_ways
    with pytest.raises(ModeArgumentError, match="stream must be both"):
        request("loss", percent=20, stream="upstream", both_ways=True)
    with pytest.raises(ModeArgumentError, match="both_ways applies to loss only"):
        request("freeze", both_ways=True)
    with pytest.raises(ModeArgumentError, match="both_ways must be true or false"):
        request("loss", both_ways="yes")


async def test_a_hop_that_cannot_be_made_resets_that_connection_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await stream.send_all(b"x")
        with trio.fail_after(5):
            await read_exactly(stream, 1)

        def no_descriptors() -> Any:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(_hop, "_pair", no_descriptors)
        assert await proxy.loss(20, both_ways=True) == 1
        with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
            while await stream.receive_some(10):
                pass
    assert any(r["event"] == "hop_failed" for r in read_jsonl(log).records)


STREAMS = ("upstream", "downstream")


async def test_the_plane_relays_the_hop_and_no_byte_crosses_trio() -> None:
    """Two-way loss alone puts no stream on the toxic path: the plane moves client ->
    A and B -> server (and back) as two links of its own, and a boarded connection's
    bytes (those before and after) cross in order."""
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await stream.send_all(b"before")
        with trio.fail_after(10):
            assert await read_exactly(stream, 6) == b"before"
        await proxy.loss(0.001, both_ways=True)
        conn = only_connection(proxy)
        link = conn.link
        assert isinstance(link, HopLink) and link.back is not None
        assert not any(link.front.on_toxic_path(s) for s in STREAMS)
        assert not any(conn.toxic_links[s].running for s in STREAMS)
        await stream.send_all(b"after")
        with trio.fail_after(10):
            assert await read_exactly(stream, 5) == b"after"
        # Counted where the peers read them: the server's side of the hop and the client's.
        assert conn.counts() == (11, 11)
        assert not any(link.front.on_toxic_path(s) or link.back.on_toxic_path(s) for s in STREAMS)
        await stream.aclose()
        await wait_until(lambda: not proxy.connections(), what="the connection ended")


async def test_a_toxic_with_two_way_loss_runs_on_the_client_s_side_of_the_hop() -> None:
    """A latency toxic on a connection on the hop delays its stream (its chain on the
    front link, before the hop), bytes intact; removed, the stream is the plane's again."""
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await proxy.loss(5, both_ways=True)
        proxy.add_toxic(Latency("slow", stream="upstream", latency=200))
        start = trio.current_time()
        await stream.send_all(b"late")
        with trio.fail_after(LOSSY_BOUND_S):
            assert await read_exactly(stream, 4) == b"late"
        assert trio.current_time() - start >= 0.2
        proxy.remove_toxic("slow")
        link = only_connection(proxy).link
        assert isinstance(link, HopLink)
        await wait_until(
            lambda: not link.front.on_toxic_path("upstream"), what="the stream back on the plane"
        )
        await stream.send_all(b"fast")
        with trio.fail_after(LOSSY_BOUND_S):
            assert await read_exactly(stream, 4) == b"fast"
        await stream.aclose()


@pytest.mark.parametrize("when", ["include_new", "while_connecting"])
async def test_the_hop_s_links_finish_the_upstream_connect_and_its_failure(
    tmp_path: Any, when: str
) -> None:
    """A connection on the hop before its upstream connect completed (two-way loss with
    include_new, or applied while the connect hangs) has its back link wait for the
    connect: a connect that gets no answer ends it as ``upstream_failed``, as without
    the hop, and leaves nothing open."""
    log = tmp_path / "events.jsonl"
    hanging = socket.socket()  # a listener that drops every SYN: connects to it hang
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    attach_drop_all(hanging)
    try:
        async with open_proxy(
            hanging.getsockname(), event_log=str(log), connect_timeout=1.0
        ) as proxy:
            if when == "include_new":
                await proxy.loss(5, both_ways=True, include_new=True)
            client = await trio.open_tcp_stream(*proxy.address)
            await wait_until(lambda: len(proxy._connections) == 1, what="the accept")
            conn = only_connection(proxy)
            if when == "while_connecting":
                assert conn.link is not None and conn.link.connecting
                assert await proxy.loss(5, both_ways=True) == 1
            assert isinstance(conn.link, HopLink) and conn.link.connecting
            with trio.fail_after(10):
                assert await client.receive_some(10) == b""
            await wait_until(lambda: not proxy._connections, what="the connection ended")
            assert conn.hop is not None and conn.hop.closed and conn.link.ended
            await client.aclose()
    finally:
        hanging.close()
    records = read_jsonl(log).records
    (failed,) = [r for r in records if r["event"] == "upstream_failed"]
    assert "within 1.0 s" in failed["reason"]
    (closed,) = [r for r in records if r["event"] == "conn_close"]
    assert closed["how"] == "upstream_failed"
