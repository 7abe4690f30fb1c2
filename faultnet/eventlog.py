"""JSONL records: one ``write()`` per record on an ``O_APPEND`` file.

Semantics:

* **Atomic per record.** :meth:`JsonlWriter.write` encodes the whole record (newline
  included) and hands it to the kernel in one ``os.write`` on a descriptor opened with
  ``O_APPEND``. Concurrent writers (tasks, threads or processes) therefore never
  interleave inside a record. A short write (disk full) raises :class:`OSError` rather
  than leaving a silently truncated line.
* **Not durable.** Records are not fsync'ed; a machine crash may lose the tail, a
  ``kill -9`` of the writer cannot (the record is already in the kernel).
* **Timestamps.** Every record carries ``wall`` (Unix seconds) and ``mono``
  (``time.monotonic()``) so records from one process can be ordered and timed even if the
  wall clock steps.

:func:`read_jsonl` is the tolerant reader: a truncated *final* line (the shape a kill
leaves) is dropped and reported; a malformed line anywhere else is corruption and raises
:class:`CorruptLogError`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CorruptLogError", "JsonlRead", "JsonlWriter", "flatten", "read_jsonl"]


def flatten(value: Any) -> str:
    """Render *value* as one line of JSON: no raw newline or tab survives inside it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class JsonlWriter:
    """Append-only JSONL file; safe to share between tasks and processes.

    ``path=None`` makes a writer that records nothing (so callers need no ``if``).
    """

    def __init__(self, path: str | os.PathLike[str] | None, **static: Any) -> None:
        self.path = Path(path) if path is not None else None
        self._static = static
        self._fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"wall", "mono", "event", **static, **fields}``; return it."""
        record: dict[str, Any] = {"wall": time.time(), "mono": time.monotonic(), "event": event}
        record.update(self._static)
        record.update(fields)
        if self._fd is not None:
            data = (flatten(record) + "\n").encode()
            n = os.write(self._fd, data)
            if n != len(data):  # O_APPEND regular files write whole or fail; say so if not.
                raise OSError(f"short write to {self.path}: {n} of {len(data)} bytes")
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CorruptLogError(ValueError):
    """A line other than the last one is not a JSON object."""

    def __init__(self, path: Path, lineno: int, line: str) -> None:
        super().__init__(f"{path}:{lineno}: malformed JSONL record: {line[:80]!r}")
        self.path = path
        self.lineno = lineno


@dataclass
class JsonlRead:
    records: list[dict[str, Any]] = field(default_factory=list)
    #: The dropped final line, if it was truncated (no newline and not valid JSON).
    truncated_tail: str | None = None


def read_jsonl(path: str | os.PathLike[str]) -> JsonlRead:
    """Read every record of *path*.

    A final line that does not parse is dropped and reported in ``truncated_tail``; a
    final line that parses is kept even without its newline. Any other line that is not a
    JSON object raises :class:`CorruptLogError`. Blank lines are skipped.
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
                break
            raise CorruptLogError(p, i + 1, line) from None
        result.records.append(dict(obj))
    return result
