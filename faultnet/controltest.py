"""The control test: every control passes on its real mode AND goes red when that mode is
broken on purpose.

A control that has only ever been seen passing is indistinguishable from one that always
passes. :func:`run_control_test` starts its own throwaway echo upstream and, for the
negative control and for every mode, a proxy of its own on loopback (they run at once).
On each it applies the real mode and runs its positive control (must pass), undoes it,
then applies each breakage (a stand-in that looks like the mode but is not) and runs the
same control (must fail). The probe classification is recorded either side of every
switch.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from faultnet import controls
from faultnet.modes import MODES
from faultnet.probe import probe
from faultnet.proxy import Proxy, open_proxy
from faultnet.testing import echo_server, read_exactly

__all__ = [
    "BREAKAGES",
    "NEGATIVE",
    "REAL_ARGS",
    "Step",
    "Timings",
    "run_control_test",
    "variant_key",
]

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
    #: Bytes each way for the loss control's two transfers (8 MiB: about 128 loopback
    #: segments, so 10 % loss drops about 13 against a baseline of 0).
    loss_bytes: int = 8 << 20


#: The negative control's pseudo-mode: a healthy port.
NEGATIVE = "pass"

#: The arguments the real arm of a mode that needs some is applied with (by name).
REAL_ARGS: dict[str, dict[str, Any]] = {
    "loss": {"percent": 10},
    # 100 round trips at 10 % both ways: 17-21 stalled (the control wants more than 3).
    "loss+both_ways": {"percent": 10, "both_ways": True},
    # 50 % makes "connected at once" and "connected on the 1 s retry" equally likely.
    "syn_loss": {"percent": 50},
}

#: Every mode's breakages: stand-ins that look like the mode but are not, each as
#: ``(what, apply, undo)`` or ``(what, apply, undo, apply's keyword arguments)`` with
#: *apply* and *undo* names of :class:`Proxy` methods ("" = do nothing). Every mode of
#: :data:`faultnet.modes.MODES` that has a control has a row (tests/faultnet/test_modes.py
#: checks), and so does :data:`NEGATIVE`, and each variant with a control of its own
#: (``Mode.variant_controls``) under ``MODE+FLAG`` (:func:`variant_key`).
BREAKAGES: dict[str, tuple[tuple[Any, ...], ...]] = {
    NEGATIVE: (("listener closed", "refuse", "restore"),),
    "freeze": (
        ("a freeze that still forwards", "", ""),
        ("a freeze that closes the link", "sever", ""),
    ),
    "blackhole": (("a blackhole that only freezes (no filter)", "freeze", "thaw"),),
    "sever": (
        ("a sever that resets", "reset", ""),
        ("a sever that leaves the link open", "", ""),
    ),
    "reset": (
        ("a reset that closes cleanly", "sever", ""),
        ("a reset that leaves the link open", "", ""),
    ),
    "drop_syn": (
        ("listener closed (refused, not hung)", "refuse", "restore"),
        ("drop_syn as a no-op", "", ""),
        # The classic mistake: stop calling accept() and keep a normal backlog. The kernel
        # completes handshakes by itself, so clients connect, then hear nothing.
        (
            "accept paused, kernel backlog completes the handshake",
            "pause_accepting",
            "resume_accepting",
        ),
    ),
    "refuse": (
        ("SYNs dropped instead", "drop_syn", "restore"),
        ("refuse as a no-op", "", ""),
    ),
    "loss": (("loss whose filter is never attached", "", ""),),
    "loss+both_ways": (
        ("two-way loss as a no-op", "", ""),
        (
            "one-way loss on both streams (the client's own segments dropped)",
            "loss",
            "thaw",
            {"percent": 10},
        ),
    ),  # fmt: skip
    "syn_loss": (
        ("syn_loss as a no-op", "", ""),
        ("every SYN dropped (drop_syn)", "drop_syn", "restore"),
        ("listener closed (refused)", "refuse", "restore"),
    ),
    "partition": (
        ("open links frozen, new connects accepted", "freeze", "thaw"),
        ("new connects dropped, open links working", "drop_syn", "restore"),
        # Per-peer: cutting off another client must leave this one alone.
        ("another peer partitioned", "partition", "thaw", {"peer": "127.0.0.2"}),
    ),
}


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
            try:
                await read_exactly(stream, 5)
            except EOFError:
                raise controls.ControlFailed("echo", "ping echoed", "EOF", 0) from None
        return stream

    async def close_all(self) -> None:
        for s in self.streams:
            await s.aclose()
        self.streams.clear()

    async def call(self, method: str, **kwargs: Any) -> None:
        """Call the proxy's *method* by name ("" = nothing), awaiting it if async."""
        if method:
            result = getattr(self.proxy, method)(**kwargs)
            if inspect.isawaitable(result):
                await result


async def _classify(addr: Address, timeout: float) -> str:
    return str((await probe(addr, timeout)).kind.value)


