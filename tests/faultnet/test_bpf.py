"""The socket filters of faultnet.bpf, each on a real loopback connection."""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from faultnet import bpf
from faultnet.sockopts import detach_filter, tcp_segs_in, tcp_unacked
from faultnet.testing import wait_until
from tests.faultnet.sockets import connected_pair


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
