"""The latency toxic delays a steady stream by what it is asked, on every plane.

A chunk's delay is measured from the time the plane READ it: a chunk read while the
stream's task slept for the one before must not wait out that sleep and then a full
``latency`` more (issue 32: a batch taken from the plane was stamped with one time, so a
stream of one message per millisecond through latency=5 ms saw 10-16 ms).

The bound is from a measured distribution (300 messages, 2-3 runs a plane, load 2-7):
through latency=10 ms the median delay was 10.8-11.0 ms with each chunk stamped at its
read (trio's timer rounds a sleep up to its next millisecond) and 16.8-19.8 ms with the
batch stamped when taken (at 5 ms: 5.3-5.7 against 8.3-9.8, too close to hold a bound
under the suite's load); asked + 3 ms lies between, with 2 ms for the load. (With the
timerfd sleep, which trio's millisecond timer no longer rounds up: 10.15-10.25 ms.) A delay is
never below the asked latency (it is measured from the send, before the read).
"""

from __future__ import annotations

import statistics
import struct

import pytest
import trio

from faultnet.proxy import open_proxy
from faultnet.testing import accept_server
from faultnet.toxics import Latency

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

LATENCY_MS = 10
#: Messages sent, one every PERIOD seconds (0.3 s of stream).
COUNT, PERIOD = 300, 0.001
MESSAGE = 64


async def test_a_steady_stream_is_delayed_by_the_latency_not_more() -> None:
    async with accept_server() as (addr, accepted), open_proxy(addr) as proxy:
        proxy.add_toxic(Latency("lat", "upstream", latency=LATENCY_MS))
        assert proxy.address is not None
        client = await trio.open_tcp_stream(*proxy.address)
        with trio.fail_after(5):
            server = await accepted.receive()
        sent: list[float] = []
        delays: list[float] = []

        async def receive() -> None:
            buf = b""
            while len(delays) < COUNT:
                data = await server.receive_some(65536)
                assert data, "EOF before every message arrived"
                now = trio.current_time()
                buf += data
                while len(buf) >= MESSAGE:
                    (seq,) = struct.unpack_from("!I", buf)
                    assert seq == len(delays), "bytes out of order"
                    delays.append(now - sent[seq])
                    buf = buf[MESSAGE:]

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                t0 = trio.current_time()
                for seq in range(COUNT):
                    await trio.sleep_until(t0 + seq * PERIOD)
                    sent.append(trio.current_time())
                    await client.send_all(struct.pack("!I", seq).ljust(MESSAGE, b"."))
        await client.aclose()

    delays_ms = sorted(d * 1000 for d in delays)
    p50 = statistics.median(delays_ms)
    assert delays_ms[0] >= LATENCY_MS, f"a message was delayed {delays_ms[0]:.2f} ms only"
    assert p50 < LATENCY_MS + 3, (
        f"median delay {p50:.2f} ms for latency={LATENCY_MS} ms "
        f"(p90 {delays_ms[int(len(delays_ms) * 0.9)]:.2f} ms)"
    )
