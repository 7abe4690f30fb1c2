"""Fixtures of the chaos tests: sleeper processes to signal, hand-built plans, the
`faultnet chaos` command as a process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from faultnet.chaos import Plan, PlanConfig, Slot, catalogue
from faultnet.procs import ProcessIdentity, read_cmdline, signal_exact


def proc_state(pid: int) -> str:
    """The one-letter state of /proc/PID/stat (T: stopped, S: sleeping, Z: zombie)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def append_line(path: Path, line: str) -> None:
    """Append one allowlist line, as a spawner would."""
    with open(path, "a") as f:
        f.write(line + "\n")


SLEEP = ["sleep", "120"]


@pytest.fixture
def sleepers() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start real `sleep` processes; each is killed (by its own handle) at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(SLEEP)
        started.append(p)
        # Popen returns before the kernel sets up the new image's arguments, so
        # /proc/PID/cmdline can still read empty (ProcessIdentity.spawned; here 2 runs in 5
        # of test_register_process_pins_start_time_and_command_line recorded []): wait,
        # bounded, until the exec shows, so the tests read sleep's command line.
        deadline = time.monotonic() + 10
        while read_cmdline(p.pid) != SLEEP:
            assert time.monotonic() < deadline, f"sleep (pid {p.pid}) never showed its argv"
            time.sleep(0.001)
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


def process_plan(fault: str, *slots: tuple[float, str, float]) -> Plan:
    """A plan of *fault* (``process:stop`` or ``process:kill``) slots, each ``(at, process
    name, duration)`` with the catalogue's signal, naming exactly those processes."""
    detail = {"signal": catalogue()[fault].signal}
    return hand_plan(
        [(at, fault, f"process:{name}", duration, dict(detail)) for at, name, duration in slots],
        processes=tuple(name for _, name, _ in slots),
    )


def chaos_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultnet", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
