"""The proxies of a trio run share one plane of each kind (issue 36 item 1).

A proxy's stop ends its own links only: another proxy's connection on the same plane
goes on forwarding; the plane stops with the last proxy that uses it.
"""

from __future__ import annotations

import pytest
import trio

from faultnet.planes import available_planes
from faultnet.proxy import open_proxy
from faultnet.testing import echo_server


async def round_trip(stream: trio.SocketStream, data: bytes) -> bytes:
    await stream.send_all(data)
    got = b""
    with trio.fail_after(5):
        while len(got) < len(data):
            piece = await stream.receive_some(65536)
            assert piece, "EOF"
            got += piece
    return got


@pytest.mark.usefixtures("each_plane")  # on every data plane built here
async def test_proxies_share_one_plane_and_a_stop_ends_only_its_own_links() -> None:
    async with echo_server() as upstream:
        async with open_proxy(upstream) as keeper:
            async with open_proxy(upstream) as leaver:
                assert leaver._plane is keeper._plane is not None
                kept = await trio.open_tcp_stream(*keeper.address)
                left = await trio.open_tcp_stream(*leaver.address)
                assert await round_trip(kept, b"before") == b"before"
                assert await round_trip(left, b"before") == b"before"
                plane = keeper._plane
            # The leaver stopped: its client reads EOF, the keeper's link still moves.
            with trio.fail_after(5):
                assert await left.receive_some(10) == b""
            assert keeper._plane is plane
            assert await round_trip(kept, b"after") == b"after"
            # A proxy started now joins the running plane rather than making one.
            async with open_proxy(upstream) as joiner:
                assert joiner._plane is plane
                joined = await trio.open_tcp_stream(*joiner.address)
                assert await round_trip(joined, b"joined") == b"joined"
                await joined.aclose()
            await kept.aclose()
            await left.aclose()
        assert keeper._plane is None
        # The last user stopped it: the next proxy gets a new one.
        async with open_proxy(upstream) as fresh:
            assert fresh._plane is not plane


@pytest.mark.skipif(len(available_planes()) < 2, reason="one plane built here")
async def test_proxies_that_choose_different_planes_share_each_its_own() -> None:
    native, thread = available_planes()[:2]
    async with echo_server() as upstream:
        async with (
            open_proxy(upstream, dataplane=native) as a,
            open_proxy(upstream, dataplane=thread) as b,
            open_proxy(upstream, dataplane=native) as c,
            open_proxy(upstream, dataplane=thread, splice=False) as d,
        ):
            assert a._plane is c._plane
            assert a._plane is not b._plane and b._plane is not d._plane
            assert (a._plane.name, b._plane.name, d._plane.name) == (native, thread, thread)  # type: ignore[union-attr]
            for proxy in (a, b, c, d):
                stream = await trio.open_tcp_stream(*proxy.address)
                assert await round_trip(stream, b"ping") == b"ping"
                await stream.aclose()
