"""One direction of one UDP session: datagrams leave in order, each at its due time.

A lane is a FIFO of ``(due, payload)``. A datagram's due time is never earlier than the
one before it, so latency with jitter delays a direction without reordering it (reorder
is its own impairment). One datagram at a time may be *deferred* (the reorder
impairment): it leaves just after the next datagram put in the lane, or at its deadline
if none comes first.

Theory of operation: :meth:`Lane.put` is synchronous and sends at once what is due when
nothing is queued ahead of it (the common, unimpaired case costs one ``send``, no task
switch and no task). Anything that must wait (a delay, a deferral, a full socket buffer)
is left in the queue for :meth:`Lane.run`, the lane's sender task, which ``put`` starts
through *spawn* when the queue stops being empty, which sleeps until the head is due or
``put`` wakes it, and which ends when the queue is empty again. A lane with nothing
waiting has no task: a proxy of 10,000 quiet sessions was 30,000 sender tasks, most of
its memory and of the 5.6 s it took to stop.

Every queued datagram's bytes are taken from a :class:`Budget` (the session's and the
proxy's bound) and given back when it leaves; a datagram there is no room for is
dropped and counted (``overflow``): a flood behind a long latency is bounded memory, not
an unbounded queue.
"""

from __future__ import annotations

import math
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

__all__ = ["Budget", "Lane"]


class Budget(Protocol):
    """Where a lane's queued bytes are accounted."""

    def take(self, n: int) -> bool:
        """Reserve *n* bytes; False (nothing reserved) if over a bound."""
        ...

    def give(self, n: int) -> None:
        """Return *n* bytes reserved by :meth:`take`."""
        ...


class _Unbounded:
    def take(self, n: int) -> bool:
        return True

    def give(self, n: int) -> None:
        pass


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
    *on_error* with its payload, so that no datagram is lost silently; ``overflow``
    those that had to wait and found no room in *budget*.

    *spawn* starts :meth:`run` as a task (e.g. ``nursery.start_soon``); :meth:`close`
    stops it and gives every queued byte back."""

    def __init__(
        self,
        sock: socket.socket,
        send: Callable[[bytes], object],
        on_error: Callable[[OSError, bytes], object] = lambda exc, payload: None,
        *,
        spawn: Callable[[Callable[[], Awaitable[None]]], object],
        budget: Budget | None = None,
    ) -> None:
        self._sock = sock
        self._send = send
        self._on_error = on_error
        self._spawn = spawn
        self._budget: Budget = budget if budget is not None else _Unbounded()
        self._queue: deque[tuple[float, bytes]] = deque()
        self._last_due = -math.inf
        self._deferred: _Deferred | None = None
        self._wake = trio.Event()
        self._running = False
        self._scope: trio.CancelScope | None = None
        self._closed = False
        self.sent = 0
        self.send_errors = 0
        self.overflow = 0
        #: Bytes waiting (queued or deferred), taken from the budget.
        self.queued_bytes = 0

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
        if self._closed:
            return
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
            if self._take(len(payload) * copies):
                self._deferred = _Deferred(due, payload, copies, due + defer_s)
                self._start()
                self._wake.set()
            else:
                self.overflow += copies
            return
        for _ in range(copies):
            if self._take(len(payload)):
                self._append(due, payload)
            else:
                self.overflow += 1
        if self._deferred is not None:
            d, self._deferred = self._deferred, None
            for _ in range(d.copies):
                self._append(d.due, d.payload)
        self._flush(now)
        if self._queue:
            self._start()
            self._wake.set()

    def close(self) -> None:
        """Stop the sender task; drop what waits, its bytes given back to the budget."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        self._queue.clear()
        self._deferred = None
        self._budget.give(self.queued_bytes)
        self.queued_bytes = 0

    def _take(self, n: int) -> bool:
        if not self._budget.take(n):
            return False
        self.queued_bytes += n
        return True

    def _start(self) -> None:
        if not self._running:
            self._running = True
            self._spawn(self.run)

    def _append(self, due: float, payload: bytes) -> None:
        due = max(due, self._last_due)
        self._last_due = due
        self._queue.append((due, payload))

    def _flush(self, now: float) -> bool:
        """Send what is due. False if the socket buffer is full (EAGAIN)."""
        queue = self._queue
        while queue and queue[0][0] <= now:
            payload = queue[0][1]
            try:
                self._send(payload)
            except BlockingIOError:
                return False
            except OSError as exc:
                self.send_errors += 1
                self._on_error(exc, payload)
            else:
                self.sent += 1
            queue.popleft()
            self.queued_bytes -= len(payload)
            self._budget.give(len(payload))
        return True

    async def run(self) -> None:
        """The lane's sender task: runs until nothing waits, or :meth:`close`."""
        try:
            with trio.CancelScope() as self._scope:
                if self._closed:
                    return
                while True:
                    now = trio.current_time()
                    if self._deferred is not None and now >= self._deferred.deadline:
                        d, self._deferred = self._deferred, None
                        for _ in range(d.copies):
                            self._append(d.due, d.payload)
                    if not self._flush(now):
                        await trio.lowlevel.wait_writable(self._sock)
                        continue
                    if not self._queue and self._deferred is None:
                        return  # idle: the next put that must wait starts a new task
                    wake_at = math.inf
                    if self._queue:
                        wake_at = self._queue[0][0]
                    if self._deferred is not None:
                        wake_at = min(wake_at, self._deferred.deadline)
                    # No checkpoint between making the event and waiting on it: put()
                    # cannot run in between, so no wake-up is lost.
                    self._wake = trio.Event()
                    with trio.move_on_at(wake_at):
                        await self._wake.wait()
        finally:
            # No checkpoint since the idle check: a put() now starts a fresh task.
            self._running = False
            self._scope = None
