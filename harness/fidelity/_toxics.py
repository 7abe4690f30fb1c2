"""The toxics' rows: each toxic judged against what it promises, through a real proxy.

A toxic has no kernel twin here (this kernel has no netem), so a toxic's row holds it to
its own promise instead: the latency toxic's delay, the jitter's uniform spread, the
bandwidth's rate, the slicer's sizes and pauses, limit_data's byte count, the timeout's
and slow_close's times, toxicity's share. Each row of :data:`TOXIC_CASES` runs a real
client through a faultnet proxy (:class:`~harness.fidelity._world.ProxyThread`) to the
run's echo server on loopback, with the row's toxic on the stream the server sends
(``downstream``), measures once, and judges the sample twice: against what the toxic was
asked (it must hold) and against the row's breakage, a promise the toxic was not asked
(its delay doubled, another rate, ...), which must not: a judge that cannot tell the
two apart is no judge.

The bounds are CI's, not the bench's: each holds under the suite's own load (its
workers on two shared cores), stated with the distribution it was set from; the tight
figures (latency within asked + 0.3 ms, bandwidth within 0.97-1.03) are the bench's
targets (``scripts/bench``). No root: nothing here makes a kernel fault.

The HTTP toxics make faults a real server makes too, so theirs are pair rows (a
``reference``): the same real client (:mod:`harness.fidelity._http`: requests with
urllib3's Retry, aiohttp with aiohttp-retry) GETs a path once from nginx doing the fault
itself (:class:`~harness.fidelity._world.Nginx`: ``return 503``, an upstream that
closes mid-body or never answers, ``limit_rate``) and once through the toxic in front
of nginx serving that path whole; the two must end alike, after the same number of
requests (counted by nginx's access log and by the toxic), on as many connections
(nginx's log again, and the toxic's proxy: a client that keeps a connection alive
through nginx's fault must be able to through the toxic). A pair row's breakage is
measured: the toxic asked another thing (a 500, a cut past the body's end, twice the
rate, one request held instead of every one) must not end alike.
"""

from __future__ import annotations

import contextlib
import math
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from faultnet.toxics import TOXICS
from harness.fidelity._http import CLIENTS, same_outcome, same_pace
from harness.fidelity._observe import SHARE_Z, Verdict, classify
from harness.fidelity._world import (
    HOST,
    NGINX_BODY,
    NGINX_CUT_AT,
    NGINX_RATE,
    EchoServer,
    Nginx,
    ProxyThread,
    nginx_server,
    pattern,
)

__all__ = [
    "TOXIC_CASES",
    "ToxicCase",
    "ToxicRow",
    "ToxicServers",
    "ks_uniform",
    "run_toxic",
    "toxic_servers",
]

#: What a toxic was asked: its attributes, and its ``toxicity``.
Asked = Mapping[str, float]
#: A row's measurement: what its client saw (its shape is the row's own: round-trip
#: times, a rate, the sizes and times of reads, ...).
Sample = Mapping[str, Any]
#: How a sample is judged against what was asked: None when the promise is kept, else
#: what differs.
Promise = Callable[[Sample, Asked], "str | None"]


class Ports(NamedTuple):
    """Where a row's client connects: the proxy with the row's toxic, and a proxy to
    the same server with none (the matched arm); how many requests the toxic's rule
    has matched so far (an HTTP toxic's; 0 for any other), and how many connections
    the toxic's proxy has accepted."""

    toxic: int
    plain: int
    matched: Callable[[], int] = lambda: 0
    opened: Callable[[], int] = lambda: 0


class ToxicServers:
    """The servers the toxics' rows run against: the echo server, and nginx, started at
    its first use (only the HTTP rows need it), both closed with *stack*."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self.echo = EchoServer()
        stack.callback(self.echo.close)
        self._nginx: Nginx | None = None

    @property
    def nginx(self) -> Nginx:
        if self._nginx is None:
            self._nginx = self._stack.enter_context(nginx_server())
        return self._nginx

    def upstream(self, server: str) -> int:
        """The port a row's proxies forward to: the echo server's, or nginx's plain one."""
        return self.echo.port if server == "echo" else self.nginx.plain_port


