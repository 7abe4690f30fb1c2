"""Fixtures of the chaos tests: sleeper processes to signal, hand-built plans, a
`faultnet server` subprocess."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from faultnet.chaos import Plan, PlanConfig, Slot, catalogue
from faultnet.procs import ProcessIdentity, signal_exact


def proc_state(pid: int) -> str:
    """The one-letter state of /proc/PID/stat (T: stopped, S: sleeping, Z: zombie)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def append_line(path: Path, line: str) -> None:
    """Append one allowlist line, as a spawner would."""
    with open(path, "a") as f:
        f.write(line + "\n")


@pytest.fixture
def sleepers() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start real `sleep` processes; each is killed (by its own handle) at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "120"])
        started.append(p)
        ProcessIdentity.of(p.pid)  # returns once the exec is done
        return p

    yield start
    for p in started:
        if p.poll() is None:
            signal_exact(ProcessIdentity.of(p.pid), signal.SIGCONT)
            p.kill()
        p.wait(timeout=10)


def hand_plan(
    slots: list[tuple[float, str, str, float, dict]],
    *,
    proxies: tuple[str, ...] = (),
    processes: tuple[str, ...] = (),
    seed: int = 1,
) -> Plan:
    """A plan with exactly these slots: (at, fault, target, duration, detail)."""
    config = PlanConfig(
        faults=catalogue(), proxies=proxies, processes=processes, duration=1e9, gap=(1, 1)
    )
    return Plan(
        seed,
        False,
        config,
        tuple(
            Slot(i, i * 10, at, fault, target, duration, detail)
            for i, (at, fault, target, duration, detail) in enumerate(slots)
        ),
    )


def chaos_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultnet", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[str]:
    """A real `faultnet server` subprocess on a free loopback port; yields its URL.
    Stopped with SIGTERM through its own handle."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--loopback-only"]
        + ["--event-log", str(tmp_path / "server-events.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(30):
                raise AssertionError("no line from the faultnet server within 30 s")
        line = proc.stdout.readline()
        yield line.split(" listening on ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
