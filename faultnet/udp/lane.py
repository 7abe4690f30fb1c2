"""One direction of one UDP session: datagrams leave in order, each at its due time.

A lane is a FIFO of ``(due, payload)``. A datagram's due time is never earlier than the
one before it, so latency with jitter delays a direction without reordering it (reorder
is its own impairment). One datagram at a time may be *deferred* (the reorder
impairment): it leaves just after the next datagram put in the lane, or at its deadline
if none comes first.

Theory of operation: :meth:`Lane.put` is synchronous and sends at once what is due when
nothing is queued ahead of it (the common, unimpaired case costs one ``send`` and no task
switch). Anything that must wait (a delay, a deferral, a full socket buffer) is left in
the queue for :meth:`Lane.run`, the lane's one sender task, which sleeps until the head
is due or :meth:`put` wakes it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

__all__ = ["Lane"]


@dataclass
class _Deferred:
    due: float
    payload: bytes
    copies: int
    deadline: float


class Lane:
    """Sends on *sock* through *send* (a non-blocking call that may raise
    ``BlockingIOError``). ``sent`` counts datagrams handed to the kernel; ``send_errors``
    those the kernel refused (e.g. ECONNREFUSED left by an ICMP port unreachable, or
    EMSGSIZE for a payload the socket's family cannot carry), each also passed to
    *on_error* with its payload, so that no datagram is lost silently."""

    def __init__(
        self,
        sock: object,
        send: Callable[[bytes], object],
        on_error: Callable[[OSError, bytes], object] = lambda exc, payload: None,
    ) -> None:
        self._sock = sock
        self._send = send
        self._on_error = on_error
        self._queue: deque[tuple[float, bytes]] = deque()
        self._last_due = -math.inf
        self._deferred: _Deferred | None = None
        self._wake = trio.Event()
        self.sent = 0
        self.send_errors = 0

    @property
    def pending(self) -> int:
        """Datagrams accepted but not yet sent (queued or deferred)."""
        return len(self._queue) + (self._deferred.copies if self._deferred else 0)

    def put(
        self,
        payload: bytes,
        *,
        copies: int = 1,
        delay_s: float = 0.0,
        defer: bool = False,
        defer_s: float = 0.0,
    ) -> None:
        """Accept one datagram (sent *copies* times, *delay_s* from now). ``defer``:
        hold it back until after the next datagram, at most *defer_s* past its due time."""
        if not (self._queue or self._deferred or defer or delay_s) and copies == 1:
            # The unimpaired case: nothing ahead of it, due now. One send, no clock.
            try:
                self._send(payload)
            except BlockingIOError:
                pass  # queued below, for the sender task
            except OSError as exc:
                self.send_errors += 1
                self._on_error(exc, payload)
                return
            else:
                self.sent += 1
                return
        now = trio.current_time()
        due = now + delay_s
        if defer and self._deferred is None:
            self._deferred = _Deferred(due, payload, copies, due + defer_s)
            self._wake.set()
            return
        for _ in range(copies):
            self._append(due, payload)
        if self._deferred is not None:
            d, self._deferred = self._deferred, None
            for _ in range(d.copies):
                self._append(d.due, d.payload)
        self._flush(now)
        if self._queue:
            self._wake.set()

    def _append(self, due: float, payload: bytes) -> None:
        due = max(due, self._last_due)
        self._last_due = due
        self._queue.append((due, payload))

    def _flush(self, now: float) -> bool:
        """Send what is due. False if the socket buffer is full (EAGAIN)."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            try:
                self._send(queue[0][1])
            except BlockingIOError:
                return False
            except OSError as exc:
                self.send_errors += 1
                self._on_error(exc, queue[0][1])
            else:
                self.sent += 1
            queue.popleft()
        return True

    async def run(self) -> None:
        """The lane's sender task: runs until cancelled."""
        while True:
            now = trio.current_time()
            if self._deferred is not None and now >= self._deferred.deadline:
                d, self._deferred = self._deferred, None
                for _ in range(d.copies):
                    self._append(d.due, d.payload)
            if not self._flush(now):
                await trio.lowlevel.wait_writable(self._sock)
                continue
            wake_at = math.inf
            if self._queue:
                wake_at = self._queue[0][0]
            if self._deferred is not None:
                wake_at = min(wake_at, self._deferred.deadline)
            # No checkpoint between making the event and waiting on it: put() cannot run
            # in between, so no wake-up is lost.
            self._wake = trio.Event()
            with trio.move_on_at(wake_at):
                await self._wake.wait()
