"""What every phase of one run shares: the parameters, the run's context (the arms'
addresses, their order round by round, the checks), and pinning to one CPU."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchParams:
    bytes: int
    pings: int
    connections: int
    rounds: int
    freeze_window: float
    verify: str = "compare"
    socat: str | None = None  # path, or None to skip
    socat_skip_reason: str | None = None
    seed: int = 0
    sabotage: tuple[str, ...] = ()
    preset: str = "default"
    proxy_log: str | None = None
    rtt_cpu: int | None = None  # also measure RTT with everything on this CPU
    requests: int = 0  # redis-benchmark GETs per arm and round (0: no request/response line)
    churn: int = 0  # connections per arm and round in the churn line (0: none)
    dataplane: str | None = None  # the faultnet proxy's data plane (None: its default)
    loss_bytes: int = 0  # bytes per transfer of the loss line (0: no loss line)
    datagrams: int = 0  # UDP datagrams per arm and round (0: no UDP line)
    callgrind: int = 0  # round trips counted under callgrind (0: no instructions line)
    toxic_bytes: int = 0  # bytes per bulk transfer of the toxic lines (0: no toxic lines)
    scale: int = 0  # proxies of the scale lines' server (0: no scale lines)
    scale_connections: tuple[int, ...] = (1000, 5000, 9000)  # the scale lines' levels


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _dataplane_argv(p: BenchParams) -> list[str]:
    return ["--dataplane", p.dataplane] if p.dataplane else []


@dataclass
class _Run:
    """What every phase of one run shares."""

    p: BenchParams
    addrs: dict[str, tuple[str, int]]
    order: list[str]  # the arms that run: direct, socat (unless skipped), faultnet
    arms: dict[str, dict[str, Any]]
    checks: list[dict[str, Any]]
    cpu_of: Callable[[str], float | None]  # the arm's proxy CPU seconds so far
    pids: list[int]  # our children on the data path (upstream, proxy, socat)
    client: str | None = None  # the compiled ping-pong client (None: the Python one)
    #: Sections with a document of their own (``toxic``), by name.
    sections: dict[str, Any] = field(default_factory=dict)

    def rounds(self) -> list[tuple[int, list[str]]]:
        """Each round's arm order, rotated so no arm always runs first or last."""
        return list(enumerate(rotations(self.order, self.p.rounds)))


def rotations(order: list[str], rounds: int) -> list[list[str]]:
    """*order* for each of *rounds* rounds, rotated so no arm always runs first or last."""
    n = len(order)
    return [order[r % n :] + order[: r % n] for r in range(rounds)]


def rotating_rounds(
    ports: dict[str, int],
    rounds: int,
    measure: Callable[[int], float | None],
    during_toxic: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> dict[str, list[float | None]]:
    """Each arm's figure, *measure* of its port once a round in :func:`rotations`'
    order; the ``toxic`` arm's inside *during_toxic* (its toxic there for its round)."""
    out: dict[str, list[float | None]] = {arm: [] for arm in ports}
    for order in rotations(list(ports), rounds):
        for arm in order:
            with during_toxic() if arm == "toxic" else nullcontext():
                out[arm].append(measure(ports[arm]))
    return out


def _pin(pids: Sequence[int], cpus: set[int]) -> dict[int, set[int]]:
    """Pin this thread and every thread of *pids* to *cpus*; return the old masks by TID.
    Threads and processes started later inherit the mask (socat's per-connection fork,
    the upstream's echo thread)."""
    tids = [0]  # 0: the calling thread
    for pid in pids:
        try:
            tids += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:
            continue
    old: dict[int, set[int]] = {}
    for tid in tids:
        try:
            old[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            continue
    return old


def _unpin(old: dict[int, set[int]]) -> None:
    for tid, cpus in old.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue
