"""The descriptors a proxy leaves free for the API and its own work, and refusing at once
what would take them.

A proxied connection holds two descriptors (three with a hop's), so a server at its
descriptor limit runs out in the middle of a connection: measured with ``ulimit -n 256``
and 600 clients at once, 483 clients were accepted, their upstream socket could not be
made, and each read a clean EOF (as if the server had closed) with one
``upstream_failed`` line apiece, while the API's own accept() failed and trio printed a
traceback for each retry.

The rule: a connection is carried only while a reserve of descriptors stays free
beneath the limit; past it the client is reset at once (an RST right after its
handshake: never a FIN, which says the server closed, and never a hang), and the event
log says so once per episode (``fd_reserve`` ``refusing``, then ``admitting`` with the
count refused).

How it knows without counting: ``accept()`` returns the lowest free descriptor, so an
accepted socket whose number is within the reserve means every descriptor below it is
taken. O(1) per connection (a listing of /proc/self/fd costs ~1 ms at 9,000).
"""

from __future__ import annotations

import socket

from faultnet.eventlog import JsonlWriter
from faultnet.sockopts import set_linger_reset

__all__ = ["DescriptorReserve", "reserve_for"]

#: Descriptors one carried connection may need beyond the client's own: its upstream
#: socket and, under two-way loss, the two ends of its hop.
_PER_CONNECTION = 3


def reserve_for(limit: int) -> int:
    """How many descriptors to keep free under *limit*: 1/16 of it, at least 16 (the API's
    connections, an event log, a plane's pipes) and at most 256 (enough for the API
    under load; the rest of a large limit is the proxies')."""
    return max(16, min(256, limit // 16))


class DescriptorReserve:
    """Admission by descriptor number, with one log line per episode of refusals."""

    def __init__(self, limit: int, log: JsonlWriter) -> None:
        self.limit = limit
        self.reserve = reserve_for(limit)
        self._log = log
        #: Clients refused in the episode under way (0: none under way).
        self.refusing = 0

    def admits(self, client: socket.socket) -> bool:
        """Whether *client* (just accepted) can be carried; if not it is reset and
        closed here, and the refusal counted."""
        if client.fileno() + _PER_CONNECTION < self.limit - self.reserve:
            if self.refusing:
                self._log.write("fd_reserve", state="admitting", refused=self.refusing)
                self.refusing = 0
            return True
        if not self.refusing:
            self._log.write("fd_reserve", state="refusing", limit=self.limit, reserve=self.reserve)
        self.refusing += 1
        set_linger_reset(client)
        client.close()
        return False
