"""An idle keep-alive connection to the API is not closed under its client (issue 35
item 4: requests closed with no response).

hypercorn closed a connection idle for 5 s. A client that reuses a pooled connection
(Toxiproxy's Go client keeps one 90 s, urllib3 and requests keep one until the server
closes it) and sends its next request as that close is on its way gets no answer
(``RemoteDisconnected``); the more loaded the machine, the wider that window. The API
now keeps an idle connection for :data:`KEEP_ALIVE_TIMEOUT_S`, longer than those pools,
as Toxiproxy's server (Go's net/http, no idle timeout) keeps it for good.
"""

from __future__ import annotations

import socket

import trio

from faultnet.server import RunningServer
from faultnet.server.api import KEEP_ALIVE_TIMEOUT_S

#: hypercorn's own default, the timeout the API had: an idle connection outlives it.
HYPERCORN_DEFAULT_S = 5.0
REQUEST = b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: test\r\n\r\n"


async def _answer(stream: trio.SocketStream) -> bytes:
    got = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = await stream.receive_some(65536)
            assert chunk, f"the API closed the connection without answering: {got!r}"
            got += chunk
    return got


async def test_an_idle_keep_alive_connection_outlives_a_go_clients_pool(
    faultnet_server: RunningServer,
) -> None:
    assert KEEP_ALIVE_TIMEOUT_S > 90  # Go's http.Transport IdleConnTimeout
    host, _, port = faultnet_server.url.removeprefix("http://").rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(REQUEST)
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        # Idle past the old timeout (time passing is what is tested, not a wait for an
        # event): the server must not have closed it.
        await trio.sleep(HYPERCORN_DEFAULT_S + 0.5)
        with socket.fromfd(stream.socket.fileno(), socket.AF_INET, socket.SOCK_STREAM) as peek:
            try:
                early = peek.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
            except BlockingIOError:
                early = None  # nothing readable: neither bytes nor the server's FIN
        assert early is None, f"the API closed the idle connection ({early!r})"
        await stream.send_all(REQUEST)
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
