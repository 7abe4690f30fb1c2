"""Plain blocking loopback sockets for the tests of socket options and filters, and a
bounded read of a trio stream for the tests of the planes and toxics."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from faultnet import testing


@contextmanager
def connected_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A loopback TCP connection, (the client's end, the server's end), each blocking
    with a 5 s timeout; both ends and their listener are closed after."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2], timeout=5)
        server, _ = listener.accept()
        server.settimeout(5)
        with client, server:
            yield client, server


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """*n* bytes from *sock*, failing on an EOF before them."""
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "EOF"
        got += chunk
    return got


async def read_exactly(stream: trio.abc.ReceiveStream, n: int, timeout: float = 10) -> bytes:
    """:func:`faultnet.testing.read_exactly` failing after *timeout* seconds, so a stream
    that never delivers fails its test instead of hanging it."""
    with trio.fail_after(timeout):
        return await testing.read_exactly(stream, n)


async def carried(
    sender: trio.abc.SendStream, receiver: trio.abc.ReceiveStream, data: bytes
) -> float:
    """Send *data* on *sender* and read it back whole from *receiver*; the seconds that
    took (trio's clock), for the tests that a delay was applied."""
    t0 = trio.current_time()
    await sender.send_all(data)
    assert await read_exactly(receiver, len(data)) == data
    return trio.current_time() - t0
