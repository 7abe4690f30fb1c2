"""freeze models a route on which bytes stop arriving: what a client can still read
after ``freeze()`` returns, beyond what already sat in its own receive queue, is bounded
(the proxy's kernel send queue toward it holds at most that much unsent). Slow readers
behind a flooding server, many connections, both planes."""

from __future__ import annotations

import pytest
import trio

from faultnet import planes
from faultnet.proxy import open_proxy
from faultnet.sockopts import unread_bytes
from faultnet.testing import accept_server, start_server

#: The documented bound per connection and direction.
LEAK_BOUND = 256 * 1024
CONNECTIONS = 12
#: A reader that took nothing for this long has read all there was.
QUIET_S = 0.4


async def _flood(stream: trio.SocketStream) -> None:
    block = b"f" * 65536
    try:
        while True:
            await stream.send_all(block)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _read_until_quiet(stream: trio.SocketStream) -> int:
    got = 0
    while True:
        with trio.move_on_after(QUIET_S):
            data = await stream.receive_some(1 << 20)
            if not data:
                return got
            got += len(data)
            continue
        return got


async def _stalled(proxy, stream: str = "downstream", bound: float = 20.0) -> None:
    """Until no byte has crossed for a while: every buffer on the way is full."""
    last = -1
    with trio.fail_after(bound):
        while True:
            now = sum(getattr(c, f"bytes_{stream}") for c in proxy.connections())
            if now == last:
                return
            last = now
            await trio.sleep(0.3)  # sampling a counter that has no event


@pytest.mark.parametrize("dataplane", planes.available_planes())
async def test_slow_readers_read_a_bounded_amount_after_freeze(dataplane: str) -> None:
    async with trio.open_nursery() as nursery:
        up = await start_server(nursery, _flood)
        async with open_proxy(up, dataplane=dataplane) as proxy:
            streams = [await trio.open_tcp_stream(*proxy.address) for _ in range(CONNECTIONS)]
            await _stalled(proxy)
            await proxy.freeze()
            leaks = []
            for s in streams:
                queued = unread_bytes(s.socket)
                leaks.append(await _read_until_quiet(s) - queued)
            for s in streams:
                await s.aclose()
        nursery.cancel_scope.cancel()
    assert max(leaks) <= LEAK_BOUND, f"read after freeze beyond the receive queue: {leaks}"


@pytest.mark.parametrize("dataplane", planes.available_planes())
async def test_a_slow_server_reads_a_bounded_amount_after_freeze(dataplane: str) -> None:
    # The other direction: flooding clients, a server that reads nothing until the
    # freeze, then everything it can.
    async with accept_server() as (up, accepted), open_proxy(up, dataplane=dataplane) as proxy:
        async with trio.open_nursery() as nursery:
            clients = [await trio.open_tcp_stream(*proxy.address) for _ in range(CONNECTIONS)]
            for c in clients:
                nursery.start_soon(_flood, c)
            servers = [await accepted.receive() for _ in range(CONNECTIONS)]
            await _stalled(proxy, "upstream")
            await proxy.freeze()
            leaks = []
            for s in servers:
                queued = unread_bytes(s.socket)
                leaks.append(await _read_until_quiet(s) - queued)
            nursery.cancel_scope.cancel()
        for c in clients:
            await c.aclose()
    assert max(leaks) <= LEAK_BOUND, f"read after freeze beyond the receive queue: {leaks}"
