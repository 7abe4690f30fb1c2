"""A toxic added to (or removed from) a proxy's connections is one pass over them and
one hand-off to the plane (issue 36, item 3), asserted by structure, not by timing: the
plane is called once for every connection's lane (``Plane.set_stages``), no
connection's lane is called on its own, and no connection builds a chain.

The calls are counted by wrapping the real methods (instrumentation: each still runs),
on the native plane, whose compiled latency stage is what the batch hands over; real
connections to a real echo server, each verified by a round trip. The delay itself is
checked as a lower bound only (a chunk cannot come back sooner than its latency).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from faultnet.planes import native
from faultnet.proxy import Proxy, open_proxy
from faultnet.proxy._connection import Connection, _decided_rng
from faultnet.proxy._toxiclink import COMPILED_STAGES_ENV
from faultnet.testing import echo_server, wait_until
from faultnet.toxics import Latency, LimitData
from tests.faultnet.sockets import read_exactly

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the native plane is not built")

N = 12
LATENCY_MS = 60


@pytest.fixture(autouse=True)
def native_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTNET_DATAPLANE", "native")
    monkeypatch.delenv(COMPILED_STAGES_ENV, raising=False)


#: A proxy with N connections through it, and their client ends.
Connected = tuple[Proxy, list[trio.SocketStream]]
#: The calls the ``calls`` fixture records: (name, detail).
Calls = list[tuple[str, Any]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Every call from now on to the plane's batch, to a link's own lane-moving methods,
    and to a connection's chain building and per-connection path (name, detail)."""
    seen: list[tuple[str, Any]] = []

    def counted(cls: type, name: str, detail: Callable[..., Any], label: str = "") -> None:
        real = getattr(cls, name)

        @functools.wraps(real)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append((label or name, detail(*args)))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    counted(native.Plane, "set_stages", _batch_detail)
    for name in ("set_stages", "to_trio", "to_plane", "stage_words"):
        counted(native.Link, name, lambda *args: args[0], f"Link.{name}")
    counted(Connection, "build_chain", lambda stream: stream)
    counted(Connection, "_put_on_path", lambda stage: stage.toxic.name)
    return seen


def _batch_detail(
    links: list[Any], stream: str, pipelines: list[Any], words: list[Any] | None
) -> tuple[int, str, list[list[Any]]]:
    """A batch call's detail: how many links, the stream, its distinct pipelines."""
    return len(links), stream, [list(p) for p in dict.fromkeys(map(tuple, pipelines))]


async def round_trip_s(stream: trio.SocketStream) -> float:
    t0 = time.monotonic()
    await stream.send_all(b"x")
    with trio.fail_after(5):
        assert await read_exactly(stream, 1) == b"x"
    return time.monotonic() - t0


@pytest.fixture
async def connected() -> AsyncIterator[Connected]:
    async with echo_server() as upstream, open_proxy(upstream) as proxy:
        assert proxy.address is not None
        streams = [await trio.open_tcp_stream(*proxy.address) for _ in range(N)]
        for s in streams:  # through to the upstream: each link is in the plane
            await round_trip_s(s)
        yield proxy, streams
        for s in streams:
            await s.aclose()


async def test_a_toxic_added_to_every_connection_is_one_hand_off_to_the_plane(
    connected: Connected, calls: Calls
) -> None:
    proxy, streams = connected
    proxy.add_toxic(Latency("lat", "downstream", latency=LATENCY_MS))
    assert calls == [("set_stages", (N, "downstream", [[("latency", LATENCY_MS, 0.0, 0.0)]]))]
    for conn in proxy._connections.values():
        assert conn.toxic_links["downstream"].compiled == (conn.stages["lat"],)
        assert [s.toxic.name for s in conn.chain("downstream").stages] == ["lat"]
    # In force on every connection once the add returned: the echo comes back late.
    for s in streams:
        assert await round_trip_s(s) >= LATENCY_MS / 1000 * 0.95

    del calls[:]
    proxy.remove_toxic("lat")
    assert calls == [("set_stages", (N, "downstream", [[]]))]
    for conn in proxy._connections.values():
        assert (
            not conn.chain("downstream").stages and conn.toxic_links["downstream"].compiled is None
        )
        assert conn.link is not None and not conn.link.on_toxic_path("downstream")
    for s in streams:  # still forwarded (no bound above: the machine may be loaded)
        await round_trip_s(s)


