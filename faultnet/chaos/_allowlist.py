"""The PID allowlist: the only processes chaos may signal.

The file is appended to by whoever spawns a process, one line per process::

    pid<TAB>name[<TAB>start_time<TAB>cmdline]

``start_time`` is field 22 of ``/proc/PID/stat`` and ``cmdline`` a JSON array, as
:func:`register_process` writes them (one ``write()`` per line on ``O_APPEND``, so
spawners never interleave).

Pinning. Chaos pins EVERY line when a run starts, before its first fault
(:meth:`Allowlist.pin`): a line with a start time is pinned to it; a line with only
``pid`` and ``name`` is pinned to the process holding that PID at that moment, and a
pidfd of that process is held until the run ends: a start time counts 10 ms ticks and a
command line read mid-exec is empty, so a successor started in the same tick could pass
the identity check; the pidfd never names it (once its process exits, verify refuses and
signal reaches nobody). A line with a start time is held by a pidfd from the pin on too.
A line that cannot be pinned is a refusal the runner logs: malformed, its PID gone at
the start, or, in either form, a process that started after the file was last written
(its modification time): that process cannot be the one the line names; its PID was
reused between the spawner's line and the pin (seen with ``unshare --pid``: the
newcomer was stopped twice). A line appended later moves the modification time on, so
a successor that started before the LAST write still passes for a two-column line: the
start time that :func:`register_process` writes is what pins a line exactly. A two-column line that appears AFTER the pin is refused, never pinned: by then the
PID may already name another process (seen with ``unshare --pid``: a listed process
exited, its PID was reused, and the newcomer was stopped), so a spawner that registers
processes during a run must give the start time (:func:`register_process` does).

A later line for the same name replaces the earlier one (a process respawned under the
same name). Chaos re-reads the file before EVERY signal and re-verifies the identity of
the entry (start time and command line) immediately before sending it, through a pidfd
(:func:`faultnet.procs.signal_exact`): nothing whose start time differs from its pin is
ever signalled.

The working-directory rail (``pid-cwd``, off unless a root is given: ``--pid-cwd DIR``):
a listed process whose working directory is not the root or below it is refused, so a
stale allowlist cannot reach a process of another run or of the user's desktop.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from faultnet.eventlog import flatten
from faultnet.procs import ProcessIdentity, read_cmdline, read_start_time, signal_exact

__all__ = ["Allowlist", "Refusal", "Verdict", "parse_lines", "register_process"]


def register_process(path: str | os.PathLike[str], name: str, pid: int) -> ProcessIdentity:
    """Append *pid* under *name*, pinned to its start time and command line, in one
    write. Returns the identity recorded (ProcessLookupError if *pid* is gone)."""
    if "\t" in name or "\n" in name or not name:
        raise ValueError(f"a process name is one word without TAB or newline, not {name!r}")
    ident = ProcessIdentity.of(pid)
    line = f"{pid}\t{name}\t{ident.start_time}\t{flatten(list(ident.cmdline))}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return ident


@dataclass(frozen=True)
class Verdict:
    """What the allowlist says about a name right now."""

    #: The identity to signal, or None when a rail says no.
    identity: ProcessIdentity | None
    #: Why not (None when allowed): "not listed", "gone", "pid reused: ...".
    reason: str | None
    pid: int | None = None
    #: The rail that said no: "pid-allowlist", or "pid-cwd" (the working directory).
    rail: str = "pid-allowlist"


@dataclass(frozen=True)
class Refusal:
    """A line of the allowlist that could not be pinned."""

    line: int
    name: str
    pid: int | None
    reason: str


@dataclass(frozen=True)
class _Line:
    number: int
    pid: int
    name: str
    start_time: int | None
    cmdline: tuple[str, ...]


def parse_lines(text: str) -> tuple[list[_Line], list[Refusal]]:
    """The lines of an allowlist, and the malformed ones as refusals (blank lines are
    skipped)."""
    lines: list[_Line] = []
    bad: list[Refusal] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        parts = raw.split("\t")
        name = parts[1] if len(parts) >= 2 else ""
        if len(parts) < 2 or not parts[0].isdigit() or not name:
            bad.append(Refusal(number, name, None, "malformed: not pid<TAB>name[<TAB>...]"))
            continue
        start: int | None = None
        cmdline: tuple[str, ...] = ()
        if len(parts) >= 3:
            if not parts[2].isdigit():
                bad.append(Refusal(number, name, int(parts[0]), "malformed: start time"))
                continue
            start = int(parts[2])
        if len(parts) >= 4:
            try:
                cmdline = tuple(json.loads(parts[3]))
            except (ValueError, TypeError):
                bad.append(Refusal(number, name, int(parts[0]), "malformed: command line"))
                continue
        lines.append(_Line(number, int(parts[0]), name, start, cmdline))
    return lines, bad


#: Seconds a start time may pass the file's modification time and still count as
#: before it: a start time counts clock ticks (10 ms, truncated) and a file's mtime is
#: taken from the kernel's coarse clock (one jiffy late at most: 4 ms at HZ=250).
START_SLACK_S = 0.02


def started_at(start_time: int) -> float:
    """Wall-clock time (seconds since the epoch) of a process start time (field 22 of
    ``/proc/PID/stat``: clock ticks since boot)."""
    since = time.clock_gettime(time.CLOCK_BOOTTIME) - start_time / os.sysconf("SC_CLK_TCK")
    return time.time() - since


def _started_after(start_time: int, written: float) -> str | None:
    """Why a process with *start_time* cannot be the one a line of a file last written
    at *written* names (it started after the file was written), or None."""
    late = started_at(start_time) - written
    if late <= START_SLACK_S:
        return None
    return (
        f"started {late:.2f} s after the allowlist was last written: not the process "
        "its line names (its PID was reused)"
    )


def _pidfd_alive(pidfd: int) -> bool:
    """Whether the process behind *pidfd* has not exited yet (signal 0 through it)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return True


