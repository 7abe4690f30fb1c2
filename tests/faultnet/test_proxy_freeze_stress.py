"""Freeze is total when it returns, under load: 32 streams, random freezes (seeded).

32 connections carry seeded random bytes both ways at once, in writes from 1 byte to
300 KB. A freezer freezes one stream or both, on a random subset of the connections or
on all, for a short window, then thaws. After every ``freeze()`` returns:

* no receiver ever holds more bytes of a frozen direction than the proxy had counted
  for it when ``freeze()`` returned (bytes already in the kernel still drain up to it);
* the proxy's counter of a frozen direction does not move while it is frozen;
* at the end every stream matches, by length and SHA-256.

Every decision is drawn from one seeded rng and written, with the seed, into the
failure message; the proxy's event log (``fault_applied`` records) holds the counters.
The freezer's windows are the scenario (a frozen interval during which a sender streams
flat out), not synchronisation; the end of the run is waited for with a bound.

Every data plane runs it (faultnet.planes.available_planes()). The check is proven to go
red: the ``goes_red`` tests remove the look at the gate (the thread's general path; every
look the thread makes, its loop's inlined one included) and see bytes cross a frozen link. Removing the thread
plane's lock from freeze is a race here (a manual check below); tests/faultnet/planes/
test_thread.py shows it red deterministically, freezing a lane while its write is held.
On the native core the mutex skipped (its debug switch) goes red here (see below).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from dataclasses import dataclass, field

import pytest
import trio

from faultnet.planes import available_planes, native
from faultnet.planes import thread as dataplane
from faultnet.planes.thread import Lane as PlaneLane
from faultnet.planes.thread import Link
from faultnet.proxy import open_proxy
from faultnet.testing import accept_server
from faultnet.toxics.base import Toxic

STREAMS = 32
#: Bytes each stream carries each way (writes of 1 B to 300 KB, log-uniform, so small
#: writes are as common as bursts): 32 x 2 x 1.5 MiB = 96 MiB per run.
BYTES_PER_DIRECTION = 1536 * 1024
MAX_WRITE = 300_000
#: Freezes stop when every byte has arrived; at least MIN_IN_FLIGHT of them must have
#: caught bytes on their way (else the run proved nothing), at most MAX_ROUNDS in all.
MIN_IN_FLIGHT = 8
MAX_ROUNDS = 400
#: The whole run's bound: about 1.5 s on this machine's 2 shared cores.
RUN_BOUND_S = 60


class PassThrough(Toxic):
    """A toxic that changes nothing: forces the copy path and the toxic chain."""

    type = "passthrough"


@dataclass
class Lane:
    """One direction of one connection, as its receiver sees it."""

    conn: int
    stream: str
    expected: bytes
    received: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    #: The proxy's count when freeze() returned; None while the lane is not frozen.
    frozen_at: int | None = None
    #: Bytes that arrived beyond frozen_at (must stay 0).
    crossed: int = 0
    #: Rounds that froze while bytes were still on their way (the ones that test).
    in_flight: int = 0


@dataclass
class Report:
    seed: int
    decisions: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    crossed: int = 0
    #: Rounds that froze while bytes were still on their way (the ones that test).
    in_flight: int = 0

    def __str__(self) -> str:
        lines = [f"seed={self.seed}", *self.decisions[-12:], *self.violations[:12]]
        return "\n".join(lines)


def _writes(rng: random.Random, total: int) -> list[int]:
    sizes, left = [], total
    while left:
        n = min(left, int(math.exp(rng.uniform(0, math.log(MAX_WRITE)))))
        sizes.append(n)
        left -= n
    return sizes


async def _send(stream: trio.SocketStream, data: bytes, sizes: list[int]) -> None:
    view, i = memoryview(data), 0
    for n in sizes:
        await stream.send_all(view[i : i + n])
        i += n
    await stream.send_eof()


async def _receive(stream: trio.SocketStream, lane: Lane, report: Report, rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    while data := await stream.receive_some(rng.randint(1, 1 << 20)):
        lane.digest.update(data)
        lane.received += len(data)
        if lane.frozen_at is not None and lane.received > lane.frozen_at:
            over = lane.received - max(lane.frozen_at, lane.received - len(data))
            lane.crossed += over
            report.crossed += over
            report.violations.append(
                f"conn {lane.conn} {lane.stream}: {lane.received} bytes received, "
                f"{lane.frozen_at} counted when freeze() returned"
            )


def _counters(proxy) -> dict[tuple[int, str], int]:
    out = {}
    for c in proxy.connections():
        out[(c.id, "upstream")] = c.bytes_upstream
        out[(c.id, "downstream")] = c.bytes_downstream
    return out


async def _freezer(proxy, lanes: dict[tuple[int, str], Lane], rng: random.Random, report: Report):
    ids = sorted({conn for conn, _ in lanes})
    total = sum(len(lane.expected) for lane in lanes.values())
    for r in range(MAX_ROUNDS):
        done = sum(lane.received for lane in lanes.values())
        if done == total:
            break
        await trio.sleep(rng.choice((0, 0, rng.uniform(0, 0.003))))  # traffic flows between
        stream = rng.choice(("both", "upstream", "downstream"))
        only = None if rng.random() < 0.3 else sorted(rng.sample(ids, rng.randint(1, len(ids))))
        await proxy.freeze(stream, only=only)
        counted = _counters(proxy)  # no checkpoint since freeze() returned
        streams = ("upstream", "downstream") if stream == "both" else (stream,)
        frozen = [lanes[(i, s)] for i in (only or ids) for s in streams if (i, s) in counted]
        for lane in frozen:
            lane.frozen_at = counted[(lane.conn, lane.stream)]
            if lane.received > lane.frozen_at:
                report.violations.append(
                    f"conn {lane.conn} {lane.stream}: received {lane.received} > "
                    f"counted {lane.frozen_at} at freeze"
                )
        window = rng.uniform(0.01, 0.03) if rng.random() < 0.1 else rng.uniform(0, 0.002)
        done = sum(lane.received for lane in lanes.values())
        report.in_flight += done < total
        report.decisions.append(
            f"round {r}: freeze {stream} on {'all' if only is None else only} "
            f"for {window:.3f} s at {done} of {total} bytes"
        )
        await trio.sleep(window)  # the scenario: senders stream on into a frozen link
        now = _counters(proxy)
        for lane in frozen:
            moved = now.get((lane.conn, lane.stream), lane.frozen_at) - lane.frozen_at
            if moved:
                report.violations.append(
                    f"conn {lane.conn} {lane.stream}: counter moved by {moved} while frozen"
                )
        for lane in frozen:
            lane.frozen_at = None
        await proxy.thaw(stream, only=only)


async def run_freeze_stress(seed: int, toxics: bool = False, **proxy_kwargs) -> Report:
    """Run the scenario once through a fresh proxy; return what it saw (no asserts).
    *toxics*: a pass-through toxic on each stream, so every byte takes the toxic path."""
    rng = random.Random(seed)
    report = Report(seed)
    async with accept_server() as (addr, accepted), open_proxy(addr, **proxy_kwargs) as proxy:
        if toxics:
            proxy.add_toxic(PassThrough("p_up", "upstream"))
            proxy.add_toxic(PassThrough("p_down", "downstream"))
        pairs = []
        for _ in range(STREAMS):
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            pairs.append((client, server))
        ids = sorted(c.id for c in proxy.connections())
        assert len(ids) == STREAMS
        lanes: dict[tuple[int, str], Lane] = {}
        with trio.fail_after(RUN_BOUND_S):
            async with trio.open_nursery() as n:
                for conn, (client, server) in zip(ids, pairs, strict=True):
                    for stream, src, dst in (
                        ("upstream", client, server),
                        ("downstream", server, client),
                    ):
                        data = rng.randbytes(BYTES_PER_DIRECTION)
                        lane = lanes[(conn, stream)] = Lane(conn, stream, data)
                        n.start_soon(_send, src, data, _writes(rng, len(data)))
                        n.start_soon(_receive, dst, lane, report, rng.randrange(2**32))
                async with trio.open_nursery() as f:
                    f.start_soon(_freezer, proxy, lanes, random.Random(rng.random()), report)
            for client, server in pairs:
                await client.aclose()
                await server.aclose()
        for lane in lanes.values():
            if lane.received != len(lane.expected):
                report.violations.append(
                    f"conn {lane.conn} {lane.stream}: {lane.received} of "
                    f"{len(lane.expected)} bytes at EOF"
                )
            elif lane.digest.digest() != hashlib.sha256(lane.expected).digest():
                report.violations.append(f"conn {lane.conn} {lane.stream}: SHA-256 differs")
    return report


@pytest.mark.parametrize("plane", available_planes())
@pytest.mark.parametrize("path", ["splice", "copy", "copy+toxic"])
async def test_nothing_crosses_a_frozen_link_and_every_stream_arrives_intact(
    path: str, plane: str
) -> None:
    report = await run_freeze_stress(
        seed=14, toxics=path == "copy+toxic", splice=path == "splice", dataplane=plane
    )
    assert not report.violations, str(report)
    assert report.in_flight >= MIN_IN_FLIGHT, str(report)


# -- the breakages: the check goes red ---------------------------------------------------


def _reads_through_the_gate(self: PlaneLane) -> bool:
    # Lane.wants_read without its look at the gate.
    if self.eof_read or self.held is not None or self.piped:
        return False
    return not self.to_trio or self.inbox_bytes < dataplane._INBOX_BYTES


def _writes_through_the_gate(self: PlaneLane) -> bool:
    return self.held is not None or self.piped > 0


@pytest.mark.parametrize("splice", [True, False])
async def test_the_stress_check_goes_red_when_the_thread_skips_the_gate(
    monkeypatch, splice: bool
) -> None:
    """The forwarding thread reads and writes whatever the gates say: 12.8 MB (splice)
    and 18.9 MB (copy) crossed frozen links in a run here (seed 14)."""
    monkeypatch.setattr(PlaneLane, "wants_read", _reads_through_the_gate)
    monkeypatch.setattr(PlaneLane, "wants_write", _writes_through_the_gate)
    report = await run_freeze_stress(seed=14, dataplane="thread", splice=splice)
    assert report.crossed > 0, str(report)


#: A gate that always reads open: every look at it in the thread plane (the loop's
#: inlined common case, wants_read/wants_write, offer) passes; closing it does nothing.
_GATE_ALWAYS_OPEN = property(lambda self: True, lambda self, value: None)


async def test_the_stress_check_goes_red_when_the_thread_never_sees_a_closed_gate(
    monkeypatch,
) -> None:
    """The thread's common case reads the gate inline, not through wants_read: with
    every gate reading open, bytes cross frozen links (the patch above leaves that
    inlined look alone; this one takes every look away)."""
    monkeypatch.setattr(PlaneLane, "open", _GATE_ALWAYS_OPEN)
    report = await run_freeze_stress(seed=14, dataplane="thread", splice=False)
    assert report.crossed > 0, str(report)


def _unlocked_freeze(self: Link, streams) -> None:
    # Link.freeze without the lock: the gates close while the thread may be mid-syscall.
    for s in streams:
        self.lanes[s].open = False


@pytest.mark.skipif(
    not os.environ.get("FAULTNET_STRESS_UNLOCKED"),
    reason="a manual check (a race, now rare here): FAULTNET_STRESS_UNLOCKED=1",
)
async def test_the_stress_check_goes_red_when_freeze_skips_the_lock(monkeypatch) -> None:
    """A freeze that closes the gates without taking the plane's lock returns while the
    thread is inside a syscall (or a burst) of a lane it froze. Caught by a race, so
    this is a manual check, not a CI test: with seeds 14-16, copy and splice paths, 5 of
    9 runs went red, 72,979 / 160,835 / 300,432 bytes crossing and counters moving by
    up to 183,920 bytes while frozen (the toxic path writes from trio: never red).
    Run: ``FAULTNET_STRESS_UNLOCKED=1 pytest tests/faultnet/test_proxy_freeze_stress.py -k lock``.
    Later (issue 14, after the thread's loop was trimmed, and on the code before it
    alike) 0 of 6 runs went red: the race is rare here now. The deterministic check is
    planes/test_thread.py's test_the_write_check_goes_red_when_freeze_skips_the_lock.
    """
    monkeypatch.setattr(Link, "freeze", _unlocked_freeze)
    reports = []
    for seed in range(14, 22):  # bounded: red by the first few seeds here
        reports.append(await run_freeze_stress(seed=seed, dataplane="thread", splice=False))
        if reports[-1].crossed or reports[-1].violations:
            break
    assert reports[-1].violations, "\n".join(map(str, reports))


#: Microseconds the native core's debug switch sleeps between a gate's look and the
#: syscall: without it the core's locked sections are so short (and settle, which takes
#: the mutex, drains the sockets right before each freeze) that the race is rare here.
_WIDEN_US = 100


def _native_core_debugged(monkeypatch, unlocked: bool) -> None:
    make = native.Plane.__init__

    def debugged(self: native.Plane, splice: bool = True) -> None:
        make(self, splice)
        self._core.set_widen(_WIDEN_US)
        self._core.set_unlocked(unlocked)

    monkeypatch.setattr(native.Plane, "__init__", debugged)


@pytest.mark.skipif(not native.AVAILABLE, reason="the native core was not built")
@pytest.mark.parametrize("splice", [True, False])
async def test_the_native_core_with_its_race_widened_stays_total(monkeypatch, splice) -> None:
    """The control for the breakage below: the same widened race, the mutex kept, and
    nothing crosses (seeds 14-16, both paths: 0 of 6 runs red here)."""
    _native_core_debugged(monkeypatch, unlocked=False)
    report = await run_freeze_stress(seed=14, dataplane="native", splice=splice)
    assert not report.violations, str(report)


@pytest.mark.skipif(not native.AVAILABLE, reason="the native core was not built")
@pytest.mark.parametrize("splice", [True, False])
async def test_the_stress_check_goes_red_when_the_native_core_skips_its_mutex(
    monkeypatch, splice: bool
) -> None:
    """The breakage: the core's debug switch makes freeze and counts skip the mutex (and
    settle do nothing), so freeze() returns while the native thread is inside a lane's
    write or burst. Measured, seeds 14-16 x both paths: 5 of 6 runs red, 89-692 KB
    crossing frozen links and counters moving by up to 227 KB while frozen (the race
    not widened: 0 of 6 red with settle kept, 1 of 6 without). Bounded over seeds."""
    _native_core_debugged(monkeypatch, unlocked=True)
    reports = []
    for seed in range(14, 20):
        reports.append(await run_freeze_stress(seed=seed, dataplane="native", splice=splice))
        if reports[-1].violations:
            break
    assert reports[-1].violations, "\n".join(map(str, reports))
