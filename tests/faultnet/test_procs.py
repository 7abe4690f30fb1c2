"""faultnet.procs: a recorded identity is signalled only while it names the same process."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys

from faultnet.procs import ProcessIdentity, fd_count, read_start_time, signal_exact


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_signal_exact_reaches_the_recorded_process() -> None:
    p = _sleeper()
    try:
        ident = ProcessIdentity.of(p.pid)
        assert ident.is_alive() and ident.cmdline[0] == sys.executable
        assert signal_exact(ident, signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
        assert not ident.is_alive()
        assert not signal_exact(ident, signal.SIGTERM)  # gone: reported, nothing sent
    finally:
        p.kill()
        p.wait()


def test_a_pid_with_another_start_time_is_never_signalled() -> None:
    p = _sleeper()
    try:
        real = ProcessIdentity.of(p.pid)
        # The same PID recorded with a different start time: what a recycled PID looks like.
        recycled = dataclasses.replace(real, start_time=real.start_time - 1)
        assert not recycled.is_alive()
        assert not signal_exact(recycled, signal.SIGKILL)
        assert p.poll() is None, "a process that merely shares the PID was signalled"
    finally:
        p.kill()
        p.wait()


def test_identity_round_trips_through_json_and_reads_proc() -> None:
    p = _sleeper()
    try:
        ident = ProcessIdentity.of(p.pid)
        assert ProcessIdentity.from_json(ident.to_json()) == ident
        assert read_start_time(p.pid) == ident.start_time
        assert (fd_count(p.pid) or 0) >= 3
    finally:
        p.kill()
        p.wait()
    assert read_start_time(p.pid) is None
    assert fd_count(p.pid) is None
