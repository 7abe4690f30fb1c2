"""The postgres line (issue 34's Targets): what a ``postgres`` toxic that matches no
query costs ``pgbench -S``, against the bare proxy's cost, in the same run.

A throwaway PostgreSQL (the fidelity suite's, :func:`harness.fidelity.postgres_server`)
initialised by ``pgbench -i``; two more faultnet proxy processes in front of it, one
bare and one with the toxic (``query`` a glob no statement matches: every query is
parsed, judged and passed). Each round runs ``pgbench -S`` (one client, simple
protocol, a fixed number of transactions) straight at the server, through the bare
proxy and through the toxic one, in rotated order; a round's added latency is an arm's
``latency average`` less the direct one's, and the figure is the median over the rounds
of the toxic's added over the bare proxy's (:func:`median_ratio`: load that moves both
arms of a round cancels). Skipped, saying why, where PostgreSQL is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.bench._context import _dataplane_argv, _Run, rotating_rounds
from harness.bench._targets import request_rounds

__all__ = ["NO_MATCH", "TARGET_PG_ADDED_VS_BARE", "pgbench_line"]

#: Target (issue 34): a non-matching postgres toxic's added latency over the bare
#: proxy's. Reported with MET/MISSED; never asserted by tests.
TARGET_PG_ADDED_VS_BARE = 2.0
#: The toxic's attributes: a glob no pgbench statement matches.
NO_MATCH = {"query": "faultnet bench: no statement is this*"}
#: pgbench -S transactions per arm and round: the RTT line's round trips per round,
#: at least 100.
_LATENCY = re.compile(r"latency average = ([0-9.]+) ms")


def _pgbench(bindir: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bindir / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", *args]
        + ["postgres"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _initialise(bindir: Path, port: int) -> None:
    """``pgbench -i`` (scale 1), tried until the new cluster takes connections (30 s)."""
    deadline = time.monotonic() + 30
    while True:
        done = _pgbench(bindir, port, "-i", "-q", "-s", "1")
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pgbench -i failed: {done.stderr.strip()[-300:]}")
        time.sleep(0.1)  # polling a server's start-up, bounded above


def _latency_ms(bindir: Path, port: int, transactions: int) -> float | None:
    done = _pgbench(bindir, port, "-S", "-n", "-c", "1", "-t", str(transactions))
    found = _LATENCY.search(done.stdout)
    return float(found.group(1)) if done.returncode == 0 and found else None


def pgbench_line(ctx: _Run, proxy: Callable[[int, list[str]], Any]) -> dict[str, Any]:
    """The line's figures (see the module docstring); *proxy* starts a faultnet proxy
    process in front of a port (the toxic lines' ``ToxicProxy``)."""
    from harness.fidelity import postgres_server

    root = Path("/usr/lib/postgresql")
    found = sorted(root.glob("*/bin/pgbench")) if root.is_dir() else []
    if not found and not shutil.which("pgbench"):
        return {"skipped": "PostgreSQL is not installed"}
    bindir = found[-1].parent if found else Path(str(shutil.which("pgbench"))).parent
    transactions = max(100, ctx.p.pings // ctx.p.rounds)
    with postgres_server() as port:
        if port is None:
            return {"skipped": "PostgreSQL (or its postgres user) is not installed"}
        _initialise(bindir, port)
        bare = proxy(port, _dataplane_argv(ctx.p))
        toxic = proxy(port, _dataplane_argv(ctx.p))
        try:
            toxic.add("postgres", "nomatch", **NO_MATCH)
            ports = {"direct": port, "faultnet": bare.addr[1], "toxic": toxic.addr[1]}
            rounds = rotating_rounds(
                ports, ctx.p.rounds, lambda p: _latency_ms(bindir, p, transactions)
            )
        finally:
            bare.stop()
            toxic.stop()
    return {"transactions": transactions, **request_rounds(rounds, "faultnet")}