async def test_a_stream_that_has_a_toxic_already_goes_the_per_connection_way(
    connected: Connected, calls: Calls
) -> None:
    proxy, streams = connected
    proxy.add_toxic(Latency("first", "downstream", latency=1))
    del calls[:]
    # Two toxics on one stream are a chain trio runs: not the batch's to hand over.
    proxy.add_toxic(Latency("second", "downstream", latency=1))
    assert ("set_stages", (0, "downstream", [[("latency", 1.0, 0.0, 0.0)]])) not in calls
    assert [c for c in calls if c[0] == "_put_on_path"] == [("_put_on_path", "second")] * N
    for conn in proxy._connections.values():
        names = [s.toxic.name for s in conn.chain("downstream").stages]
        assert names == ["first", "second"] and conn.toxic_links["downstream"].compiled is None
    for s in streams:
        await round_trip_s(s)


async def test_a_stage_that_starts_drawing_gets_its_generator_then(
    connected: Connected, calls: Calls
) -> None:
    """A latency without jitter hands the plane no generator (seeding one per
    connection was ~11 us); an update that adds jitter hands each lane the state the
    toxic's own generator starts at, so the plane draws what trio would."""
    proxy, streams = connected
    proxy.add_toxic(Latency("lat", "downstream", latency=1))
    assert not any(c.toxic_links["downstream"].handed for c in proxy._connections.values())
    proxy.update_toxic("lat", {"jitter": 1})
    for conn in proxy._connections.values():
        assert conn.toxic_links["downstream"].handed
        fresh = _decided_rng((proxy.seed, conn.id, "lat")).getrandbits(64)
        assert conn.link is not None and conn.link.stage_words("downstream") == [fresh]
    for s in streams:
        await round_trip_s(s)


async def test_a_connection_on_its_hop_takes_the_batch_by_its_own_calls(
    connected: Connected, calls: Calls
) -> None:
    """A connection under two-way loss is two joined links (faultnet/proxy/_hop.py), not
    one of the plane's own: the batch gives it the stage through its own calls, the
    others in the one C call; a freeze counts it and holds it like the rest."""
    proxy, streams = connected
    await proxy.loss(0.001, both_ways=True, only=[1])
    hopped = proxy._connections[1]
    assert hopped.hop is not None and type(hopped.link) is not native.Link
    del calls[:]
    proxy.add_toxic(Latency("lat", "downstream", latency=LATENCY_MS))
    assert ("set_stages", (N, "downstream", [[("latency", LATENCY_MS, 0.0, 0.0)]])) in calls
    for conn in proxy._connections.values():
        assert conn.toxic_links["downstream"].compiled == (conn.stages["lat"],)
    for s in streams:
        assert await round_trip_s(s) >= LATENCY_MS / 1000 * 0.95
    assert await proxy.freeze() == N
    assert proxy.connection_counts() == {"frozen": N}
    await proxy.thaw()
    proxy.remove_toxic("lat")
    for s in streams:
        await round_trip_s(s)


async def test_a_limit_data_added_to_every_connection_is_one_hand_off_with_its_count(
    connected: Connected, calls: Calls
) -> None:
    """limit_data is a compiled stage too: one batch call gives every lane its limit and
    its count (a word, as a generator is); each connection then closes at the limit."""
    proxy, streams = connected
    proxy.add_toxic(LimitData("lim", "downstream", bytes=3))
    assert calls == [("set_stages", (N, "downstream", [[("limit_data", 3.0, 0.0, 0.0)]]))]
    for conn in proxy._connections.values():
        assert conn.toxic_links["downstream"].handed == (conn.stages["lim"],)  # the count
        assert conn.link is not None and conn.link.stage_words("downstream") == [0]
    for s in streams:
        await s.send_all(b"abcdef")
        assert await read_exactly(s, 3) == b"abc"
        with trio.fail_after(5):
            assert await s.receive_some(10) == b""  # the close at the limit
    await wait_until(lambda: not proxy._connections, 5, what="every connection severed")


async def test_a_toxic_joining_a_compiled_pipeline_keeps_the_stream_on_the_plane(
    connected: Connected, calls: Calls
) -> None:
    """A stream on a compiled stage that a second toxic joins goes the per-connection
    way (a rebuild and a retune), and stays on the plane as a pipeline of the two: no
    lane goes to trio."""
    proxy, streams = connected
    proxy.add_toxic(LimitData("lim", "downstream", bytes=1 << 20))
    del calls[:]
    proxy.add_toxic(Latency("lat", "downstream", latency=LATENCY_MS))
    assert [c for c in calls if c[0] == "_put_on_path"] == [("_put_on_path", "lat")] * N
    assert ("Link.to_trio", "downstream") not in calls
    for conn in proxy._connections.values():
        tl = conn.toxic_links["downstream"]
        assert tl.compiled == (conn.stages["lim"], conn.stages["lat"]) and not tl.running
        assert conn.link is not None and not conn.link.on_toxic_path("downstream")
    for s in streams:
        assert await round_trip_s(s) >= LATENCY_MS / 1000 * 0.95
