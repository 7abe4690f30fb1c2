"""The server's event log: one JSON object per line on stderr, one ``write()`` each.

Records are ``{"wall", "mono", "event", "src": "enclave", ...fields}`` rendered by
:func:`faultnet.eventlog.flatten`. A record is written with a single ``os.write`` on fd 2,
so lines from concurrent writers to the same pipe or ``O_APPEND`` file never interleave
(records are far below ``PIPE_BUF``). The one non-JSON line the server writes is
``LISTENING host port``; :func:`read_events` skips lines that are not JSON objects and
drops a truncated final line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultnet.eventlog import flatten

__all__ = ["EventSink", "read_events", "stderr_sink"]

EventSink = Callable[[dict[str, Any]], None]


def stderr_sink(record: dict[str, Any]) -> None:
    """Write *record* as one line on fd 2; a closed stderr is ignored, never fatal."""
    try:
        os.write(2, (flatten(record) + "\n").encode())
    except OSError:
        pass


def make_record(event: str, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "wall": time.time(),
        "mono": time.monotonic(),
        "event": event,
        "src": "enclave",
    }
    record.update(fields)
    return record


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON records of a server log (e.g. ``DIR/server.log``), in order.

    Lines that are not JSON objects (``LISTENING ...``, a Python warning) are skipped;
    so is a final line cut short by a kill.
    """
    out: list[dict[str, Any]] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
