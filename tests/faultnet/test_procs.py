"""faultnet.procs: a recorded identity is signalled only while it names the same process,
and stop_exact reports what it did."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from faultnet import procs
from faultnet.procs import (
    ProcessIdentity,
    fd_count,
    read_start_time,
    signal_exact,
    stop_exact,
)

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# Ignores SIGTERM; says so on stdout once the handler is in place.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)",
]


@contextmanager
def child(argv: list[str] = SLEEP) -> Iterator[tuple[subprocess.Popen[bytes], ProcessIdentity]]:
    """A child of ours and its identity; killed (through its Popen) and reaped after."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        yield p, ProcessIdentity.spawned(p.pid, argv)
    finally:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


def test_signal_exact_reaches_the_recorded_process() -> None:
    with child() as (p, ident):
        assert ident.is_alive() and ident.cmdline == tuple(SLEEP)
        assert signal_exact(ident, signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
        assert not ident.is_alive()
        assert not signal_exact(ident, signal.SIGTERM)  # gone: reported, nothing sent


def test_a_pid_with_another_start_time_is_never_signalled() -> None:
    with child() as (p, real):
        # The same PID recorded with a different start time: what a recycled PID looks like.
        recycled = dataclasses.replace(real, start_time=real.start_time - 1)
        assert not recycled.is_alive()
        assert not signal_exact(recycled, signal.SIGKILL)
        assert stop_exact(recycled).outcome == "not-ours"
        assert p.poll() is None, "a process that merely shares the PID was signalled"


def test_activity_describes_the_recorded_process_and_never_a_pid_s_new_owner() -> None:
    # 0.2 s of CPU, then asleep: the CPU figure is the process's own.
    spin = "import time\nwhile time.process_time() < 0.2: pass\nprint('ready', flush=True)\n"
    with child([sys.executable, "-c", spin + "time.sleep(60)"]) as (p, real):
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 10  # from its print into its sleep
        while (now := real.activity()) and now.state == "R" and time.monotonic() < deadline:
            time.sleep(0.001)
        # /proc counts whole clock ticks (10 ms): 0.19 s read for these 0.2 s.
        assert now is not None and now.state == "S" and 0.15 <= now.cpu_s <= now.age_s, now
        assert str(now).startswith("sleeping"), now
        recycled = dataclasses.replace(real, start_time=real.start_time - 1)
        assert recycled.activity() is None
    assert real.activity() is None  # reaped


def test_breaking_the_start_time_check_signals_the_stranger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The breakage the test above guards against: with the start-time check trusting
    the PID alone, stop_exact stops the process that merely shares it."""
    with child() as (p, real):
        recycled = dataclasses.replace(real, start_time=real.start_time - 1)
        monkeypatch.setattr(procs, "read_start_time", lambda pid: recycled.start_time)
        report = stop_exact(recycled, term_timeout=10)
        assert report.outcome == "stopped" and report.signals == ("SIGTERM",)
        assert p.wait(10) == -signal.SIGTERM


def test_stop_exact_stops_by_term_and_reports_it() -> None:
    with child() as (p, ident):
        report = stop_exact(ident, term_timeout=10)
        assert (report.pid, report.outcome, report.signals) == (p.pid, "stopped", ("SIGTERM",))
        assert report.ended and p.wait(1) == -signal.SIGTERM


def test_stop_exact_kills_what_ignores_term_after_the_bound() -> None:
    with child(STUBBORN) as (p, ident):
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        report = stop_exact(ident, term_timeout=0.3, kill_timeout=10)
        assert (report.outcome, report.signals) == ("killed", ("SIGTERM", "SIGKILL"))
        assert report.seconds >= 0.3 and p.wait(1) == -signal.SIGKILL


def test_stop_exact_sends_nothing_to_a_process_already_gone() -> None:
    with child() as (p, ident):
        p.kill()
        p.wait()  # exited and reaped: its PID names nothing (or a stranger)
        report = stop_exact(ident)
        assert report.outcome in ("gone", "not-ours") and report.signals == ()


def test_an_exited_unreaped_child_is_gone_not_signalled() -> None:
    with child() as (p, ident):
        p.kill()
        # Wait for the exit without reaping: a zombie keeps our PID and start time, but
        # there is nothing left to stop.
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
        assert read_start_time(p.pid) == ident.start_time
        report = stop_exact(ident)
        assert (report.outcome, report.signals) == ("gone", ())


def test_spawned_records_the_argv_at_once_for_every_spawn() -> None:
    """The command line of a just-started child is the argv it was given, in every one
    of 40 spawns (read from /proc at that moment, it can be empty)."""
    argv = [shutil.which("true") or "/bin/true"]
    for _ in range(40):
        p = subprocess.Popen(argv)
        try:
            ident = ProcessIdentity.spawned(p.pid, argv)
            assert ident.cmdline == tuple(argv) and ident.start_time == read_start_time(p.pid)
        finally:
            p.wait()
    with pytest.raises(ProcessLookupError):
        ProcessIdentity.spawned(p.pid, argv)  # reaped: no identity to read


def test_identity_round_trips_through_json_and_reads_proc() -> None:
    with child() as (p, ident):
        assert ProcessIdentity.from_json(ident.to_json()) == ident
        assert read_start_time(p.pid) == ident.start_time
        assert (fd_count(p.pid) or 0) >= 3
        pid = p.pid
    assert read_start_time(pid) is None
    assert fd_count(pid) is None


def test_the_kernel_answers_a_read_after_the_reap_with_esrch() -> None:
    # The window the next test covers, made on purpose: /proc/PID/stat opened while the
    # child lives, read after it was reaped.
    with child() as (p, _ident):
        with open(f"/proc/{p.pid}/stat") as f:
            p.kill()
            p.wait()
            with pytest.raises(ProcessLookupError):
                f.read()


def test_a_process_reaped_between_two_reads_of_its_stat_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A mock, because the moment between is_alive()'s reads of /proc/PID/stat cannot be
    # hit on demand (a whole-suite run met it once: ProcessLookupError out of
    # stop_exact); the test above shows the kernel's answer. Here the first read sees
    # the process, every later one meets the reap.
    with child() as (p, ident):
        real, reads = procs.Path.read_text, []

        def reaped(self: procs.Path, *args: object, **kwargs: object) -> str:
            if str(self) == f"/proc/{p.pid}/stat":
                reads.append(self)
                if len(reads) > 1:
                    raise ProcessLookupError(3, "No such process")
            return real(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(procs.Path, "read_text", reaped)
        assert ident.is_alive() is False
        assert stop_exact(ident).outcome == "gone"