def _controls(
    addr: Address, t: Timings
) -> tuple[
    dict[str, Callable[[], Awaitable[Any]]],
    dict[str, Callable[[trio.SocketStream], Awaitable[Any]]],
]:
    """Each control by name: on a listener (a fresh probe of *addr*) or on a live link."""
    on_listener: dict[str, Callable[[], Awaitable[Any]]] = {
        "assert_accepting": lambda: controls.assert_accepting(addr, t.probe_s * 4),
        "assert_syn_dropped": lambda: controls.assert_syn_dropped(addr, t.probe_s),
        "assert_refusing": lambda: controls.assert_refusing(addr, t.probe_s),
        "assert_syn_lossy": lambda: controls.assert_syn_lossy(addr),
    }
    on_link: dict[str, Callable[[trio.SocketStream], Awaitable[Any]]] = {
        "assert_frozen": lambda s: controls.assert_frozen(s, s, t.frozen_window_s),
        "assert_severed": lambda s: controls.assert_severed(s, t.close_s),
        "assert_reset": lambda s: controls.assert_reset(s, t.close_s),
        "assert_blackholed": lambda s: controls.assert_blackholed(s, t.blackhole_s),
        "assert_lossy": lambda s: controls.assert_lossy(s, addr, t.loss_bytes),
        "assert_lossy_route": lambda s: controls.assert_lossy_route(s),
        "assert_partitioned": lambda s: controls.assert_partitioned(
            s, addr, t.frozen_window_s, t.probe_s
        ),
    }
    return on_listener, on_link


def variant_key(mode: str, flag: str) -> str:
    """:data:`REAL_ARGS` and :data:`BREAKAGES` key of *mode* with *flag* set."""
    return f"{mode}+{flag}"


#: One arm of a mode's group: (arm, control, expected, apply, undo, apply's kwargs).
_Arm = tuple[str, str, str, str, str, "dict[str, Any] | None"]


def _groups() -> list[tuple[str, list[_Arm]]]:
    """Every mode's arms, in order: the negative control first, then each mode with a
    control: its real arm (from :data:`faultnet.modes.MODES`), then its breakages, then
    those of each variant with a control of its own."""
    groups = [(NEGATIVE, _arms(NEGATIVE, "assert_accepting", "", "", None))]
    for m in MODES.values():
        if m.control is None:
            continue
        undo = m.undone_by or ""
        groups.append((m.name, _arms(m.name, m.control, m.name, undo, REAL_ARGS.get(m.name))))
        for flag, control in m.variant_controls:
            key = variant_key(m.name, flag)
            groups.append((m.name, _arms(key, control, m.name, undo, REAL_ARGS[key], flag)))
    return groups


def _arms(
    key: str, control: str, apply: str, undo: str, args: dict[str, Any] | None, flag: str = ""
) -> list[_Arm]:
    """The real arm (*apply* with *args*, undone by *undo*) and the breakages of
    :data:`BREAKAGES` [*key*], each scored by *control*; a variant's arms name its *flag*."""
    tag = f" ({flag})" if flag else ""
    arms: list[_Arm] = [(f"real{tag}", control, "pass", apply, undo, args)]
    for what, b_apply, b_undo, *kwargs in BREAKAGES[key]:
        b_args = kwargs[0] if kwargs else None
        arms.append((f"breakage{tag}: {what}", control, "red", b_apply, b_undo, b_args))
    return arms


async def run_control_test(
    report: Callable[[Step], None] = lambda step: None, timings: Timings | None = None
) -> list[Step]:
    """Run every mode's control on the real mode and on each breakage; return the steps,
    in the order of :func:`_groups` (the negative control, then the modes of MODES).

    Each mode's arms run in turn on a proxy of its own (every arm undoes what it did and
    proves a fresh link echoes again before the next); the modes run at once, sharing one
    echo upstream. They wait on the network, not the CPU: run one after another they
    took 33 s, the longest mode (blackhole) 9 s. *report* is called as each step
    completes (for progress output: steps of different modes interleave there)."""
    t = timings or Timings()
    groups = _groups()
    done: list[list[Step]] = [[] for _ in groups]
    async with echo_server() as upstream, trio.open_nursery() as nursery:
        for index, (mode, arms) in enumerate(groups):
            nursery.start_soon(_run_group, upstream, mode, arms, t, done[index], report)
    return [step for steps in done for step in steps]


async def _run_group(
    upstream: Address,
    mode: str,
    arms: list[_Arm],
    t: Timings,
    steps: list[Step],
    report: Callable[[Step], None],
) -> None:
    async with open_proxy(upstream, name=f"control-test-{mode}") as proxy:
        bench = _Bench(proxy)
        assert proxy.address is not None
        addr = proxy.address
        on_listener, on_link = _controls(addr, t)
        for arm, control, expected, apply, undo, kwargs in arms:
            step = Step(mode, arm, control, expected)
            if control in on_listener:
                step.before = await _classify(addr, t.probe_s)
                await bench.call(apply, **(kwargs or {}))
                step.outcome, step.detail, step.elapsed_ms, step.during = await _score(
                    on_listener[control]
                )
                await bench.call(undo)
                step.after = await _classify(addr, t.probe_s)
            else:
                stream = await bench.link()
                step.before = "echoing"
                await bench.call(apply, **(kwargs or {}))
                check = functools.partial(on_link[control], stream)
                step.outcome, step.detail, step.elapsed_ms, step.during = await _score(check)
                await bench.call(undo)
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


async def _score(check: Callable[[], Awaitable[Any]]) -> tuple[str, str, float, str]:
    """Run one control: (outcome, detail, elapsed ms, what it saw)."""
    start = time.perf_counter()
    try:
        await check()
    except controls.ControlFailed as exc:
        return "red", str(exc), (time.perf_counter() - start) * 1000, exc.seen
    return "pass", "", (time.perf_counter() - start) * 1000, "as expected"
