"""Per-client flood control: a token bucket that holds a flooder back by not reading it.

Theory of operation. Every line a client sends (registered or not, any command) takes
one token from its own bucket: ``burst`` tokens, refilled at ``rate`` tokens per second.
When the bucket is empty the server waits for the next token *before reading further
from that client*: the lines it already read wait in order, the rest stays in the
kernel's buffers and then in the client's own send buffer, so the flooder's writes
block (TCP backpressure) and nothing it sends is lost or reordered. Its audience gets
its lines at ``rate`` at most, which any reader keeps up with, instead of a burst that
overflows their send queues (measured before this existed: one client sending 30,000
lines to a channel got both observers in it dropped for SendQ).

A client whose lines have waited ``limit_s`` seconds in all since its bucket was last
full is flooding past any burst: it is disconnected with "Excess Flood", as ircds do.
(Waits are summed, not timed as one span: at 500 lines/s a token comes every 2 ms, and
the scheduler's jitter alone would break any "continuous" span; measured, it did.) So
a client that sends a burst larger than ``burst`` and then stops is only delayed; one
that keeps under ``rate`` refills its bucket and never waits long; one that keeps
sending faster is dropped, after at least ``burst + rate * limit_s`` lines (more, as the
time spent handling its lines counts toward the rate but not toward the wait). ``rate``
0 switches flood control off.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

__all__ = ["ExcessFlood", "FloodBucket", "FloodLimits"]


@dataclass(frozen=True)
class FloodLimits:
    """One client's allowance. 100 lines/s is far above what a bot sends (the chatty-bot
    test: 8 lines/s, posts and their PINGs); the burst is well under the server's
    ``sendq`` (4096 lines), so one client's burst cannot overflow a member that reads
    nothing meanwhile."""

    #: Lines per second once the burst is spent; 0 switches flood control off.
    rate: float = 100.0
    #: Lines a client may send at once.
    burst: int = 500
    #: Seconds its lines may wait in all, since its bucket was last full, before the
    #: client is dropped ("Excess Flood").
    limit_s: float = 10.0


class ExcessFlood(Exception):
    """The client was held back for longer than the limit."""


class FloodBucket:
    """One client's bucket. :meth:`take` before handling each line."""

    def __init__(self, limits: FloodLimits) -> None:
        self.rate = limits.rate
        self.burst = float(max(limits.burst, 1))
        self.limit_s = limits.limit_s
        self._tokens = self.burst
        self._stamp = trio.current_time()
        #: Seconds its lines have waited for tokens since the bucket was last full.
        self.held_s = 0.0

    async def take(self) -> bool:
        """Wait until a token is free and take it. True if the line had to wait.

        Raises :class:`ExcessFlood` (without waiting) once lines have waited ``limit_s``
        seconds in all since the bucket was last full.
        """
        if self.rate <= 0:
            return False
        now = trio.current_time()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens >= self.burst:
            self.held_s = 0.0
        if self._tokens >= 1:
            self._tokens -= 1
            return False
        if self.held_s >= self.limit_s:
            raise ExcessFlood(f"held back {self.held_s:.1f} s since its burst")
        wait = (1 - self._tokens) / self.rate
        await trio.sleep(wait)
        self.held_s += wait
        self._tokens, self._stamp = 0.0, self._stamp + wait
        return True
