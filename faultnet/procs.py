"""Process identity: stop exactly the process you started, never one that reused its PID.

A PID alone names a process only until it exits; the kernel then hands the number to the
next process. :class:`ProcessIdentity` pairs the PID with the process's start time (field
22 of ``/proc/PID/stat``, in clock ticks since boot), which two processes sharing a PID
cannot both have. Every signal this module sends is preceded by a re-check of that pair;
there is no way here to signal by name or pattern.

The re-check and the ``kill()`` are two system calls, so a PID could in principle be
recycled between them; on Linux that window is microseconds against a PID space of 4
million, and :func:`signal_exact` uses a pidfd where it can, which closes it entirely.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcessIdentity",
    "fd_count",
    "read_cmdline",
    "read_start_time",
    "signal_exact",
]


def read_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = stat[stat.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 is starttime.
    return int(rest[19])


def read_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def fd_count(pid: int) -> int | None:
    """How many descriptors *pid* holds now (``/proc/PID/fd``), or None if it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    """A PID pinned to one process by its start time (and, for display, its command)."""

    pid: int
    start_time: int
    cmdline: tuple[str, ...] = ()

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """Record the identity of the live process *pid* (raises ProcessLookupError)."""
        start = read_start_time(pid)
        if start is None:
            raise ProcessLookupError(pid)
        cmdline = read_cmdline(pid)
        # Caught between fork and exec (just after Popen returns), a process's cmdline
        # reads empty: 4 spawns in 40 here. Wait for the exec, bounded at ~100 ms.
        for _ in range(50):
            if cmdline or cmdline is None:
                break
            time.sleep(0.002)
            cmdline = read_cmdline(pid)
        return cls(pid, start, tuple(cmdline or ()))

    def is_alive(self) -> bool:
        """True while the PID still belongs to this process and it has not been reaped.

        A zombie (exited, not yet reaped) counts as gone.
        """
        if read_start_time(self.pid) != self.start_time:
            return False
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return state[state.rindex(")") + 2] != "Z"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cmdline"] = list(self.cmdline)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessIdentity:
        return cls(int(d["pid"]), int(d["start_time"]), tuple(d.get("cmdline", ())))


def signal_exact(ident: ProcessIdentity, sig: int = signal.SIGTERM) -> bool:
    """Send *sig* to *ident* only if its PID still names the recorded process.

    Returns True if the signal was sent, False if the process is gone or the PID now
    belongs to another process (which is then left alone).
    """
    try:
        pidfd = os.pidfd_open(ident.pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        # The pidfd pins the process: if the start time matches now, the pidfd refers to
        # the recorded process, and signalling through it cannot reach a successor.
        if read_start_time(ident.pid) != ident.start_time:
            return False
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(pidfd)
