"""The toxics' effects measured through the real proxy, on real loopback sockets.

Proxies come from the plugin's ``faultnet_proxy`` fixture. A toxic's semantics is often
a time, so lower bounds are strict (a toxic never fires early, never makes things faster
than it says), and there is no upper bound on how late: speed is for benchmarks, and a
loaded machine schedules the proxy late. "It happened" is an event instead (the bytes,
the EOF) awaited with a generous ``fail_after``; exact times are tested on trio's mock
clock in each toxic's test_<type>.py. Where the claim is that a toxic's time was NOT added (a removed
latency, data a slow_close must not hold), the bound is that time, made large against a
loopback round trip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from faultnet.controls import assert_reset
from faultnet.proxy import Proxy
from faultnet.testing import start_server
from faultnet.toxics import Bandwidth, Latency, LimitData, ResetPeer, Slicer, SlowClose, Timeout
from faultnet.toxics.base import Toxic
from tests.faultnet.sockets import read_exactly

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

Address = tuple[str, int]
Factory = Callable[..., Awaitable[Proxy]]


def _source(payload: bytes) -> Callable[[trio.SocketStream], Awaitable[None]]:
    """A server that sends *payload* at once, then closes."""

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await stream.send_all(payload)
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    return handler


async def used_link(factory: Factory, echo: Address) -> tuple[Proxy, trio.SocketStream]:
    """A proxy in front of the echo, and one connection through it that has carried one
    round trip (so it is open, and in use, before any toxic is added)."""
    proxy = await factory(echo)
    stream = await connect(proxy)
    await rtt(stream)
    return proxy, stream


async def toxic_on_a_used_link(
    factory: Factory, echo: Address, toxic: Toxic
) -> tuple[float, trio.SocketStream]:
    """:func:`used_link`, then *toxic* added: returns (the trio time it was added, the
    connection), which was open and in use before the toxic existed."""
    proxy, stream = await used_link(factory, echo)
    t0 = trio.current_time()
    proxy.add_toxic(toxic)
    return t0, stream


async def through(factory: Factory, nursery: trio.Nursery, payload: bytes, toxic: Toxic) -> Proxy:
    """A proxy with *toxic* in front of a server that sends *payload*, then closes."""
    proxy = await factory(await start_server(nursery, _source(payload)))
    proxy.add_toxic(toxic)
    return proxy


@pytest.fixture
async def echo(nursery: trio.Nursery) -> Address:
    return await start_server(nursery)


async def connect(proxy: Proxy) -> trio.SocketStream:
    assert proxy.address is not None
    return await trio.open_tcp_stream(*proxy.address)


async def read_to_eof(stream: trio.SocketStream, timeout: float = 10) -> bytes:
    got = bytearray()
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            got += chunk
    return bytes(got)


async def rtt(stream: trio.SocketStream, payload: bytes = b"ping") -> float:
    t0 = trio.current_time()
    await stream.send_all(payload)
    assert await read_exactly(stream, len(payload)) == payload
    return trio.current_time() - t0


def pattern(n: int, salt: int = 0) -> bytes:
    return bytes((i * 7 + salt) % 251 for i in range(n))


# -- each toxic's effect ----------------------------------------------------------------


async def test_latency_delays_each_way_at_least_its_time(
    faultnet_proxy: Factory, echo: Address
) -> None:
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Latency("down", "downstream", latency=100))
    stream = await connect(proxy)
    # Each echo arrives (bounded by read_exactly's 10 s), never before its latency.
    # Not how soon after: the exact delay is test_latency.py's, on the mock clock.
    times = [await rtt(stream) for _ in range(4)]
    assert min(times) >= 0.100, times
    proxy.add_toxic(Latency("up", "upstream", latency=50))  # the two ways add up
    times = [await rtt(stream) for _ in range(3)]
    assert min(times) >= 0.150, times


async def test_latency_and_jitter_keep_bytes_exact(faultnet_proxy: Factory, echo: Address) -> None:
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Latency("down", "downstream", latency=10, jitter=10))
    proxy.add_toxic(Latency("up", "upstream", latency=5, jitter=5))
    stream = await connect(proxy)
    data = pattern(512 * 1024)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, data)
        assert await read_exactly(stream, len(data)) == data


async def test_bandwidth_never_beats_its_rate(faultnet_proxy: Factory, echo: Address) -> None:
    rate_kb = 2000  # KB/s, KB = 1000 bytes
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Bandwidth("bw", "downstream", rate=rate_kb))
    stream = await connect(proxy)
    data = pattern(1_000_000)  # 0.5 s at the rate
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, data)
        # It all arrives (bounded: 10 s, 20 x the rate's time), never faster than the
        # rate (within 5 %); how much slower it may be is not asserted.
        assert await read_exactly(stream, len(data), timeout=10) == data
    measured = len(data) / 1000 / (trio.current_time() - t0)
    assert measured <= 1.05 * rate_kb, f"{measured:.0f} KB/s"


async def test_slicer_splits_and_keeps_bytes_exact(faultnet_proxy: Factory, echo: Address) -> None:
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Slicer("s", "downstream", average_size=100, size_variation=50, delay=500))
    stream = await connect(proxy)
    data = pattern(20_000)
    await stream.send_all(data)
    got, reads = bytearray(), 0
    with trio.fail_after(10):
        while len(got) < len(data):
            got += await stream.receive_some(65536)
            reads += 1
    assert bytes(got) == data
    assert reads > 40  # 20 KB arrived in small pieces, not in one or two reads


async def test_limit_data_forwards_exactly_n_bytes_then_fin(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    proxy = await through(faultnet_proxy, nursery, pattern(50_000), LimitData("cut", bytes=1000))
    stream = await connect(proxy)
    assert await read_to_eof(stream) == pattern(50_000)[:1000]  # then a clean EOF


async def test_timeout_black_holes_then_closes_after_its_time(
    faultnet_proxy: Factory, echo: Address
) -> None:
    t0, stream = await toxic_on_a_used_link(faultnet_proxy, echo, Timeout("t", timeout=300))
    await stream.send_all(b"into the void")
    # The event: nothing comes back, then EOF, within read_to_eof's 10 s (33 x the
    # timeout: a toxic that never closes fails here). Never before the timeout: the
    # toxic's semantics is that time. How late it may come is not asserted (a loaded
    # machine schedules the proxy late); the exact deadline is test_timeout.py's, on
    # the mock clock.
    assert await read_to_eof(stream, timeout=10) == b""
    elapsed = trio.current_time() - t0
    assert elapsed >= 0.300, elapsed


async def test_timeout_zero_holds_the_fin_too(faultnet_proxy: Factory, echo: Address) -> None:
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Timeout("t", "upstream", timeout=0))
    stream = await connect(proxy)
    await stream.send_all(b"dropped")
    await stream.send_eof()  # Toxiproxy would forward this FIN; the echo would then close
    with trio.move_on_after(0.3) as scope:
        await stream.receive_some()
    assert scope.cancelled_caught  # no byte, no EOF, no error: a true black hole
    # Removing the toxic lets the held FIN through: the echo answers it with its own.
    proxy.remove_toxic("t")
    with trio.fail_after(5):
        assert await read_to_eof(stream) == b""


async def test_reset_peer_resets_an_existing_idle_connection(
    faultnet_proxy: Factory, echo: Address
) -> None:
    t0, stream = await toxic_on_a_used_link(faultnet_proxy, echo, ResetPeer("r", timeout=100))
    await assert_reset(stream, timeout=2)
    assert trio.current_time() - t0 >= 0.100


async def test_slow_close_delays_the_fin_not_the_data(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    proxy = await through(faultnet_proxy, nursery, b"last words", SlowClose("sc", delay=1000))
    t0 = trio.current_time()
    stream = await connect(proxy)
    assert await read_exactly(stream, 10) == b"last words"
    # The data is not held: it arrives before the FIN's delay has passed. The bound is
    # the toxic's own time, 1 s (100 x a loopback round trip), not a speed.
    assert trio.current_time() - t0 < 1.0, "the data was held like the FIN"
    assert await read_to_eof(stream) == b""
    assert trio.current_time() - t0 >= 1.0


async def test_toxicity_zero_leaves_connections_untouched(
    faultnet_proxy: Factory, echo: Address
) -> None:
    proxy, old = await used_link(faultnet_proxy, echo)
    for toxic in (
        Latency("lat", "downstream", 0.0, latency=60_000),
        ResetPeer("rst", "upstream", 0.0, timeout=0),
        Timeout("to", "downstream", 0.0, timeout=1),
        LimitData("lim", "upstream", 0.0, bytes=0),
    ):
        proxy.add_toxic(toxic)
    new = await connect(proxy)
    await trio.sleep(0.2)  # the scenario: give the would-be reset and timeout their time
    for stream in (old, new):
        for _ in range(3):
            # The echo arrives within rtt's 10 s bound: never the minute of latency.
            await rtt(stream, pattern(1000))
    assert [c.state for c in proxy.connections()] == ["open", "open"]


# -- live changes on a connection carrying data ----------------------------------------


async def test_live_add_update_remove_while_data_flows(
    faultnet_proxy: Factory, echo: Address
) -> None:
    proxy = await faultnet_proxy(echo)
    stream = await connect(proxy)
    sent = received = 0

    async def phase(n: int) -> list[float]:
        nonlocal sent, received
        out = []
        for i in range(n):
            payload = pattern(2000, salt=sent % 251)
            out.append(await rtt(stream, payload))
            sent += len(payload)
            received += len(payload)
            del i
        return out

    await phase(5)
    proxy.add_toxic(Latency("lat", "downstream", latency=100))
    during = await phase(3)
    proxy.update_toxic("lat", {"latency": 1000})
    updated = await phase(1)
    proxy.remove_toxic("lat")
    after = await phase(5)
    assert min(during) >= 0.1 and min(updated) >= 1.0  # added, then updated, live
    # Removed: no round trip takes the 1 s the toxic would still add (a bound set by the
    # toxic's time, 100 x a loopback echo, not a speed).
    assert max(after) < 1.0, after
    assert sent == received == 14 * 2000


async def test_bandwidth_added_and_removed_mid_transfer_keeps_bytes(
    faultnet_proxy: Factory, echo: Address
) -> None:
    proxy = await faultnet_proxy(echo)
    stream = await connect(proxy)
    data = pattern(3_000_000)
    got = bytearray()
    flowing = trio.Event()

    async def toggle() -> None:
        # The toxic comes and goes while the bytes are in flight.
        await flowing.wait()
        proxy.add_toxic(Bandwidth("bw", "downstream", rate=5000))
        await trio.sleep(0.1)
        proxy.remove_toxic("bw")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, data)
            nursery.start_soon(toggle)
            while len(got) < len(data):
                got += await stream.receive_some(65536)
                if len(got) >= 200_000:
                    flowing.set()
    assert bytes(got) == data


async def test_half_close_kept_through_a_chain(faultnet_proxy: Factory, echo: Address) -> None:
    proxy = await faultnet_proxy(echo)
    proxy.add_toxic(Latency("a", "upstream", latency=20))
    proxy.add_toxic(Slicer("b", "downstream", average_size=500, size_variation=100))
    stream = await connect(proxy)
    data = pattern(30_000)
    await stream.send_all(data)
    await stream.send_eof()  # the reply must still come back, then the echo's EOF
    assert await read_to_eof(stream) == data


async def test_toxicity_decided_once_per_connection_and_kept(
    faultnet_proxy: Factory, echo: Address
) -> None:
    proxy = await faultnet_proxy(echo, seed=5)
    proxy.add_toxic(Latency("half", "downstream", 0.5, latency=150))
    streams = [await connect(proxy) for _ in range(12)]

    async def slow_ones() -> list[bool]:
        times: dict[int, float] = {}

        async def one(i: int) -> None:
            # The faster of two round trips: one pause of the whole process (a garbage
            # collection late in a long suite) made 4 unpicked connections look slow once.
            times[i] = min([await rtt(streams[i]), await rtt(streams[i])])

        async with trio.open_nursery() as nursery:
            for i in range(len(streams)):
                nursery.start_soon(one, i)
        return [times[i] >= 0.150 for i in range(len(streams))]

    picked = await slow_ones()
    assert 0 < sum(picked) < len(picked)
    # Toxiproxy re-rolls every connection when the chain changes; faultnet does not.
    proxy.add_toxic(Slicer("other", "upstream"))
    assert await slow_ones() == picked
    proxy.remove_toxic("other")
    proxy.update_toxic("half", {"latency": 160})
    assert await slow_ones() == picked
