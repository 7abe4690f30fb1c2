"""The ``scripts/bench`` command line (``python -m harness.bench``)."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from faultnet.errors import EnvironmentProblem, UsageError, fail
from faultnet.interrupts import Interrupted, raising_on_signals
from faultnet.planes import PLANES
from harness.bench._report import format_report
from harness.bench._roles import _proxy_main, _udp_echo_main, _udp_proxy_main, _upstream_main
from harness.bench._run import BenchParams, run_bench
from harness.bench._stream import PRESETS, parse_size

# ---------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="scripts/bench",
        description=(
            "Benchmark direct loopback, socat and the faultnet proxy in one run: bulk "
            "throughput (verified), 64-byte RTT, concurrent connections, freeze time over "
            "all of them (and that no byte crosses after it), proxy RSS per idle "
            "connection. Prints a table with faultnet's ratios and each target as "
            "MET/MISSED. Exit 0 if every check passed, 1 if one failed, 2 on a usage or "
            "environment error."
        ),
        epilog=(
            "Presets: default = 1 GiB per transfer, 20000 pings, 5000 connections, 3 rounds, "
            "0.5 s freeze window, 256 MiB per loss-line transfer, 50000 datagrams, 64 MiB "
            "per toxic-line transfer; --quick = 256 MiB, 3000 pings, 500 connections, 3 "
            "rounds, 0.2 s, 64 MiB, 10000, 16 MiB. Explicit flags override the preset. "
            "socat is Debian's package "
            "(apt-get install socat); without it the socat arm is skipped and said so."
        ),
    )
    ap.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    # The sizes a preset sets; an explicit flag overrides it.
    sizes: tuple[tuple[str, Callable[[str], Any], str, str], ...] = (
        ("--bytes", str, "SIZE", "bulk bytes per transfer (default 1G)"),
        ("--pings", int, "N", "timed round trips per arm"),
        ("--connections", int, "N", "connections to try to hold (default 5000)"),
        ("--rounds", int, "N", "bulk/RTT rounds (default 3)"),
        ("--freeze-window", float, "S", "how long nothing may arrive after freeze (default 0.5)"),
    )
    for flag, kind, metavar, text in sizes:
        ap.add_argument(flag, type=kind, metavar=metavar, help=text)
    ap.add_argument(
        "--verify",
        choices=("compare", "sha256"),
        default="compare",
        help="bulk check: byte-for-byte compare (default) or SHA-256 of the stream",
    )
    ap.add_argument(
        "--rtt-cpu",
        metavar="CPU",
        default="auto",
        help="also measure RTT with every process on this one CPU, where the added RTT is "
        "the proxy's own work; the RTT target is judged there (default: auto = the "
        "highest-numbered usable CPU; 'none' to skip)",
    )
    ap.add_argument("--socat", metavar="PATH", help="socat binary (default: found on PATH)")
    ap.add_argument("--no-socat", action="store_true", help="skip the socat arm")
    ap.add_argument("--seed", type=int, help="seed of the bulk stream (default: random)")
    ap.add_argument(
        "--proxy-log", metavar="PATH", help="write the faultnet proxy's JSONL event log here"
    )
    ap.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="redis-benchmark GETs per arm and round (default 100000; 0 skips the line)",
    )
    ap.add_argument(
        "--churn",
        type=int,
        metavar="N",
        help="connections per arm and round in the churn line (default 3000; 0 skips it)",
    )
    ap.add_argument(
        "--loss-bytes",
        metavar="SIZE",
        help="bytes per transfer of the loss line, at 0/1/5 %% loss (default 256M; 0 skips)",
    )
    ap.add_argument(
        "--datagrams",
        type=int,
        metavar="N",
        help="UDP datagrams per arm and round, direct and through the UDP proxy "
        "(default 50000; 0 skips the line)",
    )
    ap.add_argument(
        "--callgrind",
        type=int,
        metavar="N",
        help="round trips counted under callgrind for the instructions line, socat and "
        "faultnet (default 2000, --quick 500; 0 skips it; needs valgrind)",
    )
    ap.add_argument(
        "--toxic-bytes",
        metavar="SIZE",
        help="bytes per bulk transfer of the toxic lines (a second faultnet proxy with "
        "latency 0 and 5 ms, slicer, bandwidth, a removed toxic, the hop, each against a "
        "baseline of this run; default 64M, --quick 16M; 0 skips the section)",
    )
    ap.add_argument(
        "--scale",
        type=int,
        metavar="N",
        default=0,
        help="the scale lines (issue 36): a faultnet server with N proxies (RSS, create, "
        "GET /proxies, toxic add/remove), then one proxy at each --scale-connections level "
        "(freeze, GET /faults, latency toxic, RSS per connection); the targets are at "
        "N = 1000 (default 0: not run; e.g. --scale 1000)",
    )
    ap.add_argument(
        "--scale-connections",
        metavar="N,N,...",
        default="1000,5000,9000",
        help="the scale lines' connection levels (default 1000,5000,9000; capped by the "
        "descriptor limit, said in the output)",
    )
    ap.add_argument(
        "--dataplane",
        choices=tuple(PLANES),
        help="the faultnet proxy's data plane (default: the proxy's own default)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the result as JSON ('-': stdout)")
    ap.add_argument("--require-targets", action="store_true", help="exit 1 if a target is MISSED")
    # Internal: the child roles, and deliberate breakage for the bench's own tests.
    ap.add_argument(
        "--role", choices=("upstream", "proxy", "udp-echo", "udp-proxy"), help=argparse.SUPPRESS
    )
    ap.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sabotage", default="", help=argparse.SUPPRESS)
    return ap


#: The counts a preset sets, by flag: 0 skips their line (none may be negative).
_COUNTS = ("requests", "churn", "datagrams", "callgrind")


def _preset(args: argparse.Namespace, d: dict[str, Any], name: str) -> Any:
    """The flag's value if given, else the preset's."""
    given = getattr(args, name)
    return d[name] if given is None else given


def _size_or_zero(text: str | None, default: int) -> int:
    if text is None:
        return default
    return 0 if text.strip() == "0" else parse_size(text)


def _check_sizes(pings: int, rounds: int, window: float, conns: int) -> None:
    if pings < 1:
        raise UsageError("--pings must be at least 1")
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if not 0 < window <= 60:
        raise UsageError("--freeze-window must be in (0, 60] seconds")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cap = hard - 100 if hard != resource.RLIM_INFINITY else 100000
    if not 1 <= conns <= cap:
        raise UsageError(f"--connections must be 1..{cap} (this process's descriptor limit)")


def _sabotage(text: str) -> tuple[str, ...]:
    sabotage = tuple(s for s in text.split(",") if s)
    for s in sabotage:
        if s not in ("freeze", "corrupt", "loss"):
            raise UsageError(f"unknown sabotage {s!r}")
    return sabotage


def _rtt_cpu(text: str) -> int | None:
    usable = os.sched_getaffinity(0)
    if text == "none":
        return None
    if text == "auto":
        return max(usable)
    try:
        cpu = int(text)
    except ValueError:
        raise UsageError(f"--rtt-cpu: not a CPU number: {text!r}") from None
    if cpu not in usable:
        raise UsageError(f"--rtt-cpu {cpu}: not usable here ({sorted(usable)})")
    return cpu


def _socat(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the socat binary, None) or (None, why its arm is skipped)."""
    if args.no_socat:
        return None, "--no-socat"
    path = args.socat or shutil.which("socat") or "/usr/bin/socat"
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path, None
    if args.socat is not None:
        # Asked for by name: a missing program is a mistake, not an arm to drop.
        raise UsageError(f"--socat {args.socat}: not an executable file")
    return None, f"socat not found at {path}"


