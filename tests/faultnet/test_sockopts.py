"""The socket options behind the fault modes, each on real loopback sockets."""

from __future__ import annotations

import resource
import socket

import pytest

from faultnet.probe import ProbeKind, probe
from faultnet.sockopts import (
    attach_drop_all,
    detach_filter,
    filter_length,
    raise_fd_limit,
    set_keepalive,
    set_linger_reset,
    set_user_timeout,
    socket_drops,
    tcp_retransmits,
    tcp_retransmits_needed,
    tcp_state,
)
from faultnet.testing import wait_until
from tests.faultnet.sockets import connected_pair, recv_exactly


async def test_drop_all_on_a_listener_makes_connects_hang_until_detached() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        addr = listener.getsockname()[:2]
        attach_drop_all(listener)
        assert (await probe(addr, 0.3)).kind is ProbeKind.HUNG
        detach_filter(listener)
        assert (await probe(addr, 2.0)).kind is ProbeKind.CONNECTED


def test_detach_without_a_filter_is_not_an_error() -> None:
    s = socket.socket()
    try:
        detach_filter(s)
    finally:
        s.close()


def test_linger_reset_makes_close_send_an_rst() -> None:
    with connected_pair() as (client, server):
        set_linger_reset(server)
        server.close()
        with pytest.raises(ConnectionResetError):
            client.recv(1)


def test_a_plain_close_sends_a_fin_not_an_rst() -> None:
    # The other arm of the linger test: without set_linger_reset, the peer reads EOF.
    with connected_pair() as (client, server):
        server.close()
        assert client.recv(1) == b""


async def test_tcp_state_follows_the_connection() -> None:
    with connected_pair() as (client, server):
        assert tcp_state(server) == 1  # ESTABLISHED
        client.shutdown(socket.SHUT_WR)
        await wait_until(lambda: tcp_state(server) == 8, what="CLOSE_WAIT after the FIN")


async def test_a_retransmit_of_a_lost_segment_is_needed() -> None:
    # The receiver's filter drops the segment: the sender resends what the peer lacked.
    with connected_pair() as (client, server):
        attach_drop_all(server)
        client.sendall(b"x" * 1000)
        await wait_until(lambda: tcp_retransmits(client) >= 1, what="a retransmit")
        detach_filter(server)
        assert recv_exactly(server, 1000) == b"x" * 1000
        server.sendall(b"!")  # its ACK covers the data: no retransmit is outstanding
        assert client.recv(1) == b"!"
        assert tcp_retransmits_needed(client) == tcp_retransmits(client) >= 1


async def test_a_retransmit_the_peer_already_had_is_not_needed() -> None:
    # The segment arrives but its ACK is dropped on the sender's side, so the sender
    # resends what the peer has; once the filter is off, the peer's D-SACK says so.
    with connected_pair() as (client, server):
        attach_drop_all(client)
        client.sendall(b"x" * 1000)
        assert recv_exactly(server, 1000) == b"x" * 1000
        await wait_until(lambda: tcp_retransmits(client) >= 1, what="a retransmit")
        detach_filter(client)
        await wait_until(
            lambda: tcp_retransmits_needed(client) < tcp_retransmits(client),
            what="a retransmit reported back as a duplicate",
        )


async def test_a_duplicate_tcp_discards_counts_in_socket_drops_without_a_filter() -> None:
    # Why a drop count taken while retransmissions are still due can grow with no filter
    # on the socket (FilterDrops, the hop's test): the kernel counts in sk_drops the
    # copies TCP throws away as old data, not only what a filter refused.
    with connected_pair() as (client, server):
        attach_drop_all(client)  # the client's ACKs come back to nothing: it resends
        assert filter_length(client) == 1 and filter_length(server) == 0
        client.sendall(b"x" * 1000)
        assert recv_exactly(server, 1000) == b"x" * 1000
        await wait_until(lambda: socket_drops(server) >= 1, what="a duplicate discarded")
        assert filter_length(server) == 0
        detach_filter(client)
        assert filter_length(client) == 0


def test_keepalive_and_user_timeout_are_set_as_asked() -> None:
    s = socket.socket()
    try:
        set_keepalive(s, idle_s=7, interval_s=3, count=4)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        set_user_timeout(s, 1500)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1500
    finally:
        s.close()


def test_raise_fd_limit_lifts_the_soft_limit_to_the_hard_one() -> None:
    # Lowered first, so the raise has something to do (the proxy raises it again anyway).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, max(hard // 2, 256)), hard))
    got = raise_fd_limit()
    now_soft, now_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert got == now_soft and now_hard == hard
    if hard != resource.RLIM_INFINITY:
        assert now_soft == hard


def test_filter_drops_count_only_while_a_filter_is_on() -> None:
    # The kernel's sk_drops also counts receive-buffer drops: here 3 happen before any
    # filter, 5 under one, 2 after it: the filters dropped 5.
    from faultnet.sockopts import FilterDrops

    kernel = [0]
    drops = FilterDrops(read=lambda sock: kernel[0])
    kernel[0] += 3
    assert drops.count(None) == 0
    drops.attached(None)
    kernel[0] += 5
    assert drops.count(None) == 5
    drops.attached(None)  # a filter replaced by another: one window
    drops.detached(None)
    kernel[0] += 2
    assert drops.count(None) == 5
    drops.attached(None)
    kernel[0] += 1
    assert drops.count(None) == 6


async def test_a_connection_with_no_fault_reports_no_drops_whatever_the_kernel_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A kernel that counted receive-buffer drops on every socket (as measured on a
    # gRPC connection with no fault): the proxy's counters stay at 0 without a filter.
    import trio

    from faultnet import sockopts
    from faultnet.proxy import open_proxy
    from faultnet.testing import echo_server, read_exactly

    monkeypatch.setattr(sockopts, "socket_drops", lambda sock: 7)
    # Where the proxy reads the kernel's counter directly (before FilterDrops).
    monkeypatch.setattr("faultnet.proxy._connection.socket_drops", lambda sock: 7, raising=False)
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await stream.send_all(b"x")
        assert await read_exactly(stream, 1) == b"x"
        info = proxy.connections()[0]
        assert (info.dropped_upstream, info.dropped_downstream) == (0, 0)
        await stream.aclose()
