"""Controls for the UDP fault modes: each proves one mode is the one in force.

Every control here talks to a UDP proxy whose upstream ECHOES datagrams (as
:func:`faultnet.testing.udp_echo_server` does), sends its own datagrams from one fresh
socket, and scores only what came back to that socket: it never compares two probes.
Each raises :class:`faultnet.controls.ControlFailed` saying what was expected and what
was seen, and each is proven to go red by ``faultnet proxy control-test`` and the tests.

* negative control: :func:`assert_udp_answering` (echoed intact, once, promptly);
* ``blackhole``: :func:`assert_udp_silent`; ``freeze``: :func:`assert_udp_held`
  (silent, then everything in order after the release);
* impairments: :func:`assert_udp_lossy`, :func:`assert_udp_delayed`,
  :func:`assert_udp_duplicated`, :func:`assert_udp_reordered`,
  :func:`assert_udp_truncated`, :func:`assert_udp_oversize_dropped`.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from faultnet.controls import ControlFailed, require_kind, watch_window
from faultnet.udp.probe import UdpProbeKind, UdpProbeResult, udp_probe

__all__ = [
    "assert_udp_answering",
    "assert_udp_delayed",
    "assert_udp_duplicated",
    "assert_udp_held",
    "assert_udp_lossy",
    "assert_udp_oversize_dropped",
    "assert_udp_reordered",
    "assert_udp_silent",
    "assert_udp_truncated",
]

Address = tuple[str, int]


def _numbered(count: int, size: int = 32) -> list[bytes]:
    """*count* distinct payloads of *size* bytes: 8-digit sequence number, a run tag,
    padding. The tag keeps a late reply to an earlier control out of this one."""
    tag = os.urandom(4).hex()
    return [f"{i:08d} {tag} ".encode().ljust(size, b".") for i in range(count)]


class _Exchange:
    """One fresh socket connected to the proxy; replies collected in arrival order."""

    def __init__(self, address: Address) -> None:
        self.address = address
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = trio.socket.socket(family, socket.SOCK_DGRAM)
        self.replies: list[tuple[float, bytes]] = []
        self.refused = False
        self.start = time.perf_counter()

    async def __aenter__(self) -> _Exchange:
        await self.sock.connect(self.address)
        self.start = time.perf_counter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.sock.close()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    async def send(self, payloads: Sequence[bytes]) -> None:
        for p in payloads:
            try:
                await self.sock.send(p)
            except ConnectionRefusedError:
                self.refused = True

    async def collect(self, window: float, until: Callable[[], bool] = lambda: False) -> None:
        """Receive until this process has run for *window* seconds, or until ``until()``
        holds after a reply.

        Run, not wall, time (:func:`faultnet.controls.watch_window`): after a stall of
        the whole process the window goes on, and what was due inside it arrives."""

        async def watch() -> None:
            while not until():
                try:
                    data = await self.sock.recv(65536)
                except ConnectionRefusedError:
                    self.refused = True
                    continue
                self.replies.append((self.elapsed, data))

        await watch_window(window, watch)

    def payloads(self) -> list[bytes]:
        return [data for _, data in self.replies]


def _fail(control: str, expected: str, seen: str, ex: _Exchange, hint: str = "") -> ControlFailed:
    return ControlFailed(control, expected, seen, ex.elapsed, hint)


async def assert_udp_answering(address: Address, timeout: float = 1.0) -> UdpProbeResult:
    """Negative control: one datagram comes back echoed intact within *timeout*."""
    result = await udp_probe(address, timeout)
    if result.kind is not UdpProbeKind.ANSWERED or not result.echoed:
        seen = result.kind.value if result.reply is None else f"{len(result.reply)} bytes back"
        hint = {
            UdpProbeKind.REFUSED: "ICMP port unreachable: nothing listens there",
            UdpProbeKind.SILENT: "datagrams are dropped or held: is a fault still in force?",
        }.get(result.kind, "the reply is not the datagram sent: it was altered on the way")
        raise ControlFailed("assert_udp_answering", "an intact echo", seen, result.elapsed_s, hint)
    return result


async def assert_udp_silent(address: Address, window: float = 0.3) -> float:
    """Positive control for blackhole: a datagram sent gets nothing back within
    *window* seconds (no echo, no ICMP error). Returns the seconds watched."""
    async with _Exchange(address) as ex:
        await ex.send(_numbered(1))
        await ex.collect(window, until=lambda: bool(ex.replies) or ex.refused)
        if ex.refused:
            raise _fail(
                "assert_udp_silent",
                f"silence for {window * 1000:.0f} ms",
                "ECONNREFUSED",
                ex,
                "ICMP port unreachable: nothing listens there, which is not a dropped datagram",
            )
        if ex.replies:
            raise _fail(
                "assert_udp_silent",
                f"silence for {window * 1000:.0f} ms",
                f"a reply after {ex.replies[0][0] * 1000:.1f} ms",
                ex,
                "datagrams still cross",
            )
        return ex.elapsed


async def assert_udp_held(
    address: Address,
    release: Callable[[], Awaitable[object]],
    window: float = 0.3,
    count: int = 3,
    timeout: float = 2.0,
) -> float:
    """Positive control for freeze: *count* numbered datagrams get nothing back for
    *window* seconds; then ``await release()`` (the thaw) and every one comes back, in
    the order sent, within *timeout*. Returns the seconds from release to the last."""
    sent = _numbered(count)
    async with _Exchange(address) as ex:
        await ex.send(sent)
        await ex.collect(window, until=lambda: bool(ex.replies))
        if ex.replies:
            raise _fail(
                "assert_udp_held",
                f"silence for {window * 1000:.0f} ms before the release",
                f"{len(ex.replies)} repl(ies) during the freeze",
                ex,
                "datagrams still cross: nothing is held",
            )
        t0 = time.perf_counter()
        await release()
        await ex.collect(timeout, until=lambda: len(ex.replies) >= count)
        got = ex.payloads()
        if got != sent:
            where = "none" if not got else f"{len(got)} of {count}"
            raise _fail(
                "assert_udp_held",
                f"all {count} datagrams, in order, after the release",
                f"{where}{' (out of order)' if sorted(got) == sent and got else ''}",
                ex,
                "the frozen datagrams were dropped, not held" if not got else "",
            )
        return time.perf_counter() - t0


def _loss_bounds(count: int, fraction: float) -> tuple[float, float]:
    # Four standard deviations of a binomial each side (plus one for rounding): a
    # correct proxy fails this about once in 16,000 runs.
    sd = math.sqrt(count * fraction * (1.0 - fraction))
    return count * fraction - 4 * sd - 1, count * fraction + 4 * sd + 1


async def assert_udp_lossy(
    address: Address,
    percent: float,
    count: int = 200,
    window: float = 1.0,
) -> float:
    """Positive control for loss: of *count* datagrams sent, the fraction whose echo
    never came back is *percent* (round trip) within four binomial standard deviations,
    and at least one was lost and one came back. Returns the observed loss percent."""
    fraction = percent / 100.0
    sent = _numbered(count)
    async with _Exchange(address) as ex:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.collect, window + 5.0, lambda: len(ex.replies) >= count)
            for i in range(0, count, 20):  # in bursts well inside a socket buffer
                await ex.send(sent[i : i + 20])
                await trio.lowlevel.checkpoint()
            await trio.sleep(window)
            nursery.cancel_scope.cancel()
        back = len(set(ex.payloads()) & set(sent))
        lost = count - back
        low, high = _loss_bounds(count, fraction)
        observed = 100.0 * lost / count
        if not (low <= lost <= high) or lost == 0 or back == 0:
            raise _fail(
                "assert_udp_lossy",
                f"{percent:g} % lost ({max(low, 1):.0f}-{high:.0f} of {count})",
                f"{lost} of {count} lost",
                ex,
                "nothing was lost: no loss in force"
                if lost == 0
                else "nothing came back: a dead route, not loss"
                if back == 0
                else "",
            )
        return observed


async def assert_udp_delayed(
    address: Address, min_ms: float, timeout: float = 2.0, tries: int = 3
) -> float:
    """Positive control for latency: *tries* datagrams, one after another, each echoed
    intact no sooner than *min_ms* milliseconds. Returns the quickest round trip in
    seconds.

    A delay in force is a floor, so one echo under it proves there is none, while a
    slow echo proves nothing (a loaded machine is slow too: one probe alone let a
    breakage pass in the suite at load ~10). So every echo must clear the floor, and
    the first that does not turns the control red."""
    quickest = float("inf")
    for _ in range(tries):
        result = await udp_probe(address, timeout)
        require_kind(
            "assert_udp_delayed",
            result,
            UdpProbeKind.ANSWERED,
            f"an echo after at least {min_ms:g} ms",
        )
        if result.elapsed_s * 1000.0 < min_ms:
            raise ControlFailed(
                "assert_udp_delayed",
                f"every echo after at least {min_ms:g} ms",
                f"an echo after {result.elapsed_s * 1000:.1f} ms",
                result.elapsed_s,
                "no delay in force",
            )
        quickest = min(quickest, result.elapsed_s)
    return quickest


async def assert_udp_duplicated(address: Address, window: float = 0.5) -> int:
    """Positive control for duplicate (at 100 %): one datagram sent, at least two
    identical echoes back within *window*. Returns how many came."""
    sent = _numbered(1)
    async with _Exchange(address) as ex:
        await ex.send(sent)
        await ex.collect(window)
        n = ex.payloads().count(sent[0])
        if n < 2:
            raise _fail(
                "assert_udp_duplicated",
                "two or more echoes of one datagram",
                f"{n} echo(es)",
                ex,
                "nothing is duplicated" if n == 1 else "",
            )
        return n


async def assert_udp_reordered(address: Address, count: int = 10, timeout: float = 2.0) -> int:
    """Positive control for reorder: *count* numbered datagrams sent back to back all
    come back, and not in the order sent. Returns how many arrived out of place."""
    sent = _numbered(count)
    async with _Exchange(address) as ex:
        await ex.send(sent)
        await ex.collect(timeout, until=lambda: len(ex.replies) >= count)
        got = ex.payloads()
        out_of_place = sum(a != b for a, b in zip(got, sent, strict=False))
        if sorted(got) != sent or out_of_place == 0:
            raise _fail(
                "assert_udp_reordered",
                f"all {count} back, out of order",
                f"{len(got)} back, {out_of_place} out of place",
                ex,
                "the order is kept: no reordering in force" if got == sent else "",
            )
        return out_of_place


async def assert_udp_truncated(address: Address, limit: int, timeout: float = 1.0) -> int:
    """Positive control for a truncating size limit: a datagram of ``limit + 100`` bytes
    comes back as exactly its first *limit* bytes. Returns the reply's size."""
    sent = _numbered(1, size=limit + 100)[0]
    result = await udp_probe(address, timeout, payload=sent)
    reply = result.reply
    if reply != sent[:limit]:
        seen = result.kind.value if reply is None else f"{len(reply)} bytes back"
        raise ControlFailed(
            "assert_udp_truncated",
            f"the first {limit} of {len(sent)} bytes",
            seen,
            result.elapsed_s,
            "nothing is truncated"
            if reply == sent
            else "the datagram was dropped, not truncated"
            if reply is None
            else "",
        )
    return len(reply)


async def assert_udp_oversize_dropped(address: Address, limit: int, window: float = 0.3) -> None:
    """Positive control for a dropping size limit: a datagram of *limit* bytes is echoed
    intact (the internal control), one of ``limit + 100`` gets nothing back in *window*."""
    small = _numbered(1, size=limit)[0]
    result = await udp_probe(address, 1.0, payload=small)
    if not result.echoed:
        raise ControlFailed(
            "assert_udp_oversize_dropped",
            f"a {limit}-byte datagram echoed intact",
            result.kind.value,
            result.elapsed_s,
            "small datagrams do not cross either: not a size limit",
        )
    big = _numbered(1, size=limit + 100)[0]
    result = await udp_probe(address, window, payload=big)
    if result.kind is not UdpProbeKind.SILENT:
        seen = result.kind.value if result.reply is None else f"{len(result.reply)} bytes back"
        raise ControlFailed(
            "assert_udp_oversize_dropped",
            f"silence for a {len(big)}-byte datagram",
            seen,
            result.elapsed_s,
            "oversize datagrams are truncated, not dropped"
            if result.reply is not None and len(result.reply) < len(big)
            else "no size limit in force"
            if result.echoed
            else "",
        )
