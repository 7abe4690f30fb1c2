"""Transport events: one ``BOTEVENT {json}`` line on stderr per event.

The line is ``BOTEVENT `` followed by one-line JSON (:func:`faultnet.eventlog.flatten`,
so keys and values are separated as ``"event":"connected"`` with no spaces). Every record
carries ``event``, ``nick``, ``mono`` (``time.monotonic()`` of this process) and ``wall``
(Unix seconds). Each line is handed to the kernel in one ``os.write`` on fd 2, so lines
never interleave with other writers. Events:

``connected``       a link is registered and the channel joined; ``session`` counts them
                    from 1, ``auth`` is the login used (``sasl``, ``pass``, ``none``),
                    ``caps`` lists the capabilities the server acknowledged
``reconnected``     emitted right after ``connected`` for every session after the first,
                    with ``down_ms`` (time since the previous link was declared down)
``disconnected``    a registered link is gone; ``reason`` says why (``pong_timeout``,
                    ``eof``, ``error``, ``write_stalled``, ``server_error``)
``pong_timeout``    the keepalive PINGed after ``idle_s`` without inbound traffic and no
                    PONG came within ``pong_timeout_s`` -- the bot's OWN detection, the
                    only event that proves the bot noticed a dead link by itself
``connect_failed``  one connection attempt failed; ``retry_in_s`` is the back-off chosen
``post_confirm``    one send-channel: ``result`` is ``confirmed``, ``unconfirmed`` or
                    ``skipped`` (the no-confirm defect), with ``elapsed_ms``
"""

from __future__ import annotations

import os
import time
from typing import Any

from faultnet.eventlog import JsonlWriter, flatten

__all__ = ["EventSink"]


class EventSink:
    """Writes BOTEVENT lines to stderr and, optionally, the same records to a JSONL file."""

    def __init__(self, nick: str, log_path: str | None = None, fd: int = 2) -> None:
        self._nick = nick
        self._fd = fd
        self._file = JsonlWriter(log_path, nick=nick) if log_path else None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event; never raises for a closed or full stderr (the bot goes on)."""
        record: dict[str, Any] = {
            "event": event,
            "nick": self._nick,
            "mono": time.monotonic(),
            "wall": time.time(),
        }
        record.update(fields)
        data = ("BOTEVENT " + flatten(record) + "\n").encode()
        try:
            os.write(self._fd, data)
        except OSError:
            pass  # stderr gone (parent closed it): events are diagnostics, not the protocol
        if self._file is not None:
            self._file.write(event, **fields)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