def params_from_args(args: argparse.Namespace) -> BenchParams:
    preset = "quick" if args.quick else "default"
    d = PRESETS[preset]
    size = parse_size(args.bytes) if args.bytes is not None else d["bytes"]
    loss_bytes = _size_or_zero(args.loss_bytes, d["loss_bytes"])
    toxic_bytes = _size_or_zero(args.toxic_bytes, d["toxic_bytes"])
    counts = {name: _preset(args, d, name) for name in _COUNTS}
    if any(n < 0 for n in counts.values()):
        raise UsageError("--requests, --churn, --datagrams and --callgrind must be 0 or more")
    pings, conns, rounds = (_preset(args, d, k) for k in ("pings", "connections", "rounds"))
    window = _preset(args, d, "freeze_window")
    _check_sizes(pings, rounds, window, conns)
    sabotage = _sabotage(args.sabotage)
    rtt_cpu = _rtt_cpu(args.rtt_cpu)
    scale_connections = _levels(args.scale_connections)
    if args.scale < 0:
        raise UsageError("--scale must be 0 or more")
    socat, reason = _socat(args)
    return BenchParams(
        bytes=size,
        pings=pings,
        connections=conns,
        rounds=rounds,
        freeze_window=window,
        verify=args.verify,
        socat=socat,
        socat_skip_reason=reason,
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        sabotage=sabotage,
        preset=preset,
        proxy_log=str(Path(args.proxy_log).resolve()) if args.proxy_log else None,
        rtt_cpu=rtt_cpu,
        dataplane=args.dataplane,
        loss_bytes=loss_bytes,
        toxic_bytes=toxic_bytes,
        scale=args.scale,
        scale_connections=scale_connections,
        **counts,
    )


