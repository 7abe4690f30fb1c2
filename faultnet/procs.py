"""Process identity: stop exactly the process you started, never one that reused its PID.

A PID alone names a process only until it exits; the kernel then hands the number to the
next process. :class:`ProcessIdentity` pairs the PID with the process's start time (field
22 of ``/proc/PID/stat``, in clock ticks since boot), which two processes sharing a PID
cannot both have. Every signal this module sends is preceded by a re-check of that pair;
there is no way here to signal by name or pattern.

The re-check and the ``kill()`` are two system calls, so a PID could in principle be
recycled between them; on Linux that window is microseconds against a PID space of 4
million, and :func:`signal_exact` uses a pidfd where it can, which closes it entirely.

One routine per job, used by every package that starts processes (the environment, the
MCP driver, the experiment runner, the benchmark):

* :meth:`ProcessIdentity.spawned`: the identity of a child just started, read once;
* :func:`stop_exact`: SIGTERM, a bounded wait, SIGKILL, a bounded wait, each signal
  through a pidfd after re-checking the start time, and a :class:`StopReport` of what
  happened.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ProcessActivity",
    "ProcessIdentity",
    "StopOutcome",
    "StopReport",
    "children",
    "fd_count",
    "read_cmdline",
    "read_start_time",
    "read_stat",
    "signal_exact",
    "stop_exact",
]


def read_stat(pid: int) -> str | None:
    """``/proc/PID/stat``, or None if the process is gone. Gone includes reaped between
    the file's open and its read, which the kernel answers with ESRCH
    (ProcessLookupError): seen once in a whole-suite run, from is_alive()."""
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def _field(stat: str, n: int) -> str:
    """Field *n* (numbered from 1, as proc(5) does; 3 or above) of a ``/proc/PID/stat``
    line. comm (field 2) may hold spaces and parentheses: fields are split after its
    last ')'."""
    return stat[stat.rindex(")") + 2 :].split()[n - 3]


def children(pid: int) -> list[int]:
    """The processes whose parent is *pid* (``/proc/PID/stat`` field 4), running or not
    yet reaped, whichever of its threads started them: every process's stat is read."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        if int(_field(stat, 4)) == pid:  # the parent
            out.append(int(entry.name))
    return out


