"""One benchmark run: the arms against one upstream, every phase, the checks and the
ratios against the targets; returns the result document (``--json``).

The phases live by concern: ``_phases`` (bulk, RTT, churn, request/response, loss, UDP,
callgrind), ``_hold`` (hold and freeze); the ratios and the target table in ``_targets``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from faultnet.errors import EnvironmentProblem
from faultnet.sockopts import raise_fd_limit
from harness.bench._children import Child, Socat, _self_argv, proc_cpu_s
from harness.bench._compiled import Compiled
from harness.bench._context import BenchParams, _dataplane_argv, _log, _Run
from harness.bench._hold import _hold_phase
from harness.bench._phases import (
    _bulk_phase,
    _callgrind_phase,
    _churn_phase,
    _loss_phase,
    _reqresp_phase,
    _rtt_phase,
    _udp_phase,
)
from harness.bench._scale import scale_phase
from harness.bench._scale_targets import SCALE_TARGETS
from harness.bench._stream import CHILD_START_S, HOST, SCHEMA, make_block, stream_sha256
from harness.bench._targets import GIB, TARGETS, Facts, judge_all
from harness.bench._targets import ratios as _ratios
from harness.bench._toxic import toxic_phase
from harness.bench._toxic_targets import TOXIC_TARGETS

__all__ = ["GIB", "BenchParams", "_ratios", "run_bench"]

#: The params the result document repeats (``params``), by their names there.
_PARAM_KEYS = (
    ("bytes", "bytes"), ("pings", "pings"), ("connections", "connections"),
    ("rounds", "rounds"), ("freeze_window_s", "freeze_window"), ("verify", "verify"),
    ("seed", "seed"), ("preset", "preset"), ("sabotage", "sabotage"), ("rtt_cpu", "rtt_cpu"),
    ("requests", "requests"), ("churn", "churn"), ("dataplane", "dataplane"),
    ("loss_bytes", "loss_bytes"), ("datagrams", "datagrams"), ("callgrind", "callgrind"),
    ("toxic_bytes", "toxic_bytes"), ("scale", "scale"),
)  # fmt: skip


def _env(socat_path: str | None) -> dict[str, Any]:
    version = None
    if socat_path:
        try:
            out = subprocess.run(
                [socat_path, "-V"], capture_output=True, text=True, timeout=10
            ).stdout
            version = next((ln.split()[2] for ln in out.splitlines() if " version " in ln), None)
        except (OSError, subprocess.TimeoutExpired, IndexError):
            version = None
    import trio

    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "trio": trio.__version__,
        "socat": version,
        "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    }


def _loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (other work on the machine moves figures)."""
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def run_bench(p: BenchParams) -> dict[str, Any]:
    """Run every measurement once; return the result document (see ``--json``)."""
    started = time.time()
    raise_fd_limit()
    params = {key: getattr(p, attr) for key, attr in _PARAM_KEYS}
    params["sabotage"] = list(p.sabotage)
    params["scale_connections"] = list(p.scale_connections)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "started": started,
        "params": params,
        "loadavg": _loadavg(),
        "env": _env(p.socat),
    }
    arms: dict[str, dict[str, Any]] = {"direct": {}, "socat": {}, "faultnet": {}}
    result["arms"] = arms
    checks: list[dict[str, Any]] = []
    result["checks"] = checks
    with ExitStack() as stack:
        compiled = Compiled()
        stack.callback(compiled.close)
        result["rtt_client"] = (
            "compiled (pingpong.c)" if compiled.path else f"python ({compiled.why})"
        )
        run = _Arms(p, arms, checks, compiled.path, stack)
        run.run_phases(p)
    result["ratios"] = _ratios(arms)
    toxic = run.ctx.sections.get("toxic")
    if toxic is not None:
        result["toxic"] = toxic
    facts = Facts(arms, result["ratios"], p.connections, p.callgrind, toxic)
    result["targets"] = judge_all(TARGETS + (TOXIC_TARGETS if toxic else ()), facts)
    scale = run.ctx.sections.get("scale")
    if scale is not None:
        result["scale"] = scale
        result["targets"] += judge_all(SCALE_TARGETS, dataclasses.replace(facts, extra=scale))
    result["elapsed_s"] = round(time.time() - started, 2)
    result["loadavg_end"] = _loadavg()
    result["ok"] = all(c["ok"] for c in checks)
    return result


