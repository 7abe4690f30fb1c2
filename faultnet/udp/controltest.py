"""The UDP half of the control test: every UDP control passes on its real mode and goes
red on each breakage (a stand-in that looks like the mode but is not).

:func:`run_udp_control_test` starts its own UDP echo upstream and :class:`UdpProxy` on
loopback; for each case it applies the arm, runs the control, then undoes everything
(thaw and clear) and checks that a fresh probe is answered again. The steps are the
same :class:`faultnet.controltest.Step` records the TCP control test makes, with the
mode named ``udp:<mode>``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from faultnet.controls import ControlFailed
from faultnet.controltest import Step
from faultnet.testing import udp_echo_server
from faultnet.udp import controls
from faultnet.udp.probe import udp_probe
from faultnet.udp.proxy import UdpProxy, open_udp_proxy

__all__ = ["run_udp_control_test"]

#: The size limit the size controls use (bytes of payload).
_LIMIT = 100
#: Latency the delay control demands, and what the real mode applies (with jitter 10).
_MIN_MS, _LATENCY_MS = 100.0, 120.0


def _cases(
    p: UdpProxy, address: tuple[str, int]
) -> list[tuple[str, str, Callable[[], Awaitable[Any]], functools.partial[Awaitable[Any]]]]:
    """(mode, arm, apply, control): "real" must pass, each breakage must go red."""

    async def nothing() -> None:
        return None

    def control(fn: Callable[..., Awaitable[Any]], *args: Any) -> functools.partial[Awaitable[Any]]:
        return functools.partial(fn, address, *args)

    answering = control(controls.assert_udp_answering)
    silent = control(controls.assert_udp_silent)
    held = control(controls.assert_udp_held, p.thaw)
    lossy = control(controls.assert_udp_lossy, 20)
    delayed = control(controls.assert_udp_delayed, _MIN_MS)
    duplicated = control(controls.assert_udp_duplicated)
    reordered = control(controls.assert_udp_reordered)
    truncated = control(controls.assert_udp_truncated, _LIMIT)
    dropped = control(controls.assert_udp_oversize_dropped, _LIMIT)

    def latency() -> Awaitable[Any]:
        return p.latency(_LATENCY_MS, 10)

    return [
        ("pass", "real", nothing, answering),
        ("pass", "breakage: datagrams dropped", p.blackhole, answering),
        ("pass", "breakage: payload truncated", lambda: p.size_limit(8), answering),
        ("blackhole", "real", p.blackhole, silent),
        ("blackhole", "breakage: a blackhole as a no-op", nothing, silent),
        ("blackhole", "breakage: datagrams only delayed",
         lambda: p.latency(_MIN_MS / 5), silent),
        ("freeze", "real", p.freeze, held),
        ("freeze", "breakage: held datagrams dropped (a blackhole)", p.blackhole, held),
        ("freeze", "breakage: a freeze as a no-op", nothing, held),
        ("loss", "real", lambda: p.loss(20, "upstream"), lossy),
        ("loss", "breakage: loss as a no-op", nothing, lossy),
        ("loss", "breakage: everything lost (a blackhole)", p.blackhole, lossy),
        ("latency", "real", latency, delayed),
        ("latency", "breakage: latency as a no-op", nothing, delayed),
        ("latency", "breakage: a tenth of the latency", lambda: p.latency(_MIN_MS / 10), delayed),
        ("duplicate", "real", lambda: p.duplicate(100, "downstream"), duplicated),
        ("duplicate", "breakage: duplicate as a no-op", nothing, duplicated),
        ("reorder", "real", lambda: p.reorder(50), reordered),
        ("reorder", "breakage: reorder as a no-op", nothing, reordered),
        ("reorder", "breakage: jitter only (order kept)", lambda: p.latency(20, 20), reordered),
        ("size_limit", "real: truncate", lambda: p.size_limit(_LIMIT), truncated),
        ("size_limit", "breakage: no limit", nothing, truncated),
        ("size_limit", "breakage: dropped, not truncated",
         lambda: p.size_limit(_LIMIT, "drop"), truncated),
        ("size_limit", "real: drop", lambda: p.size_limit(_LIMIT, "drop"), dropped),
        ("size_limit", "breakage: no limit (drop)", nothing, dropped),
        ("size_limit", "breakage: truncated, not dropped", lambda: p.size_limit(_LIMIT), dropped),
    ]  # fmt: skip


async def run_udp_control_test(report: Callable[[Step], None] = lambda step: None) -> list[Step]:
    """Run every UDP mode's control on the real mode and on each breakage."""
    steps: list[Step] = []
    async with (
        udp_echo_server() as (upstream, _),
        open_udp_proxy(upstream, name="udp-control-test", seed=12) as proxy,
    ):
        assert proxy.address is not None
        for mode, arm, apply, control in _cases(proxy, proxy.address):
            expected = "pass" if arm.startswith("real") else "red"
            step = Step(f"udp:{mode}", arm, control.func.__name__, expected)
            step.before = (await udp_probe(proxy.address, 0.5)).kind.value
            await apply()
            start = time.perf_counter()
            try:
                await control()
                step.outcome, step.during = "pass", "as expected"
            except ControlFailed as exc:
                step.outcome, step.detail, step.during = "red", str(exc), exc.seen
            step.elapsed_ms = (time.perf_counter() - start) * 1000
            await proxy.thaw()
            await proxy.clear()
            step.after = (await udp_probe(proxy.address, 0.5)).kind.value
            if step.after != "answered":
                step.outcome = "error"
                step.detail += " -- not answering after the undo"
            steps.append(step)
            report(step)
        await trio.lowlevel.checkpoint()
    return steps
