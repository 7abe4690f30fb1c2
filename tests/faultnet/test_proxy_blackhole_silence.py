"""A blackhole sends the client nothing from the moment the call returns: no
retransmission, no ACK, no keepalive answer (the client's TCP_INFO ``segs_in`` does not
rise), as a dead route sends nothing. Unprivileged: no namespace, loopback only."""

from __future__ import annotations

import pytest
import trio

from faultnet import planes
from faultnet.proxy import open_proxy
from faultnet.sockopts import set_keepalive, tcp_segs_in
from faultnet.testing import echo_server, read_exactly

#: The proxy kernel's retransmissions of an unacknowledged reply would come at about
#: 0.2, 0.6 and 1.4 s (RTO 200 ms, doubling): 1.5 s of silence shows none came.
WINDOW_S = 1.5


@pytest.mark.parametrize("dataplane", planes.available_planes())
@pytest.mark.parametrize("mode", ["blackhole", "partition"])
async def test_after_a_reply_the_client_takes_in_no_segment(dataplane: str, mode: str) -> None:
    async with echo_server() as up, open_proxy(up, dataplane=dataplane) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        # 60 round trips: the client leaves quick-ack mode and delays its ACK of each
        # reply, so the last reply is still unacknowledged when the fault lands.
        for _ in range(60):
            await stream.send_all(b"x" * 64)
            assert await read_exactly(stream, 64) == b"x" * 64
        await getattr(proxy, mode)()
        before = tcp_segs_in(stream.socket)
        await trio.sleep(WINDOW_S)  # observing a window: absence has no event
        assert tcp_segs_in(stream.socket) - before == 0
        assert proxy.connections()[0].state == "blackholed"
        await stream.aclose()


async def test_a_keepalive_probe_goes_unanswered() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        set_keepalive(stream.socket, 1, 1, 2)
        await stream.send_all(b"x")
        assert await read_exactly(stream, 1) == b"x"
        await proxy.blackhole()
        before = tcp_segs_in(stream.socket)
        # Probes at 1 s and 2 s, unanswered; at 3 s the client's kernel gives up.
        with trio.fail_after(6):
            with pytest.raises(trio.BrokenResourceError) as info:
                await stream.receive_some(1)
        assert isinstance(info.value.__cause__, TimeoutError)
        assert tcp_segs_in(stream.socket) - before == 0
