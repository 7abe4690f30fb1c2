"""Unit tests of the toxics' logic against a fake ToxicContext, on trio's mock clock.

The autojump clock makes every timing exact: a toxic that sleeps 100 ms is seen to
forward at exactly t + 0.1. The same toxics are measured through the real proxy on real
sockets in test_toxics_e2e.py.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import trio

from faultnet.server.toxic_codec import (
    BadToxicBody,
    InvalidStream,
    InvalidToxicType,
    ToxicExists,
    check_update,
    toxic_from_json,
    toxic_to_json,
)
from faultnet.toxics import (
    TOXICS,
    Attribute,
    Bandwidth,
    Latency,
    LimitData,
    ResetPeer,
    Slicer,
    SlowClose,
    Timeout,
)


class FakeContext:
    """Records what a toxic passes on, with the (mock) time it did so."""

    def __init__(self, seed: int = 0, stream: str = "downstream") -> None:
        self.conn_id = 1
        self.stream = stream
        self.rng = random.Random(seed)
        self.state: dict[str, Any] = {}
        self.out: list[tuple[float, bytes, float]] = []
        self.events: list[tuple[str, float]] = []

    async def forward(self, data: bytes, t_read: float) -> None:
        self.out.append((trio.current_time(), data, t_read))

    async def forward_eof(self) -> None:
        self.events.append(("eof", trio.current_time()))

    async def close(self) -> None:
        self.events.append(("close", trio.current_time()))

    async def reset(self) -> None:
        self.events.append(("reset", trio.current_time()))

    @property
    def data(self) -> bytes:
        return b"".join(d for _, d, _ in self.out)


async def update_while_waiting(
    toxic: Any, hook: Any, ctx: FakeContext, wait_s: float, **attributes: int
) -> float:
    """Run ``hook(ctx)``; after *wait_s* (mock time) with nothing seen, update *toxic*
    with *attributes*; return the start time once the hook has returned."""
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hook, ctx)
        await trio.sleep(wait_s)
        assert ctx.events == []
        toxic.update(attributes)
    return t0


# -- registry, parsing, validation -----------------------------------------------------


def test_registry_has_toxiproxy_types() -> None:
    assert set(TOXICS) >= {
        "latency",
        "bandwidth",
        "slicer",
        "limit_data",
        "slow_close",
        "timeout",
        "reset_peer",
    }
    # The rest are faultnet's protocol toxics (faultnet.toxics.http...).
    assert all(
        name.startswith(("http_", "tls_"))
        for name in set(TOXICS)
        - {"latency", "bandwidth", "slicer", "limit_data", "slow_close", "timeout", "reset_peer"}
    )
    units = ("millisecond", "KB/s", "bytes", "microsecond", "percent", "requests", "status code")
    for name, cls in TOXICS.items():
        assert cls.type == name
        for attr in cls.ATTRIBUTES:  # every number documents its unit
            if isinstance(attr, Attribute):
                assert any(u in attr.doc for u in units), (name, attr)


def test_defaults_as_toxiproxy() -> None:
    t = toxic_from_json({"type": "latency"})
    assert toxic_to_json(t) == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 0, "jitter": 0},
    }
    t = toxic_from_json({"type": "slicer", "stream": "UpStream", "toxicity": 0})
    assert (t.name, t.stream, t.toxicity) == ("slicer_upstream", "upstream", 0.0)
    assert t.attributes() == {"average_size": 0, "size_variation": 0, "delay": 0}


def test_unknown_and_null_attributes_ignored() -> None:
    t = toxic_from_json(
        {"type": "latency", "attributes": {"latency": 5, "jitter": None, "bogus": "x"}}
    )
    assert t.attributes() == {"latency": 5, "jitter": 0}


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ([], BadToxicBody, "bad request body: expected a JSON object"),
        ({"type": "latency", "name": 3}, BadToxicBody, "bad request body: name must be a string"),
        ({"type": "latency", "stream": "sideways"}, InvalidStream, "stream was invalid"),
        ({"type": "latency", "stream": ""}, InvalidStream, "stream was invalid"),
        ({"type": "nope"}, InvalidToxicType, "invalid toxic type"),
        ({}, InvalidToxicType, "invalid toxic type"),
        ({"type": "latency", "toxicity": "1"}, BadToxicBody, "toxicity must be a number"),
        ({"type": "latency", "toxicity": True}, BadToxicBody, "toxicity must be a number"),
        ({"type": "latency", "toxicity": 1.5}, BadToxicBody, "between 0 and 1"),
        ({"type": "latency", "toxicity": math.nan}, BadToxicBody, "between 0 and 1"),
        ({"type": "latency", "attributes": []}, BadToxicBody, "attributes must be an object"),
        ({"type": "latency", "attributes": {"latency": "5"}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": 5.5}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": True}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": -1}}, BadToxicBody, "between 0 and"),
        ({"type": "limit_data", "attributes": {"bytes": 2**63}}, BadToxicBody, "between 0 and"),
    ],
)
def test_bad_bodies_are_400(body: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        toxic_from_json(body)
    assert info.value.status == 400  # type: ignore[attr-defined]
    assert str(info.value).startswith(message) or message in str(info.value)


def test_bandwidth_rate_may_be_negative_meaning_unlimited() -> None:
    assert toxic_from_json({"type": "bandwidth", "attributes": {"rate": -1}}).rate == -1


def test_check_order_matches_toxiproxy() -> None:
    # An invalid type is reported before a taken name; a taken name before bad attributes.
    with pytest.raises(InvalidToxicType):
        toxic_from_json({"type": "nope"}, taken=lambda n: True)
    with pytest.raises(ToxicExists) as info:
        toxic_from_json({"type": "latency", "attributes": {"latency": "x"}}, taken=lambda n: True)
    assert info.value.status == 409 and info.value.message == "toxic already exists"


def test_update_is_atomic_and_validated() -> None:
    t = Latency("lat", latency=10, jitter=2)
    with pytest.raises(TypeError):
        t.update({"latency": 20, "jitter": "3"})
    assert t.attributes() == {"latency": 10, "jitter": 2}  # nothing applied
    with pytest.raises(ValueError):
        t.update({"latency": -5})
    t.update({"latency": 20})
    assert t.attributes() == {"latency": 20, "jitter": 2}  # merged
    attrs, toxicity = check_update(t, {"attributes": {"jitter": 1}, "toxicity": 0.5, "x": 1})
    assert (attrs, toxicity) == ({"jitter": 1}, 0.5)
    assert check_update(t, {}) == ({}, None)
    with pytest.raises(BadToxicBody):
        check_update(t, {"attributes": {"jitter": 1.5}})
    with pytest.raises(BadToxicBody):
        check_update(t, {"toxicity": -0.1})
    with pytest.raises(BadToxicBody):
        check_update(t, "x")


# -- behaviour on the mock clock --------------------------------------------------------


async def test_latency_delays_from_read_time_and_pipelines(autojump_clock: Any) -> None:
    t = Latency("l", latency=100)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"a", t0)
    await t.on_chunk(ctx, b"b", t0 + 0.001)  # read 1 ms later: leaves 1 ms later
    assert [round(at - t0, 6) for at, _, _ in ctx.out] == [0.1, 0.101]
    assert ctx.data == b"ab"
    assert ctx.out[0][2] == pytest.approx(t0 + 0.1)  # due time passed on down the chain


async def test_latency_jitter_bounded_reproducible_never_reordered(autojump_clock: Any) -> None:
    async def offsets(seed: int) -> list[float]:
        t = Latency("l", latency=50, jitter=40)
        ctx = FakeContext(seed)
        t0 = trio.current_time()
        for i in range(50):
            await t.on_chunk(ctx, bytes([i]), t0 + i * 0.001)
        assert ctx.data == bytes(range(50))
        times = [at - t0 for at, _, _ in ctx.out]
        assert times == sorted(times)
        return [at - t0 - i * 0.001 for i, (at, _, _) in enumerate(ctx.out)]

    a, b, c = await offsets(1), await offsets(1), await offsets(2)
    assert a == pytest.approx(b) and a != pytest.approx(c)  # the seed decides every draw
    # Each delay is within latency +- jitter, or later only to keep the order.
    assert all(d >= 0.010 - 1e-9 for d in a)
    assert 0.010 - 1e-9 <= a[0] <= 0.090 + 1e-9
    assert sum(d <= 0.090 + 1e-9 for d in a) > 40


async def test_bandwidth_paces_at_rate(autojump_clock: Any) -> None:
    t = Bandwidth("b", rate=10)  # 10 KB/s = 10,000 B/s
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"x" * 10_000, t0)
    assert ctx.data == b"x" * 10_000
    assert ctx.out[-1][0] - t0 == pytest.approx(1.0)
    assert max(len(d) for _, d, _ in ctx.out) == 1000  # 100 ms worth per piece
    # Idle time earns no burst credit: the next chunk is paced from its own read time.
    await trio.sleep(5)
    t1 = trio.current_time()
    await t.on_chunk(ctx, b"y" * 2000, t1)
    assert ctx.out[-1][0] - t1 == pytest.approx(0.2)


async def test_bandwidth_zero_or_negative_is_unlimited_and_live(autojump_clock: Any) -> None:
    t = Bandwidth("b", rate=0)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"z" * 100_000, t0)
    assert len(ctx.out) == 1 and ctx.out[0][0] == t0
    t.update({"rate": 100})  # 100 KB/s: 50 KB in 0.5 s
    await t.on_chunk(ctx, b"z" * 50_000, t0)
    assert ctx.out[-1][0] - t0 == pytest.approx(0.5)


async def test_slicer_splits_exactly_with_delay(autojump_clock: Any) -> None:
    t = Slicer("s", average_size=10, size_variation=4, delay=1000)  # 1 ms between pieces
    ctx = FakeContext(seed=7)
    data = bytes(range(256)) * 4
    t0 = trio.current_time()
    await t.on_chunk(ctx, data[:500], t0)
    await t.on_chunk(ctx, data[500:], t0)
    assert ctx.data == data
    sizes = [len(d) for _, d, _ in ctx.out]
    assert all(6 <= s <= 14 for s in sizes[:-1]) and 1 <= sizes[-1] <= 14
    assert sizes.count(sizes[0]) < len(sizes)  # sizes do vary
    gaps = [b[0] - a[0] for a, b in zip(ctx.out, ctx.out[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.001)  # across the chunk boundary too


class SlowForward(FakeContext):
    """A context whose forward takes time, as a real write and wake-up do: *cost* per
    piece, or *costs[i]* for piece i."""

    def __init__(self, cost: float = 0.0, costs: dict[int, float] | None = None) -> None:
        super().__init__()
        self.cost, self.costs = cost, costs or {}

    async def forward(self, data: bytes, t_read: float) -> None:
        await super().forward(data, t_read)
        await trio.sleep(self.costs.get(len(self.out) - 1, self.cost))


def starts(ctx: FakeContext, t0: float) -> list[float]:
    """When each piece was passed on, in microseconds from *t0*."""
    return [round((t - t0) * 1e6, 3) for t, _, _ in ctx.out]


async def test_slicer_paces_by_a_schedule_so_send_costs_do_not_add_up(
    autojump_clock: Any,
) -> None:
    # Each forward costs 30 us; the pause is 100 us from one piece's due time to the
    # next's, so the pieces still leave 100 us apart (a sleep after each send: 130 us).
    ctx = SlowForward(cost=30e-6)
    t0 = trio.current_time()
    await Slicer("s", average_size=64, delay=100).on_chunk(ctx, b"p" * 640, t0)
    assert starts(ctx, t0) == [i * 100.0 for i in range(10)]


async def test_slicer_catches_up_a_small_lag_and_restarts_after_a_stall(
    autojump_clock: Any,
) -> None:
    # Piece 3's write takes 500 us: pieces 4-7, already due, go back to back, and the
    # schedule goes on from 800 us. Piece 12's takes 10 ms (a slow reader), beyond the
    # lag caught up: the schedule restarts from its end rather than a burst of 100.
    ctx = SlowForward(costs={3: 500e-6, 12: 10e-3})
    t0 = trio.current_time()
    await Slicer("s", average_size=1, delay=100).on_chunk(ctx, b"q" * 16, t0)
    assert starts(ctx, t0) == [
        *(0.0, 100.0, 200.0, 300.0),
        *(800.0, 800.0, 800.0, 800.0, 800.0),
        *(900.0, 1000.0, 1100.0, 1200.0),
        *(11200.0, 11300.0, 11400.0),
    ]


async def test_slicer_holds_a_100_us_delay_on_the_real_clock() -> None:
    # One loose real check (no mock clock): the median gap between 500 pieces. Measured
    # 76-98 us at a load of 11 on 2 cores; sleeping through trio's timer (whole
    # milliseconds) it was 1,250 us or more, whatever the load.
    ctx = FakeContext()
    await Slicer("s", average_size=64, delay=100).on_chunk(ctx, b"r" * 64 * 500, 0.0)
    gaps = sorted(b[0] - a[0] for a, b in zip(ctx.out, ctx.out[1:], strict=False))
    assert gaps[len(gaps) // 2] < 500e-6


async def test_slicer_zero_average_passes_whole() -> None:
    ctx = FakeContext()
    await Slicer("s").on_chunk(ctx, b"abc" * 100, 0.0)
    assert [d for _, d, _ in ctx.out] == [b"abc" * 100]


async def test_limit_data_forwards_exactly_n_then_closes() -> None:
    t = LimitData("l", bytes=10)
    ctx = FakeContext()
    await t.on_chunk(ctx, b"0123", 0.0)
    assert ctx.events == []
    await t.on_chunk(ctx, b"456789ABCD", 0.0)
    assert ctx.data == b"0123456789"
    assert [e for e, _ in ctx.events] == ["close"]
    await t.on_chunk(ctx, b"more", 0.0)  # dropped, closed once
    assert ctx.data == b"0123456789" and len(ctx.events) == 1


async def test_limit_data_zero_closes_on_first_chunk() -> None:
    ctx = FakeContext()
    await LimitData("l", bytes=0).on_chunk(ctx, b"x", 0.0)
    assert ctx.data == b"" and [e for e, _ in ctx.events] == ["close"]


async def test_slow_close_delays_fin_and_update_moves_it(autojump_clock: Any) -> None:
    t = SlowClose("s", delay=1000)
    ctx = FakeContext()
    t0 = await update_while_waiting(t, t.on_eof, ctx, 0.2, delay=300)  # due at t0 + 0.3
    assert ctx.events == [("eof", pytest.approx(t0 + 0.3))]
    ctx2 = FakeContext()
    await t.on_chunk(ctx2, b"data", 0.0)
    assert ctx2.data == b"data"  # data untouched


async def test_timeout_drops_holds_fin_and_closes_after_time(autojump_clock: Any) -> None:
    t = Timeout("t", timeout=500)
    ctx = FakeContext()
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.run, ctx)
        for _ in range(10):  # chunks do not re-arm the timer
            await trio.sleep(0.04)
            await t.on_chunk(ctx, b"lost", trio.current_time())
        await t.on_eof(ctx)
    assert ctx.out == []
    assert ctx.events == [("close", pytest.approx(t0 + 0.5))]  # the FIN was held
    assert ctx.state["dropped"] == 40 and ctx.state["eof_held"]


async def test_timeout_zero_never_closes_until_updated(autojump_clock: Any) -> None:
    t = Timeout("t", timeout=0)
    ctx = FakeContext()
    # The new deadline is measured from when the toxic began: long past.
    t0 = await update_while_waiting(t, t.run, ctx, 100, timeout=50)
    assert ctx.events == [("close", pytest.approx(t0 + 100))]


async def test_reset_peer_resets_after_timeout(autojump_clock: Any) -> None:
    t = ResetPeer("r", timeout=250)
    ctx = FakeContext()
    t0 = trio.current_time()
    await t.on_chunk(ctx, b"passes", t0)
    await t.run(ctx)
    assert ctx.data == b"passes"
    assert ctx.events == [("reset", pytest.approx(t0 + 0.25))]
    ctx0 = FakeContext()
    t.update({"timeout": 0})
    t1 = trio.current_time()
    await t.run(ctx0)
    assert ctx0.events == [("reset", t1)]


# -- registration: a toxic is one module ---------------------------------------------------


def test_a_registered_toxic_is_known_to_the_codec_and_the_openapi_document(
    request: pytest.FixtureRequest,
) -> None:
    from faultnet.server.openapi import openapi_document
    from faultnet.toxics import Attribute, AttributeToxic, register

    # Every module holds the same TOXICS dict: restore its entries afterwards.
    saved = dict(TOXICS)
    request.addfinalizer(lambda: (TOXICS.clear(), TOXICS.update(saved)))

    @register
    class Drop(AttributeToxic):
        type = "test_drop"
        ATTRIBUTES = (Attribute("drop_percent", 0, "share of chunks dropped, in percent (bytes)"),)

    t = toxic_from_json({"type": "test_drop", "attributes": {"drop_percent": 5}})
    assert isinstance(t, Drop) and toxic_to_json(t)["attributes"] == {"drop_percent": 5}
    schemas = openapi_document("x")["components"]["schemas"]
    assert "test_drop" in schemas["ToxicCreate"]["properties"]["type"]["enum"]
    drop = schemas["Toxic"]["properties"]["attributes"]["properties"]["drop_percent"]
    assert drop == {
        "type": "integer",
        "minimum": 0,
        "description": "test_drop: share of chunks dropped, in percent (bytes)",
    }
    with pytest.raises(ValueError, match="taken"):

        @register
        class Other(AttributeToxic):
            type = "test_drop"


def test_the_base_toxic_updates_without_attributes() -> None:
    from faultnet.toxics import Toxic

    class Plain(Toxic):
        type = "plain"

    t = Plain("p")
    t.update({"anything": 1})  # unknown keys are ignored, as Toxiproxy does
    assert t.attributes() == {}
    with pytest.raises(TypeError, match="must be an object"):
        t.update([1])  # type: ignore[arg-type]
