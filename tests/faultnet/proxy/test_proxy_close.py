"""A proxy going away (``aclose``, leaving ``open_proxy``, deleting or disabling it
through the API: one path) never ends a stream early with a FIN (issue 35 item 6).

A FIN tells a peer the other side finished sending: a server that reads 256,000 of
2,097,152 bytes and then a clean EOF takes a truncated upload for a whole one. A real
network never does that: a middlebox that dies resets, or its peers time out. So a
connection with anything in flight when its proxy closes (unread in the proxy's
sockets, held by the plane, in its toxic chain) is reset both ways; a quiet one (all
it was given delivered) still ends with a clean FIN each way, as a server that closes
an idle keep-alive connection does.
"""

from __future__ import annotations

import socket

import pytest
import trio

from faultnet.planes import available_planes
from faultnet.proxy import open_proxy
from faultnet.proxy._toxiclink import COMPILED_STAGES_ENV
from faultnet.testing import accept_server, read_exactly, wait_until
from faultnet.toxics import Latency

#: How long the peers may take to see the end once the proxy has closed: a reset or a
#: FIN arrives within milliseconds on loopback; a missing one waits this out.
END_BOUND_S = 10.0

planes_here = pytest.mark.parametrize("plane", available_planes())


async def _fill(sock: socket.socket) -> int:
    """Write to *sock* (non-blocking) until its send buffer is full; bytes written."""
    sent = 0
    chunk = b"x" * 65536
    while True:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            return sent
        await trio.lowlevel.checkpoint()


async def _read_to_the_end(stream: trio.SocketStream) -> tuple[int, str]:
    """(bytes read, how the stream ended: "eof" or "reset")."""
    got = 0
    with trio.fail_after(END_BOUND_S):
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except trio.BrokenResourceError:
                return got, "reset"
            if not data:
                return got, "eof"
            got += len(data)


async def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(address)
    await trio.lowlevel.wait_writable(sock)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    return sock


async def _client_end(sock: socket.socket) -> str:
    with trio.fail_after(END_BOUND_S):
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                while sock.recv(65536):
                    pass
                return "eof"
            except BlockingIOError:
                continue
            except ConnectionResetError:
                return "reset"


@planes_here
async def test_a_proxy_closed_with_bytes_in_flight_resets_both_peers(plane: str) -> None:
    async with accept_server() as (upstream, accepted):
        async with open_proxy(upstream, dataplane=plane) as proxy:
            assert proxy.address is not None
            client = await _connect(proxy.address)
            server = await accepted.receive()
            # The server reads nothing yet: the bytes fill every buffer on the way.
            sent = await _fill(client)  # MBs on loopback: every buffer on the way is full
        # The proxy is gone. The server reads what reached it, then must not see a
        # clean end of a stream that was cut short.
        got, how = await _read_to_the_end(server)
        assert how == "reset", f"a clean EOF after {got} of {sent} bytes written"
        assert await _client_end(client) == "reset"
        client.close()


@planes_here
async def test_a_quiet_connection_still_ends_with_a_fin_each_way(plane: str) -> None:
    async with accept_server() as (upstream, accepted):
        async with open_proxy(upstream, dataplane=plane) as proxy:
            assert proxy.address is not None
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            await client.send_all(b"ping")
            assert await read_exactly(server, 4) == b"ping"
            await server.send_all(b"pong")
            assert await read_exactly(client, 4) == b"pong"
        assert await _read_to_the_end(server) == (0, "eof")
        assert await _read_to_the_end(client) == (0, "eof")


async def test_bytes_a_toxic_holds_are_in_flight_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk the toxic chain has taken from the plane (a 10 s latency sleeping on it)
    is neither unread in a socket nor held by the plane: only the toxic link knows it.
    Closing the proxy then must reset, not FIN (the chain kept in trio: no compiled
    stage, whose queue the plane itself would report)."""
    monkeypatch.setenv(COMPILED_STAGES_ENV, "0")
    async with accept_server() as (upstream, accepted):
        async with open_proxy(upstream) as proxy:
            assert proxy.address is not None
            proxy.add_toxic(Latency("slow", "upstream", latency=10_000))
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            await client.send_all(b"held by the chain")
            await wait_until(lambda: len(proxy._connections) == 1)
            (conn,) = proxy._connections.values()
            links = conn.toxic_links["upstream"]
            await wait_until(
                lambda: (
                    links.holding and conn.link is not None and not conn.link.holding("upstream")
                )
            )
        assert await _read_to_the_end(server) == (0, "reset")
        await client.aclose()


@planes_here
async def test_bytes_inside_the_hop_are_in_flight_too(plane: str) -> None:
    """Bytes the plane wrote into a connection's internal hop (two-way loss) and the
    hop's TCP has not delivered (100 % loss: every segment of the hop dropped) are in
    flight: the proxy's close resets both peers, as for bytes held anywhere else."""
    async with accept_server() as (upstream, accepted):
        async with open_proxy(upstream, dataplane=plane) as proxy:
            assert proxy.address is not None
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            assert await proxy.loss(100, both_ways=True) == 1
            (conn,) = proxy._connections.values()
            hop = conn.hop
            assert hop is not None
            await client.send_all(b"lost in the hop")
            await wait_until(lambda: hop.holding("upstream"), what="bytes inside the hop")
        assert await _read_to_the_end(server) == (0, "reset")
        assert await _read_to_the_end(client) == (0, "reset")