class _Arms:
    """The run's processes: the upstream, the faultnet proxy and socat (unless skipped),
    each stopped by *stack* at the end, whatever happened."""

    def __init__(
        self,
        p: BenchParams,
        arms: dict[str, dict[str, Any]],
        checks: list[dict[str, Any]],
        client: str | None,
        stack: ExitStack,
    ) -> None:
        self.upstream = Child(
            _self_argv("--role", "upstream", "--seed", str(p.seed)), "upstream server"
        )
        stack.callback(self.upstream.stop)
        self.up_port = int(self.upstream.read_json(CHILD_START_S)["port"])
        self.proxy = Child(
            _self_argv(
                "--role", "proxy", "--upstream-port", str(self.up_port),
                *(["--sabotage", ",".join(p.sabotage)] if p.sabotage else []),
                *(["--proxy-log", p.proxy_log] if p.proxy_log else []),
                *_dataplane_argv(p),
            ),
            "faultnet proxy",
        )  # fmt: skip
        stack.callback(self.proxy.stop)
        hello = self.proxy.read_json(CHILD_START_S)
        addrs: dict[str, tuple[str, int]] = {
            "direct": (HOST, self.up_port),
            "faultnet": (hello["address"][0], int(hello["address"][1])),
        }
        arms["faultnet"]["pid"] = self.proxy.pid
        self.socat = self._start_socat(p, arms, addrs)
        if self.socat is not None:
            stack.callback(self.socat.stop)
        for name in arms:
            if name in addrs:
                arms[name]["address"] = f"{addrs[name][0]}:{addrs[name][1]}"
        _log(
            f"upstream pid {self.upstream.pid}, faultnet proxy pid {self.proxy.pid}"
            + (f", socat pid {self.socat.child.pid}" if self.socat is not None else "")
        )
        if "skipped" in arms["socat"]:
            _log(f"socat arm skipped: {arms['socat']['skipped']}")
        order: list[str] = [a for a in ("direct", "socat", "faultnet") if a in addrs]
        pids = [self.upstream.pid, self.proxy.pid]
        pids += [self.socat.child.pid] if self.socat is not None else []
        self.ctx = _Run(p, addrs, order, arms, checks, self.cpu_of, pids, client)

    @staticmethod
    def _start_socat(
        p: BenchParams, arms: dict[str, dict[str, Any]], addrs: dict[str, tuple[str, int]]
    ) -> Socat | None:
        if p.socat is None:
            arms["socat"]["skipped"] = p.socat_skip_reason
            return None
        try:
            socat = Socat(p.socat, addrs["direct"][1])
        except EnvironmentProblem as exc:
            arms["socat"]["skipped"] = str(exc)
            return None
        addrs["socat"] = (HOST, socat.port)
        arms["socat"]["argv"] = socat.argv
        return socat

    def cpu_of(self, arm: str) -> float | None:
        """The arm's proxy CPU seconds so far (None for direct)."""
        if arm == "faultnet":
            return proc_cpu_s(self.proxy.pid)
        if arm == "socat" and self.socat is not None:
            self.socat.wait_reaped()
            return proc_cpu_s(self.socat.child.pid, children=True)
        return None

    def run_phases(self, p: BenchParams) -> None:
        """Every phase the parameters ask for, in the report's order."""
        ctx = self.ctx
        block = make_block(p.seed)
        _bulk_phase(ctx, block, stream_sha256(block, p.bytes) if p.verify == "sha256" else None)
        _rtt_phase(ctx, "rtt", None)
        optional: tuple[tuple[object, Callable[[], None]], ...] = (
            (p.rtt_cpu is not None, lambda: _rtt_phase(ctx, "rtt_one_cpu", p.rtt_cpu)),
            (p.churn, lambda: _churn_phase(ctx)),
            (p.requests, lambda: _reqresp_phase(ctx)),
            (p.loss_bytes, lambda: _loss_phase(ctx, self.proxy, block)),
            (p.datagrams, lambda: _udp_phase(ctx)),
            (p.callgrind, lambda: _callgrind_phase(ctx, self.up_port)),
            (p.toxic_bytes, lambda: toxic_phase(ctx, block)),
            (p.scale, lambda: scale_phase(ctx)),
        )
        for wanted, phase in optional:
            if wanted:
                phase()
        _hold_phase(ctx, self.proxy, self.upstream)
