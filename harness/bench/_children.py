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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultnet.errors import EnvironmentProblem
from faultnet.procs import ProcessIdentity, signal_exact, stop_exact
from harness.bench._stream import CHILD_START_S, CLK_TCK, COMMAND_S, HOST, SOCAT_BUFFER
from harness.env import tcp_listen_inodes

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


def proc_cpu_ns(pid: int) -> int | None:
    """CPU time of every live thread of *pid*, in nanoseconds (/proc/PID/task/*/schedstat:
    the scheduler's own accounting, not 10 ms ticks; a thread that ended is not counted)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return None
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return total


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
        self.argv = argv
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
        """EOF on stdin (a clean exit), then SIGTERM, then SIGKILL: each by identity. A
        child started without the control channel (socat, redis) starts at SIGTERM."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        if self.proc.poll() is None:
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


def _holds(pid: int, inodes: set[str]) -> bool:
    """True if process *pid* has a descriptor on one of the sockets *inodes*."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    with contextlib.suppress(OSError), os.scandir(f"/proc/{pid}/fd") as fds:
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd.path) in wanted:
                    return True
    return False


#: Tries at a free port for a server of the bench's own (socat, redis-server): between
#: finding the port free and the server binding it, another process may take it.
LISTEN_TRIES = 3


def start_listening(argv_for: Callable[[int], list[str]], name: str) -> tuple[Child, int]:
    """Start ``argv_for(port)`` on a free loopback port and wait until that very process
    listens on it; return it and the port. A port someone else took first is given up
    for another (LISTEN_TRIES in all); EnvironmentProblem if the server never listens."""
    why = ""
    for _ in range(LISTEN_TRIES):
        port = _free_port()
        child = Child(argv_for(port), name, control=False)
        deadline = time.monotonic() + CHILD_START_S
        while True:
            # One reading of the table for both questions: whether the port listens,
            # and whether by our child (else someone else took the port).
            listening = tcp_listen_inodes(port)
            if listening and _holds(child.pid, listening):
                return child, port
            exited = child.proc.poll() is not None
            taken = bool(listening)
            if exited or taken or time.monotonic() > deadline:
                why = child._why()
                child.stop()
                if exited or taken:
                    break  # most likely the port was taken: another one
                raise EnvironmentProblem(f"{name} did not listen on port {port}{why}")
            time.sleep(0.01)  # polling the kernel's table for a state with no event
    raise EnvironmentProblem(f"{name} did not listen on a free port in {LISTEN_TRIES} tries{why}")


class Socat:
    """``socat -b 262144 TCP-LISTEN:...,fork TCP:upstream``; its forked children are
    recorded while live so that any left at the end are stopped by identity too."""

    def __init__(self, path: str, upstream_port: int) -> None:
        def argv(port: int) -> list[str]:
            return [
                path,
                "-b",
                str(SOCAT_BUFFER),
                f"TCP-LISTEN:{port},bind={HOST},reuseaddr,fork",
                f"TCP:{HOST}:{upstream_port}",
            ]

        self.child, self.port = start_listening(argv, "socat")
        self.argv = self.child.argv
        self.kids: dict[int, ProcessIdentity] = {}

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