#: How a row measures: given the proxies' ports and the servers behind them.
Workload = Callable[[Ports, ToxicServers], Sample]
#: How a pair row measures the real thing: its client against nginx doing the fault.
Reference = Callable[[ToxicServers], Sample]


@dataclass(frozen=True)
class ToxicCase:
    #: The row in words: the toxic and what the client does through it.
    name: str
    toxic: str
    attributes: Mapping[str, int]
    workload: Workload
    promise: Promise
    #: The breakages: the same sample judged as if the toxic had been asked each of
    #: these (merged over its attributes and toxicity); the judge must call each broken.
    breakages: tuple[Mapping[str, float], ...]
    toxicity: float = 1.0
    #: Samples taken at most: a row whose figure moves with the machine's load (a stall
    #: of the proxy's trio thread: one sample in 15 under load, measured) is measured
    #: again when a sample breaks the promise, and is red only when every sample does
    #: (two: about one in 200 at that load). The breakages judge the last sample.
    attempts: int = 1
    #: What the row's proxies forward to: ``echo`` (the run's echo server) or ``nginx``
    #: (its plain port, :class:`~harness.fidelity._world.Nginx`).
    server: str = "echo"
    #: A pair row (the HTTP toxics): the same client against nginx doing the fault
    #: itself, measured once. The row's sample is then ``{"nginx": that, "toxic": the
    #: workload's}``, its promise that the two are the same, and each breakage is
    #: measured, not only judged: the toxic asked that instead must not be the same.
    reference: Reference | None = None

    @property
    def asked(self) -> dict[str, float]:
        return {**self.attributes, "toxicity": self.toxicity}


class ToxicRow(NamedTuple):
    """A row's result: what was seen, the promise's verdict and each breakage's."""

    case: ToxicCase
    #: The figures the verdict was drawn from, in words.
    seen: str
    verdict: Verdict
    #: Each breakage's verdict (``same`` False: the judge told it apart).
    broken: tuple[Verdict, ...]

    def to_json(self) -> dict[str, Any]:
        return dict(
            row=self.case.name,
            asked=self.case.asked,
            seen=self.seen,
            kept=self.verdict.same,
            verdict=self.verdict.text,
            breakages=[v.text for v in self.broken],
        )


# -- the bounds (CI's: each measured under the suite's load; see the module's doc) --
# Measured here on 2 shared cores beside seven other agents' work (load average 4-11),
# 35-55 samples a row (the last 20 beside the TCP fidelity run, as CI's other worker
# would be), native plane, at 400f97a.

#: A latency row: the median over messages of the delay added (a message's round trip
#: through the toxic less its twin's through the plain proxy, sent the same moment) is
#: within [asked - LATENCY_UNDER_MS, asked + LATENCY_SLACK_MS]. Measured, latency 5 ms
#: every 10 ms: 5.56-5.81 ms in 54 samples of 55, and 15.5 ms in one (the toxic's trio
#: thread starved for most of the second; the plain arm, on the C plane, was not):
#: hence two attempts. Before each chunk carried its own read time (issue 32) every
#: 1 ms added 7.76-12.1 ms and every 100 us 13.8-23 ms, red under these bounds; after,
#: 6 runs at load ~3: 4.9-5.7 ms added at every pacing.
LATENCY_SLACK_MS, LATENCY_UNDER_MS = 1.5, 0.5
#: The jitter row: the Kolmogorov-Smirnov distance between the delays added and the
#: uniform spread asked, 10-90 ms. Measured: 0.054-0.158 in 28 samples (the 0.1 %
#: critical value for 120 draws is 1.95 / sqrt(120) = 0.178). Its breakages are far:
#: jitter 5 ms (uniform 45-55) is 0.44 away, none 0.5.
JITTER_KS_MAX = 0.22
#: Bandwidth: achieved / asked (the first piece waits its own transmission time, so a
#: short download is not flattered by a burst). Measured in 50 samples a rate: 100
#: KB/s 0.90-0.998, 1,000 KB/s 0.89-0.997, 10,000 KB/s 0.75-0.98 (one sample in 15
#: below 0.9 under load 6-9, none beside the suite alone). The breakages, half and
#: twice the rate, are 0.5 and 2.0.
BANDWIDTH_RATIO = (0.7, 1.05)
#: The slicer: the share of the client's reads whose size is within the asked
#: average +- variation (a late reader merges pieces; measured 0.64-1.0), and the median
#: pause between two reads within this share of ``delay`` either way (measured 994-1029
#: us for 1000 us in 50 samples, and 1404 us in one: a stall; hence two attempts).
SLICER_SIZE_SHARE, SLICER_GAP_TOLERANCE = 0.5, 0.3
#: timeout, slow_close and reset_peer: the end seen at least the time asked after its
#: start, and at most this much later. Measured for 300 ms in 50 samples each:
#: 0.300-0.339 s, and once 0.37 s and once 0.444 s.
CLOSE_SLACK_S = 0.25

