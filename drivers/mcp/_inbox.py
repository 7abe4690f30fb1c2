"""What the server sent on its own: notifications, and stdout lines that were unusable.

The driver's stdout reader appends; tests and experiments read and wait. Waits count
what already arrived (no race with a message that landed just before the wait) and end
with None on timeout, or at once when the stream has closed: a timeout is not an
observation.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from faultnet.eventlog import flatten

__all__ = [
    "DEFAULT_MAX_NOTIFICATIONS",
    "Inbox",
    "Notification",
    "NotificationMatch",
    "Pulse",
    "StdoutProblem",
    "message_text",
]

#: Stdout problems kept in memory (the call record has every one).
MAX_PROBLEMS = 1000
#: Notifications kept in memory by default; beyond it the oldest are dropped (and
#: counted). Unbounded, a server's flood grew the driver from 29 MB to 710 MB in 6 s
#: (852,000 notifications); 10,000 small ones are a few MB.
DEFAULT_MAX_NOTIFICATIONS = 10_000


@dataclass(frozen=True)
class Notification:
    """A notification the server sent (any method), stamped when it was read."""

    wall: float
    mono: float
    method: str
    params: dict[str, Any]


@dataclass(frozen=True)
class StdoutProblem:
    """A stdout line that was not a usable message: it was reported and skipped.

    ``kind``: ``invalid_json``, ``invalid_utf8``, ``oversize_line``, ``not_jsonrpc``,
    ``invalid_response``, ``unknown_response_id``, or ``late_response`` (an answer to a
    request that had already timed out or been cancelled).
    """

    wall: float
    kind: str
    detail: str
    excerpt: str


NotificationMatch = str | Callable[[Notification], bool]


class Pulse:
    """Wakes every current waiter when something arrives (a fresh Event per arrival)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


def message_text(data: Any) -> str:
    """A ``notifications/message`` data value as text: a string as is; a dict with a
    string ``text``, that text; anything else, one line of JSON."""
    if isinstance(data, str):
        return data
    if isinstance(data, Mapping) and isinstance(data.get("text"), str):
        return data["text"]
    return flatten(data)


class Inbox:
    """Notifications in arrival order (the newest *max_notifications* of them), and the
    stdout problems seen.

    Positions (``since``) count every notification received, including those dropped,
    so a mark stays valid while the oldest are dropped.
    """

    def __init__(self, max_notifications: int = DEFAULT_MAX_NOTIFICATIONS) -> None:
        if max_notifications < 1:
            raise ValueError("max_notifications must be at least 1")
        self.max_notifications = max_notifications
        self._notes: collections.deque[Notification] = collections.deque()
        #: Every notification received, and how many of the oldest were dropped.
        self.received = 0
        self.dropped = 0
        self._problems: list[StdoutProblem] = []
        self.problem_count = 0
        self._pulse = Pulse()
        #: Set when the stream ended: nothing more will arrive.
        self.closed = trio.Event()

    def add(self, note: Notification) -> bool:
        """Keep *note*; drop the oldest beyond the bound. True if this add dropped one."""
        self._notes.append(note)
        self.received += 1
        dropped = len(self._notes) > self.max_notifications
        if dropped:
            self._notes.popleft()
            self.dropped += 1
        self._pulse.fire()
        return dropped

    def add_problem(self, problem: StdoutProblem) -> None:
        self.problem_count += 1
        if len(self._problems) < MAX_PROBLEMS:
            self._problems.append(problem)

    def close(self) -> None:
        self.closed.set()
        self._pulse.fire()

    def __len__(self) -> int:
        """Notifications kept (see :attr:`received` for all that arrived)."""
        return len(self._notes)

    def _since(self, position: int) -> list[Notification]:
        """The kept notifications at *position* (counted from the first received) on."""
        new = min(self.received - position, len(self._notes))
        # From the right: a waiter woken per arrival costs O(new), not O(kept).
        return list(itertools.islice(reversed(self._notes), max(0, new)))[::-1]

    def notifications(self, method: str | None = None) -> list[Notification]:
        return [n for n in self._notes if method is None or n.method == method]

    def contents(self) -> list[str]:
        return [
            message_text(n.params.get("data"))
            for n in self._notes
            if n.method == "notifications/message"
        ]

    def problems(self, since_wall: float = 0.0) -> list[StdoutProblem]:
        return [p for p in self._problems if p.wall >= since_wall]

    async def wait(
        self, match: NotificationMatch, timeout: float, *, since: int = 0
    ) -> Notification | None:
        pred = (lambda n: n.method == match) if isinstance(match, str) else match
        checked = since
        with trio.move_on_after(timeout):
            while True:
                for note in self._since(checked):
                    if pred(note):
                        return note
                checked = max(checked, self.received)
                if self.closed.is_set():
                    return None
                await self._pulse.wait()
        return None
