"""Controls: assertions that a fault (or its absence) is the one in force.

Each control scores its OWN single probe or transfer; none compares two probes, because
two connects can land on different port states. Each raises :class:`ControlFailed`
saying what was expected, what was seen, and how long it took; each is proven to go red
by ``faultnet proxy control-test`` and the tests, which break the mode it guards.

* negative control: :func:`assert_accepting` (a HEALTHY port);
* positive controls: :func:`assert_syn_dropped`, :func:`assert_refusing` (new
  connections), :func:`assert_frozen`, :func:`assert_blackholed`,
  :func:`assert_severed`, :func:`assert_reset` (a live connection).

The stream controls take trio streams (``trio.SocketStream``): ``assert_frozen`` writes
through one and watches another (pass the same echo stream twice when the far end
echoes); ``assert_severed``/``assert_reset``/``assert_blackholed`` read one.
"""

from __future__ import annotations

import errno
import time

import trio

from faultnet.probe import ProbeKind, ProbeResult, probe
from faultnet.sockopts import set_keepalive

__all__ = [
    "ControlFailed",
    "assert_accepting",
    "assert_blackholed",
    "assert_frozen",
    "assert_refusing",
    "assert_reset",
    "assert_severed",
    "assert_syn_dropped",
]


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
    if result.kind is not want:
        raise ControlFailed(
            name,
            want.value,
            result.kind.value,
            result.elapsed_s,
            _HINTS.get((want, result.kind), result.error or ""),
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


async def assert_frozen(
    writer: trio.abc.SendStream,
    reader: trio.abc.ReceiveStream,
    window: float = 0.3,
    payload: bytes = b"faultnet frozen probe\n",
) -> None:
    """Positive control for freeze: *payload* written to *writer* produces nothing at
    *reader* within *window* seconds: no byte, no EOF, no error.

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
    with trio.move_on_after(window):
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
