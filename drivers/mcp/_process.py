"""The driven server process: pipes, captured stderr, identity, and a bounded close.

Signals go only to the exact process this module started: every one is sent through
:func:`faultnet.procs.signal_exact`, which re-checks the recorded start time and signals
through a pidfd. Children the server spawned are not signalled (a server that forks
helpers must stop them itself when its stdin closes or it gets SIGTERM).
"""

from __future__ import annotations

import collections
import functools
import math
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import trio

from faultnet.procs import ProcessIdentity, StopOutcome, fd_count, stop_exact

from ._errors import StartError
from ._framing import LineFramer
from ._inbox import Pulse

__all__ = [
    "DEFAULT_CLOSE_TIMEOUTS",
    "CloseReport",
    "CloseTimeouts",
    "ServerProcess",
    "StderrLine",
]

#: A stderr line longer than this is kept in pieces of this size.
STDERR_LINE_LIMIT = 64 * 1024
#: Captured stderr kept in memory; the oldest lines are dropped beyond it.
STDERR_KEEP_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class StderrLine:
    """One line the server wrote on stderr, stamped when the driver read it."""

    wall: float
    mono: float
    text: str


@dataclass(frozen=True)
class CloseTimeouts:
    """Bounds, in seconds, of each step of :meth:`ServerProcess.close`.

    ``eof``: wait after closing stdin; ``term``: wait after SIGTERM; ``kill``: wait after
    SIGKILL (a process in uninterruptible sleep can outlive even that: reported as
    ``unkillable``).
    """

    eof: float = 5.0
    term: float = 3.0
    kill: float = 3.0


DEFAULT_CLOSE_TIMEOUTS = CloseTimeouts()


@dataclass(frozen=True)
class CloseReport:
    """How the process ended.

    ``how`` is one of ``already_exited`` (it had exited before close began),
    ``stdin_eof`` (it exited after its stdin closed), ``sigterm``, ``sigkill``,
    ``unkillable`` (still there after SIGKILL's bound). ``signals`` lists the signals
    actually delivered, in order.
    """

    how: str
    returncode: int | None
    seconds: float
    signals: tuple[str, ...] = field(default=())


#: CloseReport.how for each stop_exact outcome. "gone": it exited on its own just after
#: the stdin-EOF bound, before any signal. "not-ours": our unreaped child's PID cannot
#: change hands, so its recorded identity was wrong; nothing was signalled and it is
#: still there, as after a SIGKILL that did not take.
_CLOSE_HOW: dict[StopOutcome, str] = {
    "gone": "stdin_eof",
    "not-ours": "unkillable",
    "stopped": "sigterm",
    "killed": "sigkill",
    "survived": "unkillable",
}