def read_cwd(pid: int) -> Path | None:
    """The working directory of *pid*, or None if it cannot be read."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


class Allowlist:
    """Reads the allowlist file and verifies entries; remembers what it pinned."""

    def __init__(
        self, path: str | os.PathLike[str] | None, *, cwd_root: str | os.PathLike[str] | None = None
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.cwd_root = Path(cwd_root).resolve() if cwd_root is not None else None
        #: (line number, pid, name) -> identity pinned by :meth:`pin` (two-column lines).
        self._pinned: dict[tuple[int, int, str], ProcessIdentity] = {}
        #: The same key -> why the pin refused it (two-column lines gone at the pin).
        self._refused: dict[tuple[int, int, str], str] = {}
        #: (pid, start time) of each pinned identity -> a pidfd of that very process,
        #: held from the pin on. The start time counts 10 ms ticks and a command line
        #: read mid-exec is empty, so a successor started in the same tick could pass
        #: for it (seen once in a whole-suite run); the pidfd cannot: once its process
        #: has exited, it never names another.
        self._pidfds: dict[tuple[int, int], int] = {}
        self._pinned_at: bool = False

    def _read(self) -> tuple[str, float]:
        """The file's text and its modification time (wall clock, seconds), read from
        one open file (no file: ``""`` and infinity, which refuses nothing)."""
        if self.path is None:
            return "", math.inf
        try:
            with open(self.path, "rb") as f:
                return f.read().decode(errors="replace"), os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return "", math.inf

    def pin(self) -> list[Refusal]:
        """Pin every line now (see the module's docstring); return the lines refused.
        Called once, by the runner, before its first fault; later calls re-pin nothing."""
        if self._pinned_at:
            return []
        self._pinned_at = True
        if self.path is not None and not self.path.is_file():
            return [Refusal(0, "", None, f"allowlist {self.path} is not a readable file")]
        text, written = self._read()
        lines, refused = parse_lines(text)
        for ln in lines:
            key = (ln.number, ln.pid, ln.name)
            if ln.start_time is not None:
                listed = ProcessIdentity(ln.pid, ln.start_time, ln.cmdline)
                late = _started_after(ln.start_time, written)
                if late is not None:
                    refused.append(Refusal(ln.number, ln.name, ln.pid, late))
                elif read_start_time(ln.pid) is None:
                    refused.append(Refusal(ln.number, ln.name, ln.pid, "gone at the pin"))
                elif (verdict := self.check(listed)).identity is None:
                    reason = f"{verdict.reason} at the pin"
                    refused.append(Refusal(ln.number, ln.name, ln.pid, reason))
                else:
                    self._pin_one(ln.pid, listed)  # its pidfd, as for a plain line
                continue
            ident = self._pin_one(ln.pid)
            why = "gone at the pin" if ident is None else _started_after(ident.start_time, written)
            if why is None and ident is not None:
                self._pinned[key] = ident
                continue
            if ident is not None:  # not the process its line names: no pidfd of it kept
                pidfd = self._pidfds.pop((ident.pid, ident.start_time), None)
                if pidfd is not None:
                    os.close(pidfd)
            self._refused[key] = str(why)
            refused.append(Refusal(ln.number, ln.name, ln.pid, str(why)))
        return sorted(refused, key=lambda r: r.line)

    def _pin_one(self, pid: int, listed: ProcessIdentity | None = None) -> ProcessIdentity | None:
        # The pidfd first, then the identity read from /proc, then the pidfd still live:
        # so what /proc said is of the pidfd's process (a PID is reused only after its
        # process is gone). A *listed* identity must still be the one /proc gives.
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        try:
            ident = ProcessIdentity.of(pid)
        except ProcessLookupError:
            ident = None
        if listed is not None and ident is not None and ident.start_time != listed.start_time:
            ident = None
        if ident is None or not _pidfd_alive(pidfd):
            os.close(pidfd)
            return None
        old = self._pidfds.pop((ident.pid, ident.start_time), None)
        if old is not None:  # the same process on two lines: one descriptor is enough
            os.close(old)
        self._pidfds[(ident.pid, ident.start_time)] = pidfd
        return ident

    def close(self) -> None:
        """Close the pidfds the pin holds (the runner does, at its end)."""
        for pidfd in self._pidfds.values():
            os.close(pidfd)
        self._pidfds.clear()

    def entries(self) -> dict[str, ProcessIdentity | str]:
        """Name -> the identity listed (or pinned), or why that name's line cannot be
        signalled; the last line per name winning. Pins first if :meth:`pin` was not
        called."""
        self.pin()
        out: dict[str, ProcessIdentity | str] = {}
        text, written = self._read()
        lines, bad = parse_lines(text)
        for refusal in bad:
            if refusal.name:
                out[refusal.name] = refusal.reason
        for ln in sorted(lines, key=lambda x: x.number):
            if ln.start_time is not None:
                late = _started_after(ln.start_time, written)
                out[ln.name] = late or ProcessIdentity(ln.pid, ln.start_time, ln.cmdline)
                continue
            key = (ln.number, ln.pid, ln.name)
            out[ln.name] = self._pinned.get(key) or self._refused.get(
                key, "unpinned: a line without a start time listed after the pin"
            )
        return out

    def verify(self, name: str) -> Verdict:
        """Whether *name* may be signalled now: listed and pinned, alive, still the
        process listed (same start time, and the same command line where one was
        recorded), and, with a cwd root, working under it."""
        listed = self.entries().get(name)
        if listed is None:
            return Verdict(None, "not listed")
        if isinstance(listed, str):
            return Verdict(None, listed)
        verdict = self.check(listed)
        pidfd = self._pidfds.get((listed.pid, listed.start_time))
        if verdict.identity is not None and pidfd is not None and not _pidfd_alive(pidfd):
            return Verdict(
                None, "pid reused: the process pinned at the start has exited", listed.pid
            )
        if verdict.identity is None or self.cwd_root is None:
            return verdict
        cwd = read_cwd(listed.pid)
        if cwd is None:
            return Verdict(None, "working directory unreadable", listed.pid, "pid-cwd")
        if cwd != self.cwd_root and self.cwd_root not in cwd.parents:
            return Verdict(
                None,
                f"working directory {cwd} is not under {self.cwd_root}",
                listed.pid,
                "pid-cwd",
            )
        return verdict

    @staticmethod
    def check(listed: ProcessIdentity) -> Verdict:
        """Whether *listed*'s PID still names that process: the start time first (what
        two processes sharing a PID cannot share), then alive (not a zombie), then the
        command line where one was recorded."""
        start = read_start_time(listed.pid)
        if start is None:
            return Verdict(None, "gone", listed.pid)
        if start != listed.start_time:
            return Verdict(None, "pid reused: start time differs from the listed one", listed.pid)
        if not listed.is_alive():
            return Verdict(None, "gone", listed.pid)
        if listed.cmdline and tuple(read_cmdline(listed.pid) or ()) != listed.cmdline:
            return Verdict(None, "pid reused: command line differs from the listed one", listed.pid)
        return Verdict(listed, None, listed.pid)

    def signal(self, listed: ProcessIdentity, sig: int) -> bool:
        """Send *sig* through a pidfd if the PID still names *listed* (False if not):
        the one held since the pin where there is one."""
        pidfd = self._pidfds.get((listed.pid, listed.start_time))
        if pidfd is None:
            return signal_exact(listed, sig)
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            return False
        return True
