"""The benchmark's child processes (upstream, faultnet proxy, socat), started and stopped
by recorded identity (:mod:`faultnet.procs`), and what /proc says about their CPU and memory."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from faultnet.errors import EnvironmentProblem
from faultnet.procs import ProcessIdentity, signal_exact, stop_exact
from harness.bench._stream import CHILD_START_S, CLK_TCK, COMMAND_S, HOST, SOCAT_BUFFER

# ---------------------------------------------------------------------------------------
# /proc readers


def proc_cpu_s(pid: int, children: bool = False) -> float | None:
    """utime+stime of *pid* in seconds (plus reaped children's with *children*)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    f = stat[stat.rindex(")") + 2 :].split()
    # f[0] is field 3; utime, stime, cutime, cstime are fields 14-17.
    ticks = int(f[11]) + int(f[12])
    if children:
        ticks += int(f[13]) + int(f[14])
    return ticks / CLK_TCK


def proc_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def proc_children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return []


# ---------------------------------------------------------------------------------------
# Children, started and stopped by recorded identity


class Child:
    """A process of ours with a line-based JSON control channel on stdin/stdout."""

    def __init__(self, argv: list[str], name: str, control: bool = True) -> None:
        self.name = name
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if control else subprocess.DEVNULL,
                stdout=subprocess.PIPE if control else subprocess.DEVNULL,
                stderr=self._stderr,
                close_fds=True,
            )
        except OSError as exc:
            self._stderr.close()
            raise EnvironmentProblem(f"cannot start {name}: {exc}") from None
        self.ident = ProcessIdentity.spawned(self.proc.pid, argv)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_json(self, timeout: float) -> dict[str, Any]:
        """The next JSON line from the child; EnvironmentProblem if none within *timeout*."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise EnvironmentProblem(
                        f"{self.name}: no answer within {timeout:g} s{self._why()}"
                    )
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EnvironmentProblem(f"{self.name} exited{self._why()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise EnvironmentProblem(f"{self.name}: {reply['error']}")
        return reply

    def request(self, command: str, timeout: float = COMMAND_S) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EnvironmentProblem(f"{self.name} exited{self._why()}") from None
        return self.read_json(timeout)

    def _why(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return f": {lines[-1]}" if lines else ""

    def stop(self, grace: float = 5.0) -> None:
        """EOF on stdin (a clean exit), then SIGTERM, then SIGKILL: each by identity."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            stop_exact(self.ident, term_timeout=grace, kill_timeout=grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)  # reap it
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def _self_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.bench", *args]


def _free_port() -> int:
    s = socket.socket()
    s.bind((HOST, 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _listening(port: int) -> bool:
    """True if something listens on 127.0.0.1:*port* (read from /proc/net/tcp, so the
    check opens no connection)."""
    want = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(p[1] == want and p[3] == "0A" for p in (line.split() for line in lines))


class Socat:
    """``socat -b 262144 TCP-LISTEN:...,fork TCP:upstream``; its forked children are
    recorded while live so that any left at the end are stopped by identity too."""

    def __init__(self, path: str, upstream_port: int) -> None:
        self.port = _free_port()
        argv = [
            path,
            "-b",
            str(SOCAT_BUFFER),
            f"TCP-LISTEN:{self.port},bind={HOST},reuseaddr,fork",
            f"TCP:{HOST}:{upstream_port}",
        ]
        self.argv = argv
        self.child = Child(argv, "socat", control=False)
        self.kids: dict[int, ProcessIdentity] = {}
        deadline = time.monotonic() + CHILD_START_S
        while not _listening(self.port):
            if self.child.proc.poll() is not None or time.monotonic() > deadline:
                why = self.child._why()
                self.child.stop()
                raise EnvironmentProblem(f"socat did not start listening on port {self.port}{why}")
            time.sleep(0.01)  # polling the kernel's table for a state with no event

    def note_children(self) -> None:
        for pid in proc_children(self.child.pid):
            if pid not in self.kids:
                try:
                    self.kids[pid] = ProcessIdentity.of(pid)
                except ProcessLookupError:
                    pass

    def wait_reaped(self, timeout: float = 2.0) -> None:
        """Wait until socat has reaped its per-connection children (so their CPU shows
        in its cutime/cstime)."""
        deadline = time.monotonic() + timeout
        while proc_children(self.child.pid) and time.monotonic() < deadline:
            time.sleep(0.005)  # no event to wait on for another process's reaping

    def stop(self) -> None:
        self.note_children()
        self.child.stop(grace=2.0)
        for ident in self.kids.values():
            if ident.is_alive():
                signal_exact(ident, signal.SIGTERM)