def read_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it is gone."""
    stat = read_stat(pid)
    if stat is None:
        return None
    return int(_field(stat, 22))  # starttime


#: ``/proc/PID/stat`` field 3 in words (proc(5)); R covers waiting for a CPU as well.
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in an uninterruptible wait",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "exited (not yet reaped)",
}


@dataclass(frozen=True)
class ProcessActivity:
    """What a process was doing when read: its scheduler state (``/proc/PID/stat`` field
    3), the CPU it has used (user + system), how long it has lived, and the kernel
    function its main thread waits in (``/proc/PID/wchan``; "" when on a CPU or unread)."""

    state: str
    cpu_s: float
    age_s: float
    wchan: str

    def __str__(self) -> str:
        words = _STATES.get(self.state, f"in state {self.state}")
        where = f" in {self.wchan}" if self.wchan else ""
        return f"{words}{where}, {self.cpu_s:.2f} s of CPU in its {self.age_s:.1f} s"


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
        """Record the identity of the live process *pid* (raises ProcessLookupError).

        For a child this process has just started, use :meth:`spawned` instead.
        """
        start = read_start_time(pid)
        if start is None:
            raise ProcessLookupError(pid)
        return cls(pid, start, tuple(read_cmdline(pid) or ()))

    @classmethod
    def spawned(cls, pid: int, argv: Sequence[str]) -> ProcessIdentity:
        """The identity of a child this process started with *argv* and has not yet
        waited for (just after ``subprocess.Popen`` or ``trio.lowlevel.open_process``).

        Read once, and correctly: the start time is set at fork and unchanged by exec,
        and an unreaped child's ``/proc/PID`` exists even if it has already exited, so it
        is read now. The command line is *argv* itself, not ``/proc/PID/cmdline``: Popen
        returns once the exec has passed the point where the child's close-on-exec pipe
        closes, and the kernel sets up the new image's argument area only after that, so
        the file can still read empty then (measured here: 4 spawns in 40). Raises
        ProcessLookupError if *pid* has been reaped.
        """
        start = read_start_time(pid)
        if start is None:
            raise ProcessLookupError(pid)
        return cls(pid, start, tuple(argv))

    def is_alive(self) -> bool:
        """True while the PID still belongs to this process and it has not been reaped.

        A zombie (exited, not yet reaped) counts as gone.
        """
        if read_start_time(self.pid) != self.start_time:
            return False
        stat = read_stat(self.pid)  # None: reaped since the line above
        return stat is not None and _field(stat, 3) != "Z"

    def activity(self) -> ProcessActivity | None:
        """What this process is doing now, from one read of ``/proc/PID/stat``; None once
        it is gone (reaped, or its PID now another process's)."""
        stat = read_stat(self.pid)
        if stat is None:
            return None
        if int(_field(stat, 22)) != self.start_time:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        try:
            wchan = Path(f"/proc/{self.pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        return ProcessActivity(
            state=_field(stat, 3),
            cpu_s=(int(_field(stat, 14)) + int(_field(stat, 15))) / tick,  # utime, stime
            age_s=time.clock_gettime(time.CLOCK_BOOTTIME) - self.start_time / tick,
            wchan="" if wchan == "0" else wchan,  # "0": on a CPU, waiting in nothing
        )

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
        return _signal_pinned(pidfd, ident, sig)
    finally:
        os.close(pidfd)


def _signal_pinned(pidfd: int, ident: ProcessIdentity, sig: int) -> bool:
    # The pidfd pins the process: if the start time matches now, the pidfd refers to the
    # recorded process, and signalling through it cannot reach a successor.
    if read_start_time(ident.pid) != ident.start_time:
        return False
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


StopOutcome = Literal["gone", "not-ours", "stopped", "killed", "survived"]


@dataclass(frozen=True)
class StopReport:
    """What :func:`stop_exact` did to one recorded process.

    ``outcome`` is one of:

    * ``"gone"``: the recorded process had exited (or was a zombie) before any signal;
      nothing was sent;
    * ``"not-ours"``: the PID names another process now (another start time); nothing
      was sent to it;
    * ``"stopped"``: SIGTERM was sent and it exited within ``term_timeout``;
    * ``"killed"``: it outlived SIGTERM's bound, SIGKILL was sent and it exited;
    * ``"survived"``: still there ``kill_timeout`` after SIGKILL (uninterruptible sleep).

    ``signals`` lists the signals delivered, in order; ``seconds`` the time it all took.
    """

    pid: int
    outcome: StopOutcome
    signals: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def ended(self) -> bool:
        """True unless the process survived SIGKILL (nothing left of it to stop)."""
        return self.outcome != "survived"


def stop_exact(
    ident: ProcessIdentity, *, term_timeout: float = 5.0, kill_timeout: float = 5.0
) -> StopReport:
    """Stop the recorded process: SIGTERM, wait up to *term_timeout* seconds for it to
    exit; if it has not, SIGKILL and wait up to *kill_timeout*. Blocks for at most the
    sum of the two bounds.

    Every signal goes through one pidfd opened at the start, after the start time is
    re-checked, so neither can reach a process that took the PID over. Exiting means
    what :meth:`ProcessIdentity.is_alive` means (a zombie has exited); reaping a child
    is its parent's business (``Popen.wait``), not this function's.
    """
    t0 = time.monotonic()
    sent: list[str] = []

    def report(outcome: StopOutcome) -> StopReport:
        return StopReport(ident.pid, outcome, tuple(sent), time.monotonic() - t0)

    try:
        pidfd: int | None = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return report("gone")
    except OSError:  # no pidfd here (pre-5.3 kernel): signal_exact's re-check alone
        pidfd = None
    try:
        now = read_start_time(ident.pid)
        if now is not None and now != ident.start_time:
            return report("not-ours")
        if not ident.is_alive():
            return report("gone")
        for sig, bound, outcome in (
            (signal.SIGTERM, term_timeout, "stopped"),
            (signal.SIGKILL, kill_timeout, "killed"),
        ):
            ok = (
                _signal_pinned(pidfd, ident, sig) if pidfd is not None else signal_exact(ident, sig)
            )
            if not ok:  # it exited between the last look and this signal
                return report("stopped" if sent else "gone")
            sent.append(signal.Signals(sig).name)
            if _wait_exit(ident, pidfd, bound):
                return report(outcome)  # type: ignore[arg-type]
        return report("survived")
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _wait_exit(ident: ProcessIdentity, pidfd: int | None, timeout: float) -> bool:
    """Wait up to *timeout* seconds for *ident* to exit; True if it did."""
    deadline = time.monotonic() + timeout
    while ident.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            # A pidfd polls readable once the process has exited: no busy wait.
            select.select([pidfd], [], [], min(left, 0.2))
        else:
            time.sleep(min(left, 0.02))  # no pidfd: poll, bounded by the deadline
    return True
