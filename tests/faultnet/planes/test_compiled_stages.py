"""Compiled stages: the latency toxic run by the native plane's thread.

A stream whose chain is one latency toxic leaves trio: the plane queues each chunk with
its read time and writes it when due (faultnet/planes/_native.c: ``release_due``), under
the same gate, half-close and byte bound as the toxic path. The Python toxic stays the
reference: the same generator draws the same jitter (:mod:`faultnet.toxics.draws`).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from faultnet.planes import native
from faultnet.proxy import Proxy
from faultnet.proxy._toxiclink import COMPILED_STAGES_ENV
from faultnet.testing import open_link, wait_until
from faultnet.toxics import Latency
from faultnet.toxics.draws import GAMMA, Draws

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the native plane is not built")


@pytest.fixture(autouse=True)
def native_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTNET_DATAPLANE", "native")
    monkeypatch.delenv(COMPILED_STAGES_ENV, raising=False)


def only_connection(proxy: Proxy) -> Any:
    (conn,) = proxy._connections.values()
    return conn


async def read_exactly(stream: trio.SocketStream, n: int, timeout: float = 10) -> bytes:
    got = bytearray()
    with trio.fail_after(timeout):
        while len(got) < n:
            data = await stream.receive_some(65536)
            assert data, f"EOF after {len(got)} of {n} bytes"
            got += data
    return bytes(got)


async def compiled(conn: Any, stream: str = "upstream") -> None:
    """Wait until *stream*'s chain runs on the plane (trio's task handed it over)."""

    def on_stage() -> bool:
        tl = conn.toxic_links[stream]
        return tl.compiled is not None and not conn.link.on_toxic_path(stream)

    await wait_until(on_stage, 5, what="the chain handed to the compiled stage")


def test_the_generator_draws_the_same_in_c_and_in_python() -> None:
    from faultnet.planes import _native

    for seed in (0, 1, 2**63 - 1, 2**64 - 1, 0x0123456789ABCDEF, *range(100, 105)):
        d = Draws(seed)
        assert _native.draws(seed, 1000, -7.0, 13.0) == [d.uniform(-7.0, 13.0) for _ in range(1000)]
    d = Draws(42)
    first = d.next64()
    d.state = (d.state - GAMMA) % 2**64  # a draw taken back (the C does, leaving a stage)
    assert d.next64() == first


async def test_a_latency_chain_runs_on_the_plane_and_delays_from_the_read() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=40))
        await compiled(conn)
        assert not conn.toxic_links["upstream"].running  # no trio task per chunk
        t0 = trio.current_time()
        await client.send_all(b"hello")
        assert await read_exactly(server, 5) == b"hello"
        assert trio.current_time() - t0 >= 0.040
        # The other way is untouched: the plain fast path.
        await server.send_all(b"back")
        assert await read_exactly(client, 4) == b"back"


async def test_the_eof_goes_after_the_held_bytes_when_they_are_due() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=60))
        await compiled(conn)
        t0 = trio.current_time()
        await client.send_all(b"last words")
        await client.send_eof()
        assert await read_exactly(server, 10) == b"last words"
        assert trio.current_time() - t0 >= 0.060
        with trio.fail_after(5):
            assert await server.receive_some(10) == b""
        assert conn.link.eof_forwarded("upstream")
        # Half-close: the other way still goes.
        await server.send_all(b"still")
        assert await read_exactly(client, 5) == b"still"


async def test_a_freeze_holds_the_queue_and_a_thaw_releases_what_is_due() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=20))
        await compiled(conn)
        await client.send_all(b"queued")
        await wait_until(lambda: conn.link._queued(0) > 0, 5, what="the chunk queued")
        conn.link.freeze(["upstream"])  # total on return: nothing more is written
        before = conn.link.counts()
        await trio.sleep(0.060)  # past the chunk's due time, frozen
        assert conn.link.counts() == before == (0, 0)
        conn.link.thaw(["upstream"])
        t0 = trio.current_time()
        assert await read_exactly(server, 6) == b"queued"
        assert trio.current_time() - t0 < 1.0  # due already: out at the thaw, not later


async def test_an_update_reaches_the_stage_and_removal_returns_the_fast_path() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=5000))
        await compiled(conn)
        proxy.update_toxic("lat", {"latency": 10})
        t0 = trio.current_time()
        await client.send_all(b"quick")
        assert await read_exactly(server, 5, timeout=3) == b"quick"
        assert 0.010 <= trio.current_time() - t0 < 3
        # Held at removal: goes out at once, in order, then the lane is plain again.
        proxy.update_toxic("lat", {"latency": 5000})
        await client.send_all(b"held")
        await wait_until(lambda: conn.link._queued(0) > 0, 5, what="the chunk queued")
        proxy.remove_toxic("lat")
        assert await read_exactly(server, 4, timeout=3) == b"held"
        await wait_until(lambda: conn.link._queued(0) == 0, 5, what="the queue emptied")
        assert conn.toxic_links["upstream"].compiled is None
        assert not conn.link.on_toxic_path("upstream")
        await client.send_all(b"after")
        assert await read_exactly(server, 5) == b"after"
        # A toxic of another form takes the lane back to trio, queued bytes and all.
        proxy.add_toxic(Latency("lat2", "upstream", latency=30))
        await compiled(conn)
        proxy.add_toxic(Latency("lat3", "upstream", latency=30))  # two: trio's chain
        assert conn.toxic_links["upstream"].compiled is None
        assert conn.link.on_toxic_path("upstream")
        t0 = trio.current_time()
        await client.send_all(b"twice")
        assert await read_exactly(server, 5) == b"twice"
        assert trio.current_time() - t0 >= 0.060


async def test_the_queue_is_bounded_in_bytes() -> None:
    from faultnet.planes import _native

    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=1000))
        await compiled(conn)
        payload = bytes(4 * 1024 * 1024)
        bound = _native.INBOX_BYTES + _native.COPY_CHUNK + _native.CHUNK_COST
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, payload)
            await wait_until(
                lambda: conn.link._queued(0) >= _native.INBOX_BYTES, 5, what="the queue full"
            )
            await trio.sleep(0.1)  # the reader would go on here, were it not stopped
            assert conn.link._queued(0) <= bound
            proxy.update_toxic("lat", {"latency": 0})  # the rest at once
            assert await read_exactly(server, len(payload), timeout=30) == payload


async def test_the_thread_plane_keeps_the_chain_in_trio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTNET_DATAPLANE", "thread")
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("lat", "upstream", latency=20))
        t0 = trio.current_time()
        await client.send_all(b"slow")
        assert await read_exactly(server, 4) == b"slow"
        assert trio.current_time() - t0 >= 0.020
        assert conn.link.on_toxic_path("upstream")
        assert conn.toxic_links["upstream"].compiled is None