# -- the clients --


def _connect(port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


FRAME = 64


def _stamp_echoes(s: socket.socket, stamps: list[float]) -> None:
    """Read *s*'s echoes of ``len(stamps)`` 64-byte messages; stamp each message's
    return time in *stamps* (a message never back keeps its NaN)."""
    got = 0
    with contextlib.suppress(OSError):
        while got < len(stamps) * FRAME:
            data = s.recv(65536)
            now = time.monotonic()
            if not data:
                return
            for i in range(got // FRAME, (got + len(data)) // FRAME):
                stamps[i] = now
            got += len(data)


def _paced(
    ports: Sequence[int], period_s: float, count: int, *, each: int = 1
) -> list[list[float]]:
    """Round-trip times of 64-byte messages sent every *period_s* on *each* connections
    to each of *ports*, *count* messages a port: tick *i* sends on connection *i* mod
    *each* of every port (back to back), on schedule whatever the replies (a steady
    stream, several in flight when the delay is longer than the period). A thread per
    connection reads the echoes and stamps each message's return. One list of times
    per port, in the order sent."""
    socks = [[_connect(port) for _ in range(each)] for port in ports]
    per = count // each
    sent = [0.0] * (per * each)
    back = [[[math.nan] * per for _ in range(each)] for _ in ports]

    readers = [
        threading.Thread(target=_stamp_echoes, args=(s, stamps), daemon=True)
        for conns, port_back in zip(socks, back, strict=True)
        for s, stamps in zip(conns, port_back, strict=True)
    ]
    for r in readers:
        r.start()
    try:
        _send_paced(socks, period_s, sent)
        for r in readers:
            r.join(count * period_s + 10)
    finally:
        for conns in socks:
            for s in conns:
                s.close()
        for r in readers:
            r.join(1)
    return _round_trips(sent, back)


def _send_paced(socks: list[list[socket.socket]], period_s: float, sent: list[float]) -> None:
    """Send ``len(sent)`` messages on *socks* (tick *i* on connection *i* mod *each* of
    every port, back to back) one every *period_s*, stamping each tick's time in *sent*."""
    t0 = time.monotonic()
    for i in range(len(sent)):
        wait = t0 + i * period_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the stream's own pace, not a synchronisation
        sent[i] = time.monotonic()
        for conns in socks:
            conns[i % len(conns)].sendall(b"m" * FRAME)


def _round_trips(sent: list[float], back: list[list[list[float]]]) -> list[list[float]]:
    """Each port's round-trip times in the order sent, from the send times and the
    return stamps per port and connection (RuntimeError if a message never came back)."""
    each, per = len(back[0]), len(back[0][0])
    times = [[port_back[i % each][i // each] for i in range(per * each)] for port_back in back]
    lost = sum(math.isnan(b) for stamps in times for b in stamps)
    if lost:
        raise RuntimeError(f"{lost} of {per * each * len(back)} messages never came back")
    return [[b - a for a, b in zip(sent, stamps, strict=False)] for stamps in times]


def _messages(period_s: float, count: int) -> Workload:
    """:func:`_paced` through the toxic and, tick by tick beside it, through the plain
    proxy: the matched arm whose round trips are the relay's own under the same load
    at the same moments (a stall of the machine falls on both)."""

    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        toxic, plain = _paced((ports.toxic, ports.plain), period_s, count)
        return {"rtts": toxic, "plain_rtts": plain}

    return workload


def _spread(count: int, each: int, period_s: float) -> Workload:
    """:func:`_messages` on *each* connections taking turns, so that a connection's
    messages are *each* x *period_s* apart: no message waits for the one ahead of it
    (the latency toxic keeps a connection's order), and every delay is its own draw."""

    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        toxic, plain = _paced((ports.toxic, ports.plain), period_s, count, each=each)
        return {"rtts": toxic, "plain_rtts": plain}

    return workload


def _download(port: int, n: int) -> tuple[float, list[tuple[float, int]], bytes]:
    """``GET n`` from the echo server: (seconds from the request to the last byte or
    EOF, each read's (time, size), the bytes)."""
    s = _connect(port, timeout=20)
    reads: list[tuple[float, int]] = []
    got = bytearray()
    try:
        t0 = time.monotonic()
        s.sendall(f"GET {n}\n".encode())
        while len(got) < n:
            data = s.recv(65536)
            if not data:
                break
            reads.append((time.monotonic(), len(data)))
            got += data
        return time.monotonic() - t0, reads, bytes(got)
    finally:
        s.close()


def _rate(kb_per_s: int, seconds: float) -> Workload:
    """One download of what *kb_per_s* moves in *seconds*: its achieved rate."""
    n = int(kb_per_s * 1000 * seconds)

    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        port = ports.toxic
        took, _, got = _download(port, n)
        if len(got) != n:
            raise RuntimeError(f"the download ended at {len(got)} of {n} bytes")
        return {"kb_per_s": n / took / 1000, "bytes": n, "seconds": took}

    return workload


def _slices(n: int) -> Workload:
    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        port = ports.toxic
        _, reads, got = _download(port, n)
        if got != pattern(n):
            raise RuntimeError("the slices do not add up to the bytes sent")
        times = [t for t, _ in reads]
        return {
            "sizes": [size for _, size in reads],
            "gaps": [b - a for a, b in zip(times, times[1:], strict=False)],
        }

    return workload


def _until_eof(n: int) -> Workload:
    """Ask for *n* bytes; read until the connection ends."""

    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        port = ports.toxic
        s = _connect(port, timeout=10)
        got = bytearray()
        try:
            s.sendall(f"GET {n}\n".encode())
            with contextlib.suppress(ConnectionResetError):
                while data := s.recv(65536):
                    got += data
        finally:
            s.close()
        return {"bytes": len(got), "intact": bytes(got) == pattern(len(got))}

    return workload


def _await_end(s: socket.socket, bound: float) -> tuple[float, int, str]:
    """Read until the connection ends: (when, bytes read, ``EOF`` or the errno's name)."""
    s.settimeout(bound)
    got = 0
    try:
        while data := s.recv(65536):
            got += len(data)
    except OSError as exc:
        return time.monotonic(), got, classify(exc)
    return time.monotonic(), got, "EOF"


def _message_then_end(ports: Ports, servers: ToxicServers) -> Sample:
    """A message sent on a fresh connection; the time from the connect to the end of
    the connection, how it ended, and what came back before it.

    Timed from before the connect: the proxy starts the toxic's clock when it accepts,
    which can come before this thread runs again after connect() returns (CI read 0.2999
    s of a 300 ms reset_peer that way), so a clock read after it can miss part of the
    wait; read before it, the time is never short, and longer by the connect at most."""
    t0 = time.monotonic()
    s = _connect(ports.toxic)
    try:
        s.sendall(b"m" * FRAME)
        t1, got, how = _await_end(s, 10)
        return {"seconds": t1 - t0, "bytes": got, "how": how}
    finally:
        s.close()


def _server_closes(ports: Ports, servers: ToxicServers) -> Sample:
    """A round trip, then the server closes (FIN): the time until the client's EOF."""
    s = _connect(ports.toxic)
    try:
        s.sendall(b"m" * FRAME)
        got = 0
        while got < FRAME:
            got += len(s.recv(65536))
        t0 = time.monotonic()
        servers.echo.close_connections()
        t1, after, how = _await_end(s, 10)
        return {"seconds": t1 - t0, "bytes": after, "how": how}
    finally:
        s.close()


def _connections(count: int) -> Workload:
    """*count* fresh connections, one message each: how many were echoed (the others
    met the toxic: limit_data at 0 bytes closes at the first byte)."""

    def workload(ports: Ports, servers: ToxicServers) -> Sample:
        port = ports.toxic
        echoed = 0
        for _ in range(count):
            s = _connect(port)
            try:
                s.sendall(b"m" * FRAME)
                echoed += _read_up_to(s, FRAME) >= FRAME
            finally:
                s.close()
        return {"tries": count, "met": count - echoed}

    return workload


def _read_up_to(s: socket.socket, n: int) -> int:
    """Read until *n* bytes, EOF or an error: the bytes read."""
    s.settimeout(5)
    got = 0
    with contextlib.suppress(OSError):
        while got < n:
            data = s.recv(65536)
            if not data:
                break
            got += len(data)
    return got


def _http_get(client: str, path: str, read_timeout: float) -> tuple[Workload, Reference]:
    """A pair row's two measurements: *client*'s GET of *path* (read timeout
    *read_timeout* s) through the toxic, its requests counted by the toxic and its
    connections by the toxic's proxy; and the same GET from nginx doing the fault
    itself, both counted by nginx."""
    get = CLIENTS[client]

    def through_toxic(ports: Ports, servers: ToxicServers) -> Sample:
        requests, connections = ports.matched(), ports.opened()
        seen = get(f"http://{HOST}:{ports.toxic}{path}", read_timeout)
        return {
            **seen,
            "requests": ports.matched() - requests,
            "connections": ports.opened() - connections,
        }

    def from_nginx(servers: ToxicServers) -> Sample:
        nginx = servers.nginx
        before = nginx.served(path)
        seen = get(f"http://{HOST}:{nginx.fault_port}{path}", read_timeout)
        after = nginx.served(path)
        return {
            **seen,
            "requests": after.requests - before.requests,
            "connections": after.connections - before.connections,
        }

    return through_toxic, from_nginx


#: The read timeout of the hold rows' clients: each of their 4 requests waits this long.
HOLD_READ_TIMEOUT_S = 0.4
#: Every other pair row's: longer than anything the rows make a client wait for.
READ_TIMEOUT_S = 5.0


def _against_nginx(
    toxic: str,
    attributes: Mapping[str, int],
    path: str,
    nginx_does: str,
    breakages: tuple[Mapping[str, float], ...],
    promise: Promise = same_outcome,
    read_timeout: float = READ_TIMEOUT_S,
) -> tuple[ToxicCase, ...]:
    """A pair row for each client of :data:`CLIENTS`: *toxic* asked *attributes* in
    front of nginx serving *path* whole, against nginx doing the fault on *path*
    itself (*nginx_does*, in words)."""
    asked = " ".join(f"{k} {v}" for k, v in attributes.items())
    rows = []
    for client in CLIENTS:
        workload, reference = _http_get(client, path, read_timeout)
        rows.append(
            ToxicCase(
                f"{toxic} {asked}".strip() + f", {client}: against nginx {nginx_does}",
                toxic,
                attributes,
                workload,
                promise,
                breakages,
                server="nginx",
                reference=reference,
            )
        )
    return tuple(rows)


# -- the promises --


def ks_uniform(values: Sequence[float], low: float, high: float) -> float:
    """The Kolmogorov-Smirnov distance between *values* and the uniform distribution on
    [*low*, *high*] (a point mass at *low* when they are equal): the largest gap between
    their empirical distribution function and the uniform's, each side of every value.
    Written here: scipy is not a dependency, and this is a dozen lines."""
    xs = sorted(values)
    n = len(xs)
    span = high - low

    def cdf(x: float, left: bool = False) -> float:
        if span <= 0:  # the point mass: its function steps from 0 to 1 at *low*
            return 1.0 if x > low or (x == low and not left) else 0.0
        return min(1.0, max(0.0, (x - low) / span))

    return max(max((i + 1) / n - cdf(x), cdf(x, left=True) - i / n) for i, x in enumerate(xs))


def _p50_delay(sample: Sample, asked: Asked) -> str | None:
    added = [(t - p) * 1000 for t, p in zip(sample["rtts"], sample["plain_rtts"], strict=True)]
    p50 = statistics.median(added)
    low, high = asked["latency"] - LATENCY_UNDER_MS, asked["latency"] + LATENCY_SLACK_MS
    if not low <= p50 <= high:
        return f"p50 added {p50:.2f} ms, not within {low:g}-{high:g} ms"
    return None


def _uniform_delays(sample: Sample, asked: Asked) -> str | None:
    delays = [(t - p) * 1000 for t, p in zip(sample["rtts"], sample["plain_rtts"], strict=True)]
    low, high = asked["latency"] - asked["jitter"], asked["latency"] + asked["jitter"]
    d = ks_uniform(delays, low, high)
    if d > JITTER_KS_MAX:
        return f"KS distance {d:.3f} from uniform {low:g}-{high:g} ms, above {JITTER_KS_MAX}"
    return None


def _achieved_rate(sample: Sample, asked: Asked) -> str | None:
    ratio = sample["kb_per_s"] / asked["rate"]
    lo, hi = BANDWIDTH_RATIO
    if not lo <= ratio <= hi:
        return f"achieved/asked {ratio:.3f}, not within {lo}-{hi}"
    return None


def _slice_sizes_and_gaps(sample: Sample, asked: Asked) -> str | None:
    low = asked["average_size"] - asked["size_variation"]
    high = asked["average_size"] + asked["size_variation"]
    sizes = sample["sizes"]
    share = sum(1 for n in sizes if low <= n <= high) / len(sizes)
    if share < SLICER_SIZE_SHARE:
        return f"{share:.0%} of reads {low:g}-{high:g} bytes, under {SLICER_SIZE_SHARE:.0%}"
    gap = statistics.median(sample["gaps"]) * 1e6
    want = asked["delay"]
    if abs(gap - want) > SLICER_GAP_TOLERANCE * want:
        return f"median pause {gap:.0f} us, not {want:g} us +- {SLICER_GAP_TOLERANCE:.0%}"
    return None


def _exact_bytes(sample: Sample, asked: Asked) -> str | None:
    if sample["bytes"] != asked["bytes"] or not sample["intact"]:
        return f"{sample['bytes']} bytes (intact: {sample['intact']}), not {asked['bytes']:g}"
    return None


def _ended_after(attribute: str, how: str, through: int = 0) -> Promise:
    """The connection ended *how* (``EOF``, ``ECONNRESET``) *attribute* ms after its
    start (within :data:`CLOSE_SLACK_S`), *through* bytes let through meanwhile."""

    def promise(sample: Sample, asked: Asked) -> str | None:
        want = asked[attribute] / 1000
        if sample["how"] != how:
            return f"ended by {sample['how']}, not {how}"
        if sample["bytes"] != through:
            return f"{sample['bytes']} bytes came through before the end, not {through}"
        if not want <= sample["seconds"] <= want + CLOSE_SLACK_S:
            return (
                f"ended after {sample['seconds']:.3f} s, not within"
                f" {want:g}-{want + CLOSE_SLACK_S:g} s"
            )
        return None

    return promise


def _binomial_share(sample: Sample, asked: Asked) -> str | None:
    n, k, p = sample["tries"], sample["met"], asked["toxicity"]
    bound = SHARE_Z * math.sqrt(n * p * (1 - p))
    if abs(k - n * p) > bound:
        return f"{k} of {n} met the toxic, not {n * p:g} +- {bound:.1f}"
    return None


# -- the table --

#: One row a promise: the toxic and its attributes, the client, the promise, and the
#: breakage (what the same sample is judged as, and must fail).
TOXIC_CASES: tuple[ToxicCase, ...] = (
    *(
        ToxicCase(
            f"latency 5 ms; a 64-byte message every {every}: p50 delay added",
            "latency",
            {"latency": 5},
            _messages(period, count),
            _p50_delay,
            ({"latency": 10}, {"latency": 2.5}),
            attempts=2,
        )
        for every, period, count in (
            ("10 ms", 0.010, 100),
            ("1 ms", 0.001, 500),
            ("100 us", 0.0001, 2000),
        )
    ),
    ToxicCase(
        "latency 50 ms, jitter 40 ms; 8 connections in turn, a message every 12 ms:"
        " delays uniform on 10-90 ms (KS)",
        "latency",
        {"latency": 50, "jitter": 40},
        _spread(120, 8, 0.012),
        _uniform_delays,
        ({"jitter": 5}, {"jitter": 0}),
        attempts=2,
    ),
    *(
        ToxicCase(
            f"bandwidth {rate:,} KB/s; one download of {rate * 0.5:,g} KB: achieved / asked",
            "bandwidth",
            {"rate": rate},
            _rate(rate, 0.5),
            _achieved_rate,
            ({"rate": rate * 2}, {"rate": rate // 2}),
            attempts=2,
        )
        for rate in (100, 1_000, 10_000)
    ),
    ToxicCase(
        "slicer 64 +- 16 bytes, 1000 us apart; a 12,800-byte download: reads and pauses",
        "slicer",
        {"average_size": 64, "size_variation": 16, "delay": 1000},
        _slices(12_800),
        _slice_sizes_and_gaps,
        ({"average_size": 128}, {"delay": 2000}, {"delay": 500}),
        attempts=2,
    ),
    *(
        ToxicCase(
            f"limit_data {n:,} bytes; a download of {3 * n:,}: bytes before the close",
            "limit_data",
            {"bytes": n},
            _until_eof(3 * n),
            _exact_bytes,
            ({"bytes": n + 1}, {"bytes": n - 1}),
        )
        for n in (10_000, 100_003)
    ),
    ToxicCase(
        "timeout 300 ms; a message on a fresh connection: silence, then the close (FIN)",
        "timeout",
        {"timeout": 300},
        _message_then_end,
        _ended_after("timeout", "EOF"),
        ({"timeout": 600},),
    ),
    ToxicCase(
        "slow_close 300 ms; the server closes after a round trip: the client's EOF",
        "slow_close",
        {"delay": 300},
        _server_closes,
        _ended_after("delay", "EOF"),
        ({"delay": 600}, {"delay": 0}),
    ),
    ToxicCase(
        "reset_peer 300 ms; a message on a fresh connection: its echo, then the reset",
        "reset_peer",
        {"timeout": 300},
        _message_then_end,
        _ended_after("timeout", "ECONNRESET", through=FRAME),
        ({"timeout": 600}, {"timeout": 0}),
    ),
    # The share's bound is the binomial's (SHARE_Z deviations: 50 +- 16.4 of 100);
    # measured: 38-62 met in 67 samples. The breakages' bounds, 10 +- 9.9 and 90 +- 9.9,
    # are 18 beyond the nearest measured (0.25 and 0.75 were tried first: 62 met
    # fell inside 0.75's bound once).
    ToxicCase(
        "toxicity 0.5 (limit_data 0); 100 connections, a message each: the share met",
        "limit_data",
        {"bytes": 0},
        _connections(100),
        _binomial_share,
        ({"toxicity": 0.1}, {"toxicity": 0.9}),
        toxicity=0.5,
    ),
    # The HTTP toxics, each against nginx doing the same fault (the pair rows): the same
    # client sees the same outcome after the same number of requests, on as many connections.
    *_against_nginx("http_abort", {"status": 503}, "/abort", "`return 503`", ({"status": 500},)),
    *_against_nginx(
        "http_truncate",
        {"bytes": NGINX_CUT_AT},
        "/cut",
        "proxying an upstream that closes mid-body",
        ({"bytes": 2 * NGINX_BODY},),
    ),
    *_against_nginx(
        "http_reset",
        {"bytes": NGINX_CUT_AT},
        "/cut",
        "proxying an upstream that closes mid-body",
        ({"bytes": 2 * NGINX_BODY},),
    ),
    *_against_nginx(
        "http_slow_body",
        {"rate": NGINX_RATE},
        "/slow",
        "`limit_rate`",
        ({"rate": 2 * NGINX_RATE},),
        same_pace,
    ),
    *_against_nginx(
        "http_hold",
        {},
        "/hang",
        "proxying an upstream that never answers",
        ({"count": 1},),
        read_timeout=HOLD_READ_TIMEOUT_S,
    ),
)


# -- running a row --


@contextlib.contextmanager
def toxic_servers() -> Iterator[ToxicServers]:
    with contextlib.ExitStack() as stack:
        yield ToxicServers(stack)


def run_toxic(case: ToxicCase, servers: ToxicServers) -> ToxicRow:
    """Measure *case* through a fresh proxy with its toxic to its server (again, up to
    its ``attempts``, while a sample breaks the promise); judge it, and its breakages
    (a pair row's measured afresh, each against the same reference sample)."""
    real = case.reference(servers) if case.reference is not None else None
    for _ in range(case.attempts):
        sample = _measure(case, servers, case.attributes, real)
        why = case.promise(sample, case.asked)
        if why is None:
            break
    if real is None:
        broken = [case.promise(sample, {**case.asked, **b}) for b in case.breakages]
    else:
        broken = [
            case.promise(_measure(case, servers, {**case.attributes, **b}, real), case.asked)
            for b in case.breakages
        ]
    return ToxicRow(
        case,
        _seen(sample),
        Verdict(why is None, why or "kept"),
        tuple(Verdict(b is None, b or "kept: the breakage was not told apart") for b in broken),
    )


def _measure(
    case: ToxicCase,
    servers: ToxicServers,
    attributes: Mapping[str, float],
    real: Sample | None = None,
) -> Sample:
    """One sample of *case* with its toxic asked *attributes*: its workload through a
    fresh proxy with the toxic, beside a fresh proxy without it; a pair row's beside
    *real*, its reference's sample."""
    upstream = servers.upstream(case.server)
    with contextlib.ExitStack() as stack:
        proxy, plain = ProxyThread(upstream), ProxyThread(upstream)
        stack.callback(proxy.close)
        stack.callback(plain.close)
        asked: dict[str, Any] = dict(attributes)
        toxicity = asked.pop("toxicity", case.toxicity)
        toxic = TOXICS[case.toxic](stream="downstream", toxicity=toxicity, **asked)
        proxy.call_sync("add_toxic", toxic)
        ports = Ports(
            proxy.port, plain.port, lambda: int(getattr(toxic, "matched", 0)), proxy.opened
        )
        sample = case.workload(ports, servers)
    return sample if real is None else {"nginx": real, "toxic": sample}


def _seen(sample: Sample) -> str:
    """A sample in words: each figure, a list by its median (times in ms); a pair row's
    two samples each in turn."""
    parts = []
    for key, value in sample.items():
        if isinstance(value, Mapping):
            parts.append(f"{key}: {_seen(value)}")
        elif isinstance(value, list):
            if key.endswith(("rtts", "gaps")):
                parts.append(f"{key} p50 {statistics.median(value) * 1000:.3g} ms")
            else:
                parts.append(f"{key} p50 {statistics.median(value):.4g}")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        else:
            parts.append(f"{key} {value}")
    return ("; " if any(isinstance(v, Mapping) for v in sample.values()) else ", ").join(parts)
