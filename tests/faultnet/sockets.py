"""Plain blocking loopback sockets for the tests of socket options and filters."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


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