def _levels(text: str) -> tuple[int, ...]:
    """``--scale-connections``: increasing positive counts, comma-separated."""
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        levels = ()
    if not levels or any(n <= 0 for n in levels) or list(levels) != sorted(set(levels)):
        raise UsageError(
            f"--scale-connections: {text!r} is not increasing counts, e.g. 1000,5000,9000"
        )
    return levels


def _role_main(args: argparse.Namespace) -> int:
    """Run the child role ``--role`` names (the bench's own processes)."""
    if args.role == "upstream":
        return _upstream_main(args.seed or 0)
    if args.role == "udp-echo":
        return _udp_echo_main()
    if args.upstream_port is None:
        raise UsageError(f"--role {args.role} needs --upstream-port")
    if args.role == "udp-proxy":
        return _udp_proxy_main(args.upstream_port)
    return _proxy_main(
        args.upstream_port, tuple(args.sabotage.split(",")), args.proxy_log, args.dataplane
    )


def _check_json_path(path: str | None) -> None:
    if not path or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"--json: no such directory: {parent}")
    if Path(path).is_dir():
        raise UsageError(f"--json {path}: is a directory")


def _output(res: dict[str, Any], json_path: str | None) -> None:
    """The table on stdout (and the JSON where --json says; '-': stdout, table on stderr)."""
    report = format_report(res)
    if json_path == "-":
        print(report, file=sys.stderr)
        print(json.dumps(res, indent=2))
        return
    print(report)
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.role is not None:
            return _role_main(args)
        params = params_from_args(args)
        _check_json_path(args.json)
        with raising_on_signals():  # a default SIGTERM would leave socat and redis running
            res = run_bench(params)
    # OSError: the load generator itself could not run (e.g. no descriptors).
    except (UsageError, EnvironmentProblem, OSError) as exc:
        return fail("bench", exc)
    except Interrupted as exc:
        return exc.report("cleaned up (processes stopped by PID)")
    except KeyboardInterrupt:  # before the handlers were in place
        return 130
    _output(res, args.json)
    if not res["ok"]:
        return 1
    if args.require_targets and any(t["status"] == "MISSED" for t in res["targets"]):
        return 1
    return 0
