"""The control test: every control passes on its real mode AND goes red when that mode is
broken on purpose.

A control that has only ever been seen passing is indistinguishable from one that always
passes. :func:`run_control_test` starts its own throwaway echo upstream and proxy on
loopback and, for every mode: checks the negative control, applies the real mode and
runs its positive control (must pass), undoes it, then applies each breakage (a stand-in
that looks like the mode but is not) and runs the same control (must fail). The probe
classification is recorded either side of every switch.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from faultnet import controls
from faultnet.probe import probe
from faultnet.proxy import Proxy

__all__ = ["Step", "run_control_test"]

Address = tuple[str, int]


@dataclass
class Step:
    mode: str
    #: "real" or "breakage: <what>"
    arm: str
    control: str
    #: "pass" on the real mode, "red" on a breakage.
    expected: str
    outcome: str = ""
    detail: str = ""
    #: What a probe or echo saw before the switch, under it, and after undoing it.
    before: str = ""
    during: str = ""
    after: str = ""
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome == self.expected

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


@dataclass
class Timings:
    """Windows the controls use. Small enough to run in seconds, large enough that a
    loaded 2-core machine does not turn a refused connect into a hang."""

    probe_s: float = 0.5
    frozen_window_s: float = 0.3
    close_s: float = 1.0
    blackhole_s: float = 6.0


async def _echo(stream: trio.SocketStream) -> None:
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@dataclass
class _Bench:
    proxy: Proxy
    streams: list[trio.SocketStream] = field(default_factory=list)

    async def link(self) -> trio.SocketStream:
        """A fresh connection through the proxy, proven to echo (negative control)."""
        assert self.proxy.address is not None
        stream = await trio.open_tcp_stream(*self.proxy.address)
        self.streams.append(stream)
        with trio.fail_after(2):
            await stream.send_all(b"ping\n")
            got = b""
            while len(got) < 5:
                data = await stream.receive_some(64)
                if not data:
                    raise controls.ControlFailed("echo", "ping echoed", "EOF", 0)
                got += data
        return stream

    async def close_all(self) -> None:
        for s in self.streams:
            await s.aclose()
        self.streams.clear()


async def _classify(addr: Address, timeout: float) -> str:
    return str((await probe(addr, timeout)).kind.value)


async def run_control_test(
    report: Callable[[Step], None] = lambda step: None, timings: Timings | None = None
) -> list[Step]:
    """Run every mode's control on the real mode and on each breakage; return the steps.

    *report* is called as each step completes (for progress output).
    """
    t = timings or Timings()
    steps: list[Step] = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(_serve_echo)
        upstream = listeners[0].socket.getsockname()[:2]
        proxy = Proxy(upstream, ("127.0.0.1", 0), name="control-test")
        await nursery.start(proxy.serve)
        bench = _Bench(proxy)
        assert proxy.address is not None
        addr = proxy.address

        async def listener_step(
            mode: str,
            arm: str,
            control: str,
            expected: str,
            apply: Callable[[], Awaitable[None]],
            undo: Callable[[], Awaitable[None]],
            check: Callable[[], Awaitable[Any]],
        ) -> None:
            step = Step(mode, arm, control, expected)
            step.before = await _classify(addr, t.probe_s)
            await apply()
            step.outcome, step.detail, step.elapsed_ms, step.during = await _score(check)
            await undo()
            step.after = await _classify(addr, t.probe_s)
            steps.append(step)
            report(step)

        async def link_step(
            mode: str,
            arm: str,
            control: str,
            expected: str,
            apply: Callable[[], Awaitable[Any]],
            undo: Callable[[], Awaitable[Any]],
            check: Callable[[trio.SocketStream], Awaitable[Any]],
        ) -> None:
            step = Step(mode, arm, control, expected)
            stream = await bench.link()
            step.before = "echoing"
            await apply()
            step.outcome, step.detail, step.elapsed_ms, step.during = await _score(
                lambda: check(stream)
            )
            await undo()
            # Either side of the switch: after undo, a fresh link must echo again.
            try:
                await bench.link()
                step.after = "echoing"
            except Exception as exc:  # reported, and makes the step fail below
                step.after = f"broken ({exc})"
                step.outcome = "error"
            await bench.close_all()
            steps.append(step)
            report(step)

        async def nothing() -> None:
            return None

        async def pause_accept() -> None:
            # The classic mistake: stop calling accept() and keep a normal backlog. The
            # kernel completes handshakes by itself, so clients connect, then hear nothing.
            assert proxy._accept_scope is not None
            proxy._accept_scope.cancel()

        async def resume_accept() -> None:
            proxy._start_accepting()

        def syn() -> Awaitable[Any]:
            return controls.assert_syn_dropped(addr, t.probe_s)

        def refused() -> Awaitable[Any]:
            return controls.assert_refusing(addr, t.probe_s)

        def accepting() -> Awaitable[Any]:
            return controls.assert_accepting(addr, t.probe_s * 4)

        def frozen(s: trio.SocketStream) -> Awaitable[Any]:
            return controls.assert_frozen(s, s, t.frozen_window_s)

        def severed(s: trio.SocketStream) -> Awaitable[Any]:
            return controls.assert_severed(s, t.close_s)

        def reset(s: trio.SocketStream) -> Awaitable[Any]:
            return controls.assert_reset(s, t.close_s)

        def blackholed(s: trio.SocketStream) -> Awaitable[Any]:
            return controls.assert_blackholed(s, t.blackhole_s)

        # (mode, arm, control, expected, apply, undo, check): "real" must pass, every
        # breakage (a stand-in that looks like the mode but is not) must go red.
        listener_cases = [
            ("pass", "real", "assert_accepting", "pass", nothing, nothing, accepting),
            ("pass", "breakage: listener closed", "assert_accepting", "red",
             proxy.refuse, proxy.restore, accepting),
            ("drop_syn", "real", "assert_syn_dropped", "pass",
             proxy.drop_syn, proxy.restore, syn),
            ("drop_syn", "breakage: listener closed (refused, not hung)", "assert_syn_dropped",
             "red", proxy.refuse, proxy.restore, syn),
            ("drop_syn", "breakage: drop_syn as a no-op", "assert_syn_dropped", "red",
             nothing, nothing, syn),
            ("drop_syn", "breakage: accept paused, kernel backlog completes the handshake",
             "assert_syn_dropped", "red", pause_accept, resume_accept, syn),
            ("refuse", "real", "assert_refusing", "pass", proxy.refuse, proxy.restore, refused),
            ("refuse", "breakage: SYNs dropped instead", "assert_refusing", "red",
             proxy.drop_syn, proxy.restore, refused),
            ("refuse", "breakage: refuse as a no-op", "assert_refusing", "red",
             nothing, nothing, refused),
        ]  # fmt: skip
        link_cases = [
            ("freeze", "real", "assert_frozen", "pass", proxy.freeze, proxy.thaw, frozen),
            ("freeze", "breakage: a freeze that still forwards", "assert_frozen", "red",
             nothing, nothing, frozen),
            ("freeze", "breakage: a freeze that closes the link", "assert_frozen", "red",
             proxy.sever, nothing, frozen),
            ("sever", "real", "assert_severed", "pass", proxy.sever, nothing, severed),
            ("sever", "breakage: a sever that resets", "assert_severed", "red",
             proxy.reset, nothing, severed),
            ("sever", "breakage: a sever that leaves the link open", "assert_severed", "red",
             nothing, nothing, severed),
            ("reset", "real", "assert_reset", "pass", proxy.reset, nothing, reset),
            ("reset", "breakage: a reset that closes cleanly", "assert_reset", "red",
             proxy.sever, nothing, reset),
            ("reset", "breakage: a reset that leaves the link open", "assert_reset", "red",
             nothing, nothing, reset),
            ("blackhole", "real", "assert_blackholed", "pass",
             proxy.blackhole, proxy.thaw, blackholed),
            ("blackhole", "breakage: a blackhole that only freezes (no filter)",
             "assert_blackholed", "red", proxy.freeze, proxy.thaw, blackholed),
        ]  # fmt: skip
        for case in listener_cases:
            await listener_step(*case)
        for case in link_cases:
            await link_step(*case)

        await proxy.aclose()
        nursery.cancel_scope.cancel()
    return steps


async def _serve_echo(
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await trio.serve_tcp(_echo, 0, host="127.0.0.1", task_status=task_status)


async def _score(check: Callable[[], Awaitable[Any]]) -> tuple[str, str, float, str]:
    """Run one control: (outcome, detail, elapsed ms, what it saw)."""
    start = time.perf_counter()
    try:
        await check()
    except controls.ControlFailed as exc:
        return "red", str(exc), (time.perf_counter() - start) * 1000, exc.seen
    return "pass", "", (time.perf_counter() - start) * 1000, "as expected"
