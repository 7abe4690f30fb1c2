"""The socket filters of faultnet.bpf, each on a real loopback connection."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
import trio

from faultnet import bpf
from faultnet.sockopts import (
    detach_filter,
    flush_ack,
    socket_drops,
    tcp_segs_in,
    tcp_unacked,
)
from faultnet.testing import wait_until
from tests.faultnet.sockets import connected_pair, recv_exactly


async def test_pure_acks_only_lets_acks_in_but_no_data() -> None:
    with connected_pair() as (client, server):
        bpf.attach(server, bpf.pure_acks_only())
        # The server's data is acknowledged by the client: those ACKs get in...
        server.sendall(b"x" * 1000)
        assert client.recv(1000)
        await wait_until(lambda: tcp_unacked(server) == 0, 2.0)
        # ...but the client's data does not (the client retransmits it, unread).
        before = tcp_segs_in(server)
        client.sendall(b"y" * 100)
        server.setblocking(False)
        assert not await _becomes(lambda: _readable(server), 0.5)
        detach_filter(server)
        server.setblocking(True)
        assert server.recv(100) == b"y" * 100  # the retransmission, once let in
        assert tcp_segs_in(server) > before


async def test_drop_all_keeps_what_was_sent_unacknowledged() -> None:
    # The other arm: under drop-all the client's ACK never gets in, so the sender keeps
    # the segment to retransmit (what a blackhole must not do to its client).
    with connected_pair() as (client, server):
        bpf.attach(server, bpf.drop_all())
        server.sendall(b"x" * 1000)
        assert client.recv(1000)
        assert not await _becomes(lambda: tcp_unacked(server) == 0, 0.5)


async def test_drop_bare_fraction_at_one_lets_data_and_fin_in_but_no_ack() -> None:
    # Two-way loss's client leg at its extreme: every bare segment lost, nothing else.
    with connected_pair() as (client, server):
        bpf.attach(server, bpf.drop_bare_fraction(1.0))
        client.sendall(b"y" * 100)  # data: in, and acknowledged (the server's ACK)
        assert recv_exactly(server, 100) == b"y" * 100
        await wait_until(lambda: tcp_unacked(client) == 0, 2.0)
        server.sendall(b"x" * 1000)  # the client's bare ACK of it never gets in
        assert client.recv(1000)
        assert not await _becomes(lambda: tcp_unacked(server) == 0, 0.5)
        client.shutdown(socket.SHUT_WR)  # a FIN is no bare segment: it gets in
        assert server.recv(1) == b""


async def test_drop_bare_fraction_below_one_drops_some_bare_segments_and_no_data() -> None:
    # The other arm: at half, the server's 50 writes (each ACKed on its own by the
    # client: no data back to ride on) lose some ACKs (all 50 kept: 1e-15); the
    # client's data all gets in. No Nagle: a write waiting on a lost ACK waits an RTO.
    with connected_pair() as (client, server):
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bpf.attach(server, bpf.drop_bare_fraction(0.5))
        before = socket_drops(server)
        for _ in range(50):
            server.sendall(b"x")
            assert client.recv(1) == b"x"
            flush_ack(client)
        client.sendall(b"y" * 100)
        assert recv_exactly(server, 100) == b"y" * 100
        assert socket_drops(server) > before


def test_drop_bare_fraction_takes_a_share_above_zero() -> None:
    with pytest.raises(ValueError, match="above 0"):
        bpf.drop_bare_fraction(0.0)


async def _becomes(predicate: Callable[[], bool], seconds: float) -> bool:
    """Whether *predicate* turns true within *seconds* (an absence is observed over a
    window: there is no event for "never")."""
    with trio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110 - kernel state, no event to wait on
            await trio.sleep(0.01)
        return True
    return False


def _readable(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
