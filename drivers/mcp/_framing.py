"""Line framing for MCP stdio: one JSON-RPC message per ``\\n``-terminated line.

:class:`LineFramer` turns the arbitrary chunks a pipe delivers into whole lines. It is
pure (no I/O, no clock), so every framing edge is unit-testable:

* a line split across reads is held until its newline arrives;
* several lines in one read come out as several lines, in order;
* ``\\r\\n`` endings lose their ``\\r`` (a lone ``\\r`` inside a line is kept);
* blank lines are skipped;
* memory is bounded: a line that grows past ``limit`` bytes without a newline is not
  kept. In ``discard`` mode its bytes are dropped up to the next newline and one
  :class:`Oversize` item reports how many there were (the stdout policy: a message that
  large is an error, not a reason to grow without bound). In ``split`` mode the held
  bytes are emitted as a line of their own (the stderr policy: logs are kept, in pieces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_MAX_LINE_BYTES", "LineFramer", "Oversize"]

#: Tool results can be large (file contents, listings); 16 MiB is far above any seen in
#: practice and still a bound.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Oversize:
    """A line longer than the limit was dropped: ``size`` bytes, newline excluded."""

    size: int
    #: The first bytes of the dropped line, for the report.
    head: bytes


class LineFramer:
    """Split a byte stream into lines without holding more than ``limit`` bytes of one."""

    def __init__(
        self, limit: int = DEFAULT_MAX_LINE_BYTES, mode: Literal["discard", "split"] = "discard"
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be positive")
        self.limit = limit
        self.mode = mode
        self._buf = bytearray()
        # Bytes of _buf already searched for a newline (so a slow trickle of a long line
        # costs O(n), not O(n^2)).
        self._scanned = 0
        # In discard mode: bytes dropped so far of the current oversize line, or None.
        self._dropping: int | None = None
        self._dropped_head = b""

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        """Take the next chunk; return the lines (and oversize reports) it completes."""
        out: list[bytes | Oversize] = []
        if self._dropping is not None:
            nl = data.find(b"\n")
            if nl < 0:
                self._dropping += len(data)
                return out
            out.append(Oversize(self._dropping + nl, self._dropped_head))
            self._dropping = None
            self._dropped_head = b""
            data = data[nl + 1 :]
        # Held bytes never exceed limit + one chunk: _drain trims the buffer every time.
        self._buf += data
        out.extend(self._drain())
        return out

    def _drain(self) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        start = 0
        buf = self._buf
        while True:
            nl = buf.find(b"\n", max(start, self._scanned))
            if nl < 0:
                break
            line = self._finish(bytes(buf[start:nl]))
            if line is not None:
                out.append(line)
            start = nl + 1
            self._scanned = start
        del buf[:start]
        self._scanned = len(buf)
        if len(buf) > self.limit:
            if self.mode == "split":
                while len(buf) > self.limit:
                    out.append(bytes(buf[: self.limit]))
                    del buf[: self.limit]
                self._scanned = len(buf)
            else:
                self._dropping = len(buf)
                self._dropped_head = bytes(buf[:80])
                buf.clear()
                self._scanned = 0
        return out

    @staticmethod
    def _finish(line: bytes) -> bytes | None:
        if line.endswith(b"\r"):
            line = line[:-1]
        return line if line.strip() else None

    def end(self) -> list[bytes | Oversize]:
        """The stream ended: return what is left (a final line that had no newline)."""
        out: list[bytes | Oversize] = []
        if self._dropping is not None:
            out.append(Oversize(self._dropping, self._dropped_head))
            self._dropping = None
        elif self._buf:
            line = self._finish(bytes(self._buf))
            if line is not None:
                out.append(line)
        self._buf.clear()
        self._scanned = 0
        return out

    @property
    def pending(self) -> int:
        """Bytes held for an unfinished line (never more than ``limit``)."""
        return len(self._buf)
