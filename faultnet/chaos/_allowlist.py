"""The PID allowlist: the only processes chaos may signal.

The file is appended to by whoever spawns a process, one line per process::

    pid<TAB>name[<TAB>start_time<TAB>cmdline]

``start_time`` is field 22 of ``/proc/PID/stat`` and ``cmdline`` a JSON array, as
:func:`register_process` writes them (one ``write()`` per line on ``O_APPEND``, so
spawners never interleave). A line with only ``pid`` and ``name`` is pinned to the
process that holds the PID when chaos first reads the line; that is as good as the
spawner's word and no better, so spawners should use :func:`register_process`.

A later line for the same name replaces the earlier one (a process respawned under the
same name). Chaos re-reads the file before EVERY signal and re-verifies the identity of
the entry (start time and command line) immediately before sending it, through a pidfd
(:func:`faultnet.procs.signal_exact`), because PIDs are recycled: an entry naming a
process that has exited can name a different process by the time it is read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from faultnet.eventlog import flatten
from faultnet.procs import ProcessIdentity, read_cmdline, read_start_time, signal_exact

__all__ = ["Allowlist", "Verdict", "register_process"]


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


class Allowlist:
    """Reads the allowlist file and verifies entries; remembers what it pinned."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        #: (pid, name) -> identity pinned at first sight (two-column lines only).
        self._pinned: dict[tuple[int, str], ProcessIdentity] = {}

    def entries(self) -> dict[str, ProcessIdentity]:
        """Name -> the identity listed (or pinned now), the last line per name winning.
        Malformed lines are skipped (the file belongs to the spawners)."""
        out: dict[str, ProcessIdentity] = {}
        if self.path is None:
            return out
        try:
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) < 2 or not parts[0].isdigit() or not parts[1]:
                continue
            pid, name = int(parts[0]), parts[1]
            if len(parts) >= 3 and parts[2].isdigit():
                cmdline: tuple[str, ...] = ()
                if len(parts) >= 4:
                    try:
                        cmdline = tuple(json.loads(parts[3]))
                    except (ValueError, TypeError):
                        continue
                out[name] = ProcessIdentity(pid, int(parts[2]), cmdline)
                continue
            ident = self._pinned.get((pid, name))
            if ident is None:
                try:
                    ident = ProcessIdentity.of(pid)
                except ProcessLookupError:
                    ident = ProcessIdentity(pid, -1)  # gone at first sight: never matches
                self._pinned[(pid, name)] = ident
            out[name] = ident
        return out

    def verify(self, name: str) -> Verdict:
        """Whether *name* may be signalled now: listed, alive, and still the process
        listed (same start time, and the same command line where one was recorded)."""
        listed = self.entries().get(name)
        if listed is None:
            return Verdict(None, "not listed")
        return self.check(listed)

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
        """Send *sig* through a pidfd if the PID still names *listed* (False if not)."""
        return signal_exact(listed, sig)
