"""JSONL records: one ``write()`` per record on an ``O_APPEND`` file.

Semantics:

* **Atomic per record.** :meth:`JsonlWriter.write` encodes the whole record (newline
  included) and hands it to the kernel in one ``os.write`` on a descriptor opened with
  ``O_APPEND``. Concurrent writers (tasks, threads or processes) therefore never
  interleave inside a record.
* **A log that cannot be written degrades, it never raises.** When the kernel refuses a
  record (disk full, ``EFBIG`` past a file-size limit, an I/O error) or takes only part
  of it, :meth:`JsonlWriter.write` drops the record, counts it (``dropped``,
  ``last_error``, and per path in :func:`dropped_records`), prints ONE warning line per
  path to stderr, and returns as usual: a full disk must not take down a proxy, a
  connection handler or the server whose faults the log describes.
* **Every record starts on a line of its own.** A writer that opens a log whose last
  byte is not a newline (a record torn by a kill, or by a short write) starts a new line
  first, and so does the record after a short write; the newline goes out in the same
  ``os.write`` as that record.
* **Not durable.** Records are not fsync'ed; a machine crash may lose the tail, a
  ``kill -9`` of the writer cannot (the record is already in the kernel).
* **Timestamps.** Every record carries ``wall`` (Unix seconds) and ``mono``
  (``time.monotonic()``) so records from one process can be ordered and timed even if the
  wall clock steps.

:func:`read_jsonl` is the tolerant reader, and its report names every unreadable line:
a truncated *final* line (the shape a kill leaves) is dropped and reported; a torn
record further up (a line that opens a JSON object and stops short of closing it, which
is what a kill leaves once a restarted writer has started a new line after it) is
skipped and reported; any other malformed line is corruption and raises
:class:`CorruptLogError`, which names every unreadable line of the file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultnet import events

__all__ = [
    "CorruptLogError",
    "JsonlRead",
    "JsonlWriter",
    "UnreadableLine",
    "dropped_records",
    "flatten",
    "read_jsonl",
]

# Records dropped because the kernel refused them, per path, for this process. Every
# writer of one path (a server has one per proxy, all on the same file) adds to one count.
_dropped: dict[str, int] = {}
_dropped_lock = threading.Lock()


def dropped_records() -> dict[str, int]:
    """Records this process could not write, per log path (a copy; empty when none)."""
    with _dropped_lock:
        return dict(_dropped)


def flatten(value: Any) -> str:
    """Render *value* as one line of JSON: no raw newline or tab survives inside it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class JsonlWriter:
    """Append-only JSONL file; safe to share between tasks and processes.

    ``path=None`` makes a writer that records nothing (so callers need no ``if``).
    Opening the file can raise :class:`OSError` (the caller asked for a log it cannot
    have); writing never does (see the module docstring).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        vocabulary: Mapping[str, events.Event] | None = None,
        **static: Any,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self._static = static
        #: The events this writer may write (checked under $FAULTNET_STRICT_EVENTS:
        #: see faultnet.events), or None for a log of another vocabulary.
        self.vocabulary = vocabulary
        self._fd: int | None = None
        #: Records this writer could not write (dropped, not retried).
        self.dropped = 0
        #: The reason the last of them failed, e.g. ``"[Errno 27] File too large"``.
        self.last_error: str | None = None
        self._newline_first = False
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._newline_first = _ends_mid_line(self.path)

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"wall", "mono", "event", **static, **fields}``; return it.

        The record is returned whether or not it reached the file.
        """
        if self.vocabulary is not None:
            events.check(self.vocabulary, event, fields)
        record: dict[str, Any] = {"wall": time.time(), "mono": time.monotonic(), "event": event}
        record.update(self._static)
        record.update(fields)
        self.append(record)
        return record

    def append(self, record: Mapping[str, Any]) -> bool:
        """Append *record* as it is (one a writer sharing this file built); False if it
        was dropped (counted as :meth:`write`'s are)."""
        if self._fd is None:
            return True
        data = (flatten(record) + "\n").encode()
        if self._newline_first:
            data = b"\n" + data
        try:
            n = os.write(self._fd, data)
        except OSError as exc:
            self._drop(exc)
            return False
        if n != len(data):
            # A regular O_APPEND file writes whole or fails, except at a size limit or
            # a full disk, where the kernel takes what fits: that is a torn line now.
            self._newline_first = True
            self._drop(OSError(f"short write: {n} of {len(data)} bytes"))
            return False
        self._newline_first = False
        return True

    def _drop(self, exc: OSError) -> None:
        self.dropped += 1
        self.last_error = str(exc)
        key = str(self.path)
        with _dropped_lock:
            first = key not in _dropped
            _dropped[key] = _dropped.get(key, 0) + 1
        if first:
            # One line, one write: stderr may be shared with other writers.
            sys.stderr.write(
                f"faultnet: warning: cannot write event log {key}: {exc}; records that "
                "cannot be written are dropped and counted, everything else goes on\n"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ends_mid_line(path: Path) -> bool:
    """True if *path* is non-empty and its last byte is not a newline."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:  # unreadable (a FIFO, write-only): nothing to repair that we can see
        return False


@dataclass(frozen=True)
class UnreadableLine:
    lineno: int  # 1-based
    #: ``"truncated"`` (the final line, cut short), ``"torn"`` (an object cut short
    #: further up, followed by a newline a restarted writer added) or ``"corrupt"``.
    kind: str
    text: str

    def __str__(self) -> str:
        return f"line {self.lineno} ({self.kind}): {self.text[:80]!r}"


class CorruptLogError(ValueError):
    """A line other than the last one is malformed and is not a torn record.

    The message names every unreadable line; ``read`` holds everything that was readable.
    """

    def __init__(self, path: Path, read: JsonlRead) -> None:
        bad = [u for u in read.unreadable if u.kind == "corrupt"]
        named = "; ".join(str(u) for u in read.unreadable)
        super().__init__(f"{path}:{bad[0].lineno}: malformed JSONL record ({named})")
        self.path = path
        self.lineno = bad[0].lineno
        self.read = read


@dataclass
class JsonlRead:
    records: list[dict[str, Any]] = field(default_factory=list)
    #: The dropped final line, if it was truncated (no newline and not valid JSON).
    truncated_tail: str | None = None
    #: Every line that did not parse, in file order (the truncated tail included).
    unreadable: list[UnreadableLine] = field(default_factory=list)


def _is_torn(line: str) -> bool:
    # A record the writer cut short opens an object and never closes it (every record
    # it writes ends in "}"). A malformed line that is whole is something else.
    stripped = line.strip()
    return stripped.startswith("{") and not stripped.endswith("}")


def read_jsonl(path: str | os.PathLike[str]) -> JsonlRead:
    """Read every record of *path*.

    A final line that does not parse is dropped and reported in ``truncated_tail``; a
    final line that parses is kept even without its newline. A torn record further up is
    skipped. Any other line that is not a JSON object is corruption: the whole file is
    read, then :class:`CorruptLogError` names every unreadable line. Blank lines are
    skipped. ``unreadable`` lists every line that was not a record, with its kind.
    """
    p = Path(path)
    text = p.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    result = JsonlRead()
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, Mapping):
                raise ValueError("not an object")
        except ValueError:
            if i == last:  # no newline after it: the write was cut short
                result.truncated_tail = line
                kind = "truncated"
            else:
                kind = "torn" if _is_torn(line) else "corrupt"
            result.unreadable.append(UnreadableLine(i + 1, kind, line))
            continue
        result.records.append(dict(obj))
    if any(u.kind == "corrupt" for u in result.unreadable):
        raise CorruptLogError(p, result)
    return result