class ServerProcess:
    """A child process with stdin/stdout pipes and line-captured stderr.

    Create it with :meth:`start`, then run :meth:`read_stderr` in a nursery. stdout is
    left to the caller (the MCP client reads it).
    """

    def __init__(self, proc: trio.Process, argv: Sequence[str], identity: ProcessIdentity) -> None:
        self._proc = proc
        self.argv = list(argv)
        #: The exact process started (PID + start time); every signal is checked against it.
        self.identity = identity
        self.started_wall = time.time()
        self._stderr: collections.deque[StderrLine] = collections.deque()
        self._stderr_bytes = 0
        #: Lines dropped from the front of the capture to keep it under STDERR_KEEP_BYTES.
        self.stderr_dropped = 0
        self._stderr_count = 0
        self._stderr_changed = Pulse()
        self.stderr_closed = trio.Event()
        self._close_report: CloseReport | None = None
        self._close_lock = trio.Lock()

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> ServerProcess:
        """Start ``argv`` with stdin, stdout and stderr on pipes.

        ``env`` replaces the environment (as in :mod:`subprocess`); None inherits ours.
        Raises :class:`StartError` if the command cannot be executed.
        """
        if isinstance(argv, str | bytes) or not argv:
            raise StartError("the server command must be a non-empty list of arguments")
        try:
            proc = await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
        except OSError as exc:
            raise StartError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        identity = ProcessIdentity.spawned(proc.pid, argv)
        return cls(proc, argv, identity)

    # -- state ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.identity.pid

    @property
    def stdin(self) -> trio.abc.SendStream:
        assert self._proc.stdin is not None
        return self._proc.stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        assert self._proc.stdout is not None
        return self._proc.stdout

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal)."""
        return self._proc.poll()

    def alive(self) -> bool:
        """True while the process started is running (an unreaped zombie counts as gone)."""
        return self._proc.poll() is None and self.identity.is_alive()

    def fd_count(self) -> int | None:
        """Descriptors the process holds now (``/proc/PID/fd``); None once it is gone."""
        if not self.alive():
            return None
        return fd_count(self.pid)

    async def wait(self) -> int:
        """Wait for the process to exit; return its status."""
        return await self._proc.wait()

    # -- stderr --------------------------------------------------------------------

    async def read_stderr(self) -> None:
        """Capture stderr line by line until EOF (run this in a nursery)."""
        assert self._proc.stderr is not None
        framer = LineFramer(STDERR_LINE_LIMIT, mode="split")
        try:
            while True:
                try:
                    data = await self._proc.stderr.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                self._add_stderr(framer.feed(data))
            self._add_stderr(framer.end())
        finally:
            self.stderr_closed.set()
            self._stderr_changed.fire()

    def _add_stderr(self, items: list) -> None:
        if not items:
            return
        now_wall, now_mono = time.time(), time.monotonic()
        for item in items:
            if not isinstance(item, bytes):  # split mode never drops; keep the type checker calm
                continue
            line = StderrLine(now_wall, now_mono, item.decode("utf-8", errors="replace"))
            self._stderr.append(line)
            self._stderr_bytes += len(line.text.encode()) + 1  # the same measure as below
            self._stderr_count += 1
        while self._stderr_bytes > STDERR_KEEP_BYTES and len(self._stderr) > 1:
            old = self._stderr.popleft()
            self._stderr_bytes -= len(old.text.encode()) + 1
            self.stderr_dropped += 1
        self._stderr_changed.fire()

    def stderr_lines(self) -> list[StderrLine]:
        """Every captured stderr line, oldest first (see ``stderr_dropped``)."""
        return list(self._stderr)

    def stderr_text(self) -> str:
        """The captured stderr, one ``\\n`` after each line."""
        return "".join(line.text + "\n" for line in self._stderr)

    def stderr_tail(self, n: int = 5) -> list[str]:
        return [line.text for line in list(self._stderr)[-n:]]

    def grep_stderr(self, pattern: str | re.Pattern[str]) -> list[str]:
        """The captured stderr lines in which the regex ``pattern`` is found."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        return [line.text for line in self._stderr if rx.search(line.text)]

    async def wait_stderr(
        self, pattern: str | re.Pattern[str], timeout: float, *, since: int = 0
    ) -> str | None:
        """The first stderr line (the ``since``-th onward) matching ``pattern``.

        Lines already captured count. Returns None after ``timeout`` seconds, or as soon
        as stderr has closed with no match: a timeout is not an observation.
        ``since`` counts lines from the start of the process (see :meth:`stderr_count`).
        """
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        checked = since
        with trio.move_on_after(timeout):
            while True:
                first = self._stderr_count - len(self._stderr)
                lines = list(self._stderr)
                for line in lines[max(0, checked - first) :]:
                    if rx.search(line.text):
                        return line.text
                checked = self._stderr_count
                if self.stderr_closed.is_set():
                    return None
                await self._stderr_changed.wait()
        return None

    def stderr_count(self) -> int:
        """Lines captured since the start (including any dropped from memory)."""
        return self._stderr_count

    # -- close ---------------------------------------------------------------------

    async def close(self, timeouts: CloseTimeouts = DEFAULT_CLOSE_TIMEOUTS) -> CloseReport:
        """Stop the process: close stdin, wait; SIGTERM, wait; SIGKILL, wait.

        Each wait is bounded by ``timeouts``. Signals go only to the recorded process
        (PID and start time re-checked, sent through a pidfd). Idempotent: a second call
        returns the first report. Shield it from cancellation if it must complete.
        """
        async with self._close_lock:
            if self._close_report is not None:
                return self._close_report
            t0 = time.monotonic()
            sent: list[str] = []
            how = "already_exited" if self._proc.poll() is not None else ""
            await self._close_pipe(self._proc.stdin)
            if not how:
                how = await self._wait_step(timeouts.eof, "stdin_eof")
            if not how:
                stopped = await trio.to_thread.run_sync(
                    functools.partial(
                        stop_exact,
                        self.identity,
                        term_timeout=timeouts.term,
                        kill_timeout=timeouts.kill,
                    ),
                    abandon_on_cancel=True,
                )
                sent.extend(stopped.signals)
                how = _CLOSE_HOW[stopped.outcome]
                if stopped.ended:  # reap it: stop_exact counts a zombie as exited
                    await self._wait_step(timeouts.kill, "")
            # Let the stderr reader reach EOF so the capture is complete; a grandchild
            # holding the pipe open must not hold us, hence the bound.
            with trio.move_on_after(1.0):
                await self.stderr_closed.wait()
            self._close_report = CloseReport(
                how, self._proc.poll(), time.monotonic() - t0, tuple(sent)
            )
            return self._close_report

    async def _wait_step(self, bound: float, name: str) -> str:
        with trio.move_on_after(max(0.0, bound) if math.isfinite(bound) else math.inf):
            await self._proc.wait()
            return name
        return ""

    @staticmethod
    async def _close_pipe(stream: trio.abc.AsyncResource | None) -> None:
        if stream is None:
            return
        with trio.move_on_after(1.0):
            try:
                await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def release_pipes(self) -> None:
        """Close our ends of stdout and stderr (after the readers are done)."""
        await self._close_pipe(self._proc.stdout)
        await self._close_pipe(self._proc.stderr)

    @property
    def close_report(self) -> CloseReport | None:
        return self._close_report
