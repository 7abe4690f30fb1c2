"""Controls: assertions that a fault (or its absence) is the one in force.

Each control scores its OWN single probe or transfer; none compares two probes, because
two connects can land on different port states. Each raises :class:`ControlFailed`
saying what was expected, what was seen, and how long it took; each is proven to go red
by ``faultnet proxy control-test`` and the tests, which break the mode it guards.

* negative control: :func:`assert_accepting` (a HEALTHY port);
* positive controls: :func:`assert_syn_dropped`, :func:`assert_syn_lossy`,
  :func:`assert_refusing` (new connections), :func:`assert_frozen`,
  :func:`assert_blackholed`, :func:`assert_severed`, :func:`assert_reset`,
  :func:`assert_lossy` (a live connection), :func:`assert_partitioned` (both);
* :func:`syn_retry_schedule`: when the running kernel retries a dropped SYN, and when a
  connect gives up (what ``assert_syn_lossy`` and the ``syn_loss`` docs rest on).

The stream controls take trio streams (``trio.SocketStream``): ``assert_frozen`` writes
through one and watches another (pass the same echo stream twice when the far end
echoes); ``assert_severed``/``assert_reset``/``assert_blackholed`` read one.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import trio

from faultnet.probe import Outcome, ProbeKind, ProbeResult, probe
from faultnet.sockopts import set_keepalive, tcp_retransmits_needed
from faultnet.testing import read_exactly

__all__ = [
    "ControlFailed",
    "assert_accepting",
    "assert_blackholed",
    "assert_frozen",
    "assert_lossy",
    "assert_lossy_route",
    "assert_partitioned",
    "assert_refusing",
    "assert_reset",
    "assert_severed",
    "assert_syn_dropped",
    "assert_syn_lossy",
]
# __all__ is the controls alone (tests/faultnet/test_modes.py holds it to the mode
# table); syn_retry_schedule and SynRetrySchedule are public here by name.


class ControlFailed(AssertionError):
    """A control saw something other than what it guards."""

    def __init__(
        self, control: str, expected: str, seen: str, elapsed_s: float, hint: str = ""
    ) -> None:
        msg = f"{control}: expected {expected}, saw {seen} after {elapsed_s * 1000:.1f} ms"
        if hint:
            msg += f" -- {hint}"
        super().__init__(msg)
        self.control = control
        self.expected = expected
        self.seen = seen
        self.elapsed_s = elapsed_s


def require_kind(
    control: str, result: Outcome[Any], want: StrEnum, expected: str, hint: str = ""
) -> None:
    """Raise :class:`ControlFailed` for *control* unless the probe *result* (TCP's or
    UDP's) is of kind *want*: it says *expected*, the kind that came instead, its time,
    and *hint*. Shared by the TCP and the UDP controls; not a control itself, so not in
    ``__all__``."""
    if result.kind is not want:
        raise ControlFailed(control, expected, result.kind.value, result.elapsed_s, hint)


_HINTS = {
    (ProbeKind.HUNG, ProbeKind.REFUSED): (
        "the port REFUSES: the listener is closed, which is not a dropped SYN "
        "(a refused connect fails in microseconds; a dropped SYN hangs)"
    ),
    (ProbeKind.HUNG, ProbeKind.CONNECTED): (
        "the handshake completed: SYNs are not dropped (a paused accept loop with a "
        "normal backlog still lets the kernel complete handshakes)"
    ),
    (ProbeKind.REFUSED, ProbeKind.HUNG): "connects hang: SYNs are dropped, not refused",
    (ProbeKind.REFUSED, ProbeKind.CONNECTED): "the port is still listening",
    (ProbeKind.CONNECTED, ProbeKind.HUNG): "SYNs are dropped: is drop_syn still in force?",
    (ProbeKind.CONNECTED, ProbeKind.REFUSED): "nothing listens: is refuse still in force?",
}


async def _expect(
    name: str, address: tuple[str, int], want: ProbeKind, timeout: float
) -> ProbeResult:
    result = await probe(address, timeout)
    require_kind(
        name, result, want, want.value, _HINTS.get((want, result.kind), result.error or "")
    )
    return result


async def assert_accepting(address: tuple[str, int], timeout: float = 2.0) -> ProbeResult:
    """Negative control: one fresh connect completes within *timeout*."""
    return await _expect("assert_accepting", address, ProbeKind.CONNECTED, timeout)


async def assert_syn_dropped(address: tuple[str, int], timeout: float = 1.0) -> ProbeResult:
    """Positive control for drop_syn: one fresh connect HANGS for all of *timeout*.

    Merely refused is a specific, loud failure: it is the most common way a "blackhole"
    turns out to be a closed port.
    """
    return await _expect("assert_syn_dropped", address, ProbeKind.HUNG, timeout)


async def assert_refusing(address: tuple[str, int], timeout: float = 1.0) -> ProbeResult:
    """Positive control for refuse: one fresh connect is refused within *timeout*."""
    return await _expect("assert_refusing", address, ProbeKind.REFUSED, timeout)


#: The step of a watched window (:func:`watch_window`): a step the process overslept
#: counts as twice this.
WATCH_STEP_S = 0.01


async def watch_window(window: float, watch: Callable[[], Awaitable[object]]) -> None:
    """Run *watch* until it returns, or until this process has run for *window* seconds
    (it is cancelled then, and restarted after each step of :data:`WATCH_STEP_S`: it
    must be safe to cancel, as a trio socket's receive is).

    Run, not wall, time: a step the process overslept counts as two steps. A loaded
    machine stalls a whole process (a 300 ms window ran 385 ms, stress-ng on both
    CPUs); a plain deadline then expires in the same pass as the proxy's own tasks
    (when the proxy runs in this process, as in the control test), before what was due
    in the window could run, and a silence control passed a breakage: a UDP reply
    delayed 20 ms, a TCP link that still forwards (tests/faultnet/test_controls.py stalls
    the loop 400 ms to show it). Counted this way, the window goes on after a stall.
    Without a stall it is the same window in wall time."""
    ran = 0.0
    while ran < window:
        step = min(WATCH_STEP_S, window - ran)
        t0 = trio.current_time()
        with trio.move_on_after(step):
            await watch()
            return
        ran += min(trio.current_time() - t0, 2 * step)


async def assert_frozen(
    writer: trio.abc.SendStream,
    reader: trio.abc.ReceiveStream,
    window: float = 0.3,
    payload: bytes = b"faultnet frozen probe\n",
) -> None:
    """Positive control for freeze: *payload* written to *writer* produces nothing at
    *reader* within *window* seconds: no byte, no EOF, no error. The window is the time
    this process ran (:func:`watch_window`): a stall does not shorten it.

    The write itself must succeed (a frozen link accepts writes until buffers fill).
    """
    start = time.perf_counter()
    try:
        await writer.send_all(payload)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise ControlFailed(
            "assert_frozen",
            "the write to be accepted",
            f"the write failing ({exc.__cause__ or exc})",
            time.perf_counter() - start,
        ) from None

    async def watch() -> None:
        try:
            data = await reader.receive_some(65536)
        except trio.BrokenResourceError as exc:
            raise ControlFailed(
                "assert_frozen",
                "silence",
                f"an error ({exc.__cause__})",
                time.perf_counter() - start,
            ) from None
        seen = f"{len(data)} bytes arriving" if data else "EOF"
        raise ControlFailed(
            "assert_frozen",
            f"silence for {window * 1000:.0f} ms",
            seen,
            time.perf_counter() - start,
            "the link still forwards" if data else "a close got through",
        )

    await watch_window(window, watch)


async def _read_outcome(stream: trio.abc.ReceiveStream, timeout: float) -> tuple[str, float]:
    """Read until something ends the stream: 'eof', 'reset', 'timedout', 'error: ...',
    or 'nothing' (the timeout passed). Data before the end is skipped."""
    start = time.perf_counter()
    with trio.move_on_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
            return "eof", time.perf_counter() - start
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            code = getattr(cause, "errno", None)
            if code == errno.ECONNRESET:
                return "reset", time.perf_counter() - start
            if code == errno.ETIMEDOUT:
                return "timedout", time.perf_counter() - start
            return f"error ({cause})", time.perf_counter() - start
    return "nothing", time.perf_counter() - start


async def _expect_end(
    name: str, stream: trio.abc.ReceiveStream, timeout: float, want: str, expected: str
) -> float:
    # Read until the stream ends; the end must be *want* ('eof' or 'reset').
    outcome, elapsed = await _read_outcome(stream, timeout)
    if outcome != want:
        confused = {"reset": "a reset is not a sever", "eof": "a clean close is not a reset"}
        raise ControlFailed(name, expected, outcome, elapsed, confused.get(outcome, ""))
    return elapsed


async def assert_severed(stream: trio.abc.ReceiveStream, timeout: float = 1.0) -> float:
    """Positive control for sever: reading *stream* ends in a clean EOF within *timeout*
    (not a reset, not a hang). Returns the seconds it took."""
    return await _expect_end("assert_severed", stream, timeout, "eof", "EOF (a clean FIN)")


async def assert_reset(stream: trio.abc.ReceiveStream, timeout: float = 1.0) -> float:
    """Positive control for reset: reading *stream* fails with ECONNRESET within
    *timeout*. Returns the seconds it took."""
    return await _expect_end("assert_reset", stream, timeout, "reset", "ECONNRESET (an RST)")


async def assert_blackholed(stream: trio.SocketStream, timeout: float = 6.0) -> float:
    """Positive control for blackhole: with TCP keepalive at 1 s idle, 1 s interval and
    2 probes, the client's own TCP declares the route dead (ETIMEDOUT) within *timeout*.

    Under a mere freeze the proxy's kernel still answers keepalive probes, so this goes
    red there: that is the difference between the two modes. Returns the seconds taken.
    """
    set_keepalive(stream.socket, idle_s=1, interval_s=1, count=2)
    outcome, elapsed = await _read_outcome(stream, timeout)
    if outcome != "timedout":
        raise ControlFailed(
            "assert_blackholed",
            "ETIMEDOUT from the client's keepalive",
            outcome,
            elapsed,
            "the proxy's kernel still answers: frozen, not blackholed"
            if outcome == "nothing"
            else "",
        )
    return elapsed


#: Needed retransmits (faultnet.sockopts.tcp_retransmits_needed) a lossy transfer must
#: exceed a loss-free one's by: with no loss, a tail-loss probe the peer already had is
#: now and then not reported back as a duplicate (one segment, in 2 of 240 16 MiB
#: transfers).
LOSS_MARGIN = 3


async def _echo_transfer(stream: trio.SocketStream, size: int) -> int:
    """Send *size* random bytes through an echoing *stream* while reading them back;
    return the segments the stream's own socket retransmitted meanwhile that the peer
    lacked (spurious retransmits, which reordering causes, are not loss). Raises
    ControlFailed if the bytes come back altered or short."""
    data = os.urandom(size)
    before = tcp_retransmits_needed(stream.socket)
    got = bytearray()

    async def send() -> None:
        view = memoryview(data)
        for i in range(0, size, 1 << 20):
            await stream.send_all(view[i : i + (1 << 20)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while len(got) < size:
            chunk = await stream.receive_some(1 << 20)
            if not chunk:
                break
            got += chunk
    if bytes(got) != data:
        raise ControlFailed(
            "assert_lossy", f"{size} bytes echoed intact", f"{len(got)} bytes, altered", 0.0
        )
    return tcp_retransmits_needed(stream.socket) - before


async def assert_lossy(
    stream: trio.SocketStream,
    address: tuple[str, int],
    size: int = 8 << 20,
    timeout: float = 30.0,
    margin: int = LOSS_MARGIN,
) -> tuple[int, int]:
    """Positive control for loss (on the upstream stream, or both): *size* bytes echoed
    through *stream* arrive intact, and the client's own TCP retransmitted more than
    *margin* segments the proxy lacked (tcp_retransmits_needed) above a no-loss
    baseline: the same transfer on a fresh connection to *address* made here, which a
    loss applied earlier does not touch. The kernel's random cannot be seeded, so this
    scores what happened, not what was asked. Returns (baseline retransmits, retransmits
    under loss), both counting only the needed ones.

    It proves one-way loss (the client's segments dropped on arrival). Under
    ``loss(both_ways=True)`` the client's own TCP loses nothing (the proxy's internal
    hop loses and resends), so this control stays red there: :func:`assert_lossy_route`
    is that variant's control."""
    start = time.perf_counter()
    try:
        with trio.fail_after(timeout):
            fresh = await trio.open_tcp_stream(*address)
            async with fresh:
                baseline = await _echo_transfer(fresh, size)
            lossy = await _echo_transfer(stream, size)
    except trio.TooSlowError:
        raise ControlFailed(
            "assert_lossy",
            f"{size} bytes echoed within {timeout:g} s",
            "a transfer that did not finish",
            time.perf_counter() - start,
            "nothing crosses: frozen or blackholed, not lossy",
        ) from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise ControlFailed(
            "assert_lossy", "an intact transfer", f"an error ({exc})", time.perf_counter() - start
        ) from None
    if lossy <= baseline + margin:
        raise ControlFailed(
            "assert_lossy",
            f"more than {baseline + margin} needed retransmits (baseline {baseline} + {margin})",
            f"{lossy} needed retransmits",
            time.perf_counter() - start,
            "the client's TCP saw no loss: no loss filter in force",
        )
    return baseline, lossy


async def assert_lossy_route(
    stream: trio.SocketStream,
    rounds: int = 100,
    stall_s: float = 0.1,
    timeout: float = 60.0,
    margin: int = LOSS_MARGIN,
) -> tuple[int, int]:
    """Positive control for loss of both directions (``loss(both_ways=True)``): *rounds*
    64-byte round trips through *stream* (an echo) come back intact, more than *margin*
    of them stalled past *stall_s* (a retransmission timeout waited out: TCP's shortest
    is 200 ms, a round trip on loopback takes tens of microseconds), and the client's own
    TCP needed at most one retransmit (a tail-loss probe is now and then not reported
    back as a duplicate: see :func:`faultnet.sockopts.tcp_retransmits_needed`): the
    segments were lost beyond the client's hop and resent there, as on a lossy route.
    One-way loss at the proxy drops the client's own segments, so there the client
    retransmits (red: at 10 %, two or more of 100 but for 3 in 10,000 runs); no loss
    stalls nothing (red). Returns (stalled round trips, the client's needed retransmits).

    Measured at 10 % (100 round trips, 4.5-5.7 s): 17-21 stalled with 0 retransmits by
    the client; one-way loss on both streams 20-28 stalled with 11-14; none 0 of 100."""
    msg = b"faultnet route probe ".ljust(63, b".") + b"\n"  # 64 bytes, one segment
    start = time.perf_counter()
    before = tcp_retransmits_needed(stream.socket)
    stalled = 0
    try:
        with trio.fail_after(timeout):
            for _ in range(rounds):
                t0 = time.perf_counter()
                await stream.send_all(msg)
                echoed = await read_exactly(stream, len(msg))
                if echoed != msg:
                    raise ControlFailed(
                        "assert_lossy_route",
                        "round trips echoed intact",
                        f"{echoed[:16]!r}...",
                        time.perf_counter() - start,
                    )
                stalled += time.perf_counter() - t0 > stall_s
    except trio.TooSlowError:
        raise ControlFailed(
            "assert_lossy_route",
            f"{rounds} round trips within {timeout:g} s",
            f"{stalled} stalled before the time ran out",
            time.perf_counter() - start,
            "nothing crosses: frozen or blackholed, not lossy",
        ) from None
    except (EOFError, trio.BrokenResourceError, OSError) as exc:
        raise ControlFailed(
            "assert_lossy_route", "an intact echo", f"an error ({exc!r})",
            time.perf_counter() - start,
        ) from None  # fmt: skip
    needed = tcp_retransmits_needed(stream.socket) - before
    if stalled <= margin:
        raise ControlFailed(
            "assert_lossy_route",
            f"more than {margin} of {rounds} round trips stalled past {stall_s:g} s",
            f"{stalled} stalled",
            time.perf_counter() - start,
            "no retransmission timeout anywhere: no loss in force",
        )
    if needed > 1:
        raise ControlFailed(
            "assert_lossy_route",
            "at most 1 needed retransmit by the client",
            f"{needed} needed retransmits",
            time.perf_counter() - start,
            "the client's own segments were dropped: one-way loss at the proxy, not a route",
        )
    return stalled, needed


#: The kernel's SYN settings (per network namespace) and its constants: the initial RTO
#: (TCP_TIMEOUT_INIT, 1 s) and the largest (TCP_RTO_MAX, 120 s).
_SYSCTL = Path("/proc/sys/net/ipv4")
_RTO_INIT_S = 1.0
_RTO_MAX_S = 120.0


@dataclass(frozen=True)
class SynRetrySchedule:
    """When a connect's SYN is sent again while none is answered, and when it gives up.

    ``retries_at`` are seconds after the first SYN (every retry the kernel sends within
    ``gives_up_at``); ``gives_up_at`` is when a blocking connect fails with ETIMEDOUT.
    On this kernel (``tcp_syn_linear_timeouts=4``, ``tcp_syn_retries=6``): retries at 1,
    2, 3, 4, 5, 7, 11, 19, 35, 67 s, ETIMEDOUT at about 131 s (measured: 1.01, 2.04,
    3.06, 4.09, 5.11, 7.12, 11.25, 19.44 s; 134.9 s). Without linear timeouts (older
    kernels): 1, 3, 7, 15, 31, 63 s, ETIMEDOUT at 127 s."""

    linear_timeouts: int
    retries: int
    retries_at: tuple[float, ...]
    gives_up_at: float


def _read_sysctl(name: str) -> int | None:
    try:
        return int((_SYSCTL / name).read_text())
    except (OSError, ValueError):
        return None


def syn_retry_schedule(
    retries: int | None = None, linear_timeouts: int | None = None
) -> SynRetrySchedule:
    """The SYN retry schedule of the running kernel: *retries* (``tcp_syn_retries``, or a
    socket's ``TCP_SYNCNT``) and *linear_timeouts* (``tcp_syn_linear_timeouts``; 0 where
    the kernel has no such setting) are read from /proc/sys/net/ipv4 unless given.

    The kernel's rules (tcp_timer.c; each checked against connects behind dropped SYNs
    with TCP_SYNCNT 1-4, which gave up at 3.05, 7.12, 19.41 and 35.53 s): the first
    ``linear_timeouts + 1`` retransmission timeouts are the initial RTO (1 s), then each
    doubles, up to 120 s. The connect gives up not after *retries* retries but at the
    first timeout that ends past the time *retries* doubling timeouts would take
    (``2 ** (retries + 1) - 1`` s, then 120 s a retry), so linear timeouts mean more
    retries within about the same time."""
    if retries is None:
        retries = _read_sysctl("tcp_syn_retries")
        retries = 6 if retries is None else retries
    if linear_timeouts is None:
        linear_timeouts = _read_sysctl("tcp_syn_linear_timeouts") or 0
    # The time-out tcp_model_timeout() gives: doubling RTOs until the largest, then flat.
    threshold = 6  # ilog2(TCP_RTO_MAX / TCP_TIMEOUT_INIT)
    if retries <= threshold:
        limit = ((2 << retries) - 1) * _RTO_INIT_S
    else:
        limit = ((2 << threshold) - 1) * _RTO_INIT_S + (retries - threshold) * _RTO_MAX_S
    times: list[float] = []
    t, k = 0.0, 0
    while True:
        rto = min(_RTO_INIT_S * 2 ** max(0, k - linear_timeouts), _RTO_MAX_S)
        t += rto
        if t >= limit:
            return SynRetrySchedule(linear_timeouts, retries, tuple(times), t)
        times.append(t)
        k += 1


#: A connect faster than this got in on its first SYN.
_FAST_S = 0.5


def _first_retry_window(schedule: SynRetrySchedule) -> tuple[float, float]:
    """When a connect that got in on the first SYN retry completes: from just before the
    retry (timers fire a little early or late) to half-way to the second, at most 0.7 s
    after (0.85-1.7 s without linear timeouts, 0.85-1.5 s with them)."""
    first = schedule.retries_at[0] if schedule.retries_at else _RTO_INIT_S
    gap = schedule.retries_at[1] - first if len(schedule.retries_at) > 1 else 2 * first
    return first - 0.15, first + min(0.7, gap / 2)


async def assert_syn_lossy(
    address: tuple[str, int], probes: int = 32, timeout: float = 4.0
) -> dict[str, int]:
    """Positive control for syn_loss (at about 50 %): *probes* fresh connects made at
    once all connect or hang (none refused or reset), at least one completes at once
    (under 0.5 s) and at least one on the running kernel's first SYN retry (1 s: the
    window from :func:`syn_retry_schedule`, 0.85-1.5 s on a kernel with
    ``tcp_syn_linear_timeouts``, 0.85-1.7 s without): the retry pattern of a lossy
    handshake. (At 50 % the chance that 32 probes show no first retry is 0.75^32, 1 in
    10,000.) Returns the counts by outcome."""
    window = _first_retry_window(syn_retry_schedule())
    start = time.perf_counter()
    results: list[ProbeResult] = []

    async def one() -> None:
        results.append(await probe(address, timeout))

    async with trio.open_nursery() as nursery:
        for _ in range(probes):
            nursery.start_soon(one)
    counts = {"fast": 0, "one_retry": 0, "later": 0, "hung": 0, "refused": 0, "reset": 0}
    for r in results:
        if r.kind is ProbeKind.CONNECTED:
            if r.elapsed_s < _FAST_S:
                counts["fast"] += 1
            elif window[0] <= r.elapsed_s <= window[1]:
                counts["one_retry"] += 1
            else:
                counts["later"] += 1
        else:
            counts[r.kind.value] += 1
    seen = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    elapsed = time.perf_counter() - start
    expected = (
        f"some connects at once and some on the {window[0] + 0.15:g} s SYN retry"
        f" ({window[0]:g}-{window[1]:g} s), none refused"
    )
    if counts["refused"] or counts["reset"]:
        raise ControlFailed(
            "assert_syn_lossy", expected, seen, elapsed, "connects are refused, not lossy"
        )
    if not counts["fast"]:
        raise ControlFailed(
            "assert_syn_lossy", expected, seen, elapsed, "no SYN gets through: dropped, not lossy"
        )
    if not counts["one_retry"]:
        raise ControlFailed(
            "assert_syn_lossy", expected, seen, elapsed, "no connect needed a retry: no SYN loss"
        )
    return counts


async def assert_partitioned(
    stream: trio.SocketStream,
    address: tuple[str, int],
    window: float = 0.3,
    probe_timeout: float = 0.5,
) -> None:
    """Positive control for partition: the client of *stream* is cut off both ways. A
    fresh connect to *address* from the same host as *stream* hangs (its SYN dropped,
    not refused), and bytes written to *stream* bring nothing back within *window*."""
    host = stream.socket.getsockname()[0]
    result = await probe(address, probe_timeout, source=host)
    require_kind(
        "assert_partitioned",
        result,
        ProbeKind.HUNG,
        f"a new connect from {host} to hang",
        f"{host} can still connect: its SYNs are not dropped"
        if result.kind is ProbeKind.CONNECTED
        else _HINTS.get((ProbeKind.HUNG, result.kind), ""),
    )
    try:
        await assert_frozen(stream, stream, window)
    except ControlFailed as exc:
        raise ControlFailed(
            "assert_partitioned",
            "the open connection cut off too",
            exc.seen,
            exc.elapsed_s,
            "open connections still work: only new connects are stopped",
        ) from None
