"""The fault state made real on the sockets, on every plane.

Thawing one stream at a time ends where thawing both at once does: the defect of issue
20 (a blackhole thawed per stream stayed blackholed for good, its drop filter on, and
``include_new`` kept blackholing every new connection). And a new connection carries
its own state's filter, not its listener's."""

from __future__ import annotations

import pytest
import trio

from faultnet.proxy import Proxy
from faultnet.sockopts import filter_length
from faultnet.testing import open_link, read_exactly, wait_until

pytestmark = pytest.mark.usefixtures("each_plane")


async def _forwards(proxy: Proxy, client: trio.SocketStream, server: trio.SocketStream) -> None:
    with trio.fail_after(5):
        await client.send_all(b"up")
        assert await read_exactly(server, 2) == b"up"
        await server.send_all(b"down")
        assert await read_exactly(client, 4) == b"down"


@pytest.mark.parametrize("first", ["upstream", "downstream"])
@pytest.mark.parametrize("fault", ["blackhole", "partition"])
async def test_thawing_each_stream_in_turn_leaves_an_open_link_forwarding(
    fault: str, first: str
) -> None:
    async with open_link() as (proxy, client, server):
        await getattr(proxy, fault)()
        second = "downstream" if first == "upstream" else "upstream"
        await proxy.thaw(first)
        (info,) = proxy.connections()
        assert info.state == f"blackholed-{second}"  # the other stream still is
        await proxy.thaw(second)
        (info,) = proxy.connections()
        assert info.state == "open"
        (conn,) = proxy._connections.values()
        assert filter_length(conn.client) == 0, "the blackhole's drop filter is still on"
        assert proxy.state["blackhole_new"] is False and proxy.state["partitioned"] == []
        await _forwards(proxy, client, server)


async def test_thawing_each_stream_of_include_new_in_turn_ends_it() -> None:
    async with open_link() as (proxy, client, server):
        await proxy.blackhole(include_new=True)
        await proxy.thaw("upstream")
        assert proxy.state["blackhole_new"] is True  # downstream still is
        await proxy.thaw("downstream")
        assert proxy.state["blackhole_new"] is False
        assert proxy.address is not None
        fresh = await trio.open_tcp_stream(*proxy.address)
        await wait_until(lambda: len(proxy.connections()) == 2)
        assert {c.state for c in proxy.connections()} == {"open"}
        await fresh.aclose()
        await _forwards(proxy, client, server)


@pytest.mark.parametrize("listener_fault", ["partition of another peer", "syn_loss"])
async def test_a_connection_accepted_under_a_listener_filter_does_not_inherit_it(
    listener_fault: str,
) -> None:
    """An accepted socket inherits its listener's filter: a syn_loss's random drop (it
    checks no SYN flag) or a partition's peer rules would go on dropping the new
    connection's own segments. Found by test_faultstate_sequences (filter 4, model 0)."""
    async with open_link() as (proxy, client, server):
        if listener_fault == "syn_loss":
            await proxy.syn_loss(1)  # a dropped SYN only makes this connect 1 s slower
        else:
            await proxy.partition(peer="127.0.0.2")
        assert proxy.address is not None
        fresh = await trio.open_tcp_stream(*proxy.address)
        await wait_until(lambda: len(proxy._connections) == 2)
        newest = max(proxy._connections.values(), key=lambda c: c.id)
        assert filter_length(newest.client) == 0
        assert newest.info().state == "open"
        await fresh.aclose()
