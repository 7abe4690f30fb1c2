"""What happens to one datagram: the UDP proxy's pure core (no sockets, no clock).

Everything that decides a datagram's fate lives here, so it is tested by tables and a
seed replays it exactly. faultnet owns the random on UDP (unlike TCP loss, where the
kernel draws it): every decision is a number in [0, 1) derived by sha256 from

    seed : stream : the datagram's index in its direction : what is being decided

where the index counts the proxy's datagrams of that direction from 0, across all its
sessions. So the same seed and the same datagram order reproduce the exact same drops,
duplicates and delays, whatever the timing and whatever source ports the kernel picks:
keyed by session, a client with a fresh socket per query (dnspython's default, like most
stub resolvers) whose port the kernel reused within the idle time merged two queries into
one session, and every later fate shifted (two same-seed runs differed in 32 of 200
fates at 10 % loss). :func:`draw` is public so a test (or a user) can predict the fate of
datagram *seq* without running the proxy.

The order of the steps, per datagram, once it passed the freeze/blackhole gate (the
proxy's business, not this module's):

1. size limit: a payload longer than ``size_limit`` bytes is truncated to it
   (``size_action="truncate"``) or dropped (``"drop"``);
2. loss: dropped with probability ``loss`` percent;
3. duplicate: sent twice with probability ``duplicate`` percent;
4. latency: delayed by ``latency_ms`` plus a uniform jitter in
   ``[-jitter_ms, +jitter_ms]`` (never below 0); the proxy keeps each direction in
   order, so jitter alone never reorders;
5. reorder: with probability ``reorder`` percent the datagram is held back and sent just
   after the next datagram of its direction (or after ``reorder_gap_ms`` if none comes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

__all__ = ["SIZE_ACTIONS", "Fate", "Impairment", "draw", "fate"]

#: What a size limit does to a longer payload.
SIZE_ACTIONS = ("truncate", "drop")
_SCALE = float(2**64)


def draw(seed: int, stream: str, seq: int, what: str) -> float:
    """The seeded number in [0, 1) that decides *what* for datagram *seq* (its index in
    the proxy's *stream* direction, from 0)."""
    digest = hashlib.sha256(f"{seed}:{stream}:{seq}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


@dataclass(frozen=True)
class Impairment:
    """The impairments in force on one direction. All off by default; percentages are
    0-100, times in milliseconds, sizes in bytes of UDP payload."""

    loss: float = 0.0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_gap_ms: float = 100.0
    size_limit: int | None = None
    size_action: str = "truncate"

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder", "latency_ms", "jitter_ms", "reorder_gap_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, not {value!r}")
        for name in ("loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"{name} must be a percentage 0-100, not {value}")
        for name in ("latency_ms", "jitter_ms", "reorder_gap_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.size_limit is not None and (
            isinstance(self.size_limit, bool) or not isinstance(self.size_limit, int)
        ):
            raise ValueError(f"size_limit must be a whole number of bytes, not {self.size_limit!r}")
        if self.size_limit is not None and self.size_limit < 0:
            raise ValueError(f"size_limit must not be negative, not {self.size_limit}")
        if self.size_action not in SIZE_ACTIONS:
            raise ValueError(
                f"size_action must be one of {', '.join(SIZE_ACTIONS)}, not {self.size_action!r}"
            )

    @cached_property
    def active(self) -> bool:
        """Whether any impairment is on (computed once: it is asked per datagram; a
        frozen dataclass's cached_property writes the instance's __dict__ directly)."""
        return bool(
            self.loss or self.latency_ms or self.jitter_ms or self.duplicate or self.reorder
        ) or (self.size_limit is not None)

    def with_(self, **changes: Any) -> Impairment:
        """A copy with *changes* (validated; unknown names raise ValueError)."""
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown impairment attribute(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Fate:
    """What the proxy does with one datagram."""

    #: ``None`` if it is sent; else why not: ``"loss"`` or ``"oversize"``.
    dropped: str | None = None
    #: The payload to send (truncated if the size limit says so).
    payload: bytes = b""
    truncated: bool = False
    #: 1, or 2 when duplicated.
    copies: int = 1
    delay_s: float = 0.0
    #: Held back until after the next datagram of its direction.
    reorder: bool = False


def _chance(percent: float, seed: int, stream: str, seq: int, what: str) -> bool:
    # 0 never fires and 100 always does (draw() < 1 always).
    return percent > 0 and draw(seed, stream, seq, what) * 100.0 < percent


def fate(imp: Impairment, payload: bytes, *, seed: int, stream: str, seq: int) -> Fate:
    """Decide the fate of datagram *seq* (its index in the proxy's *stream* direction)
    under *imp*."""
    if not imp.active:
        return Fate(payload=payload)
    truncated = False
    if imp.size_limit is not None and len(payload) > imp.size_limit:
        if imp.size_action == "drop":
            return Fate(dropped="oversize")
        payload, truncated = payload[: imp.size_limit], True
    key = (seed, stream, seq)
    if _chance(imp.loss, *key, "loss"):
        return Fate(dropped="loss", truncated=truncated)
    copies = 2 if _chance(imp.duplicate, *key, "duplicate") else 1
    delay_ms = imp.latency_ms
    if imp.jitter_ms:
        delay_ms += (2.0 * draw(*key, "jitter") - 1.0) * imp.jitter_ms
    return Fate(
        payload=payload,
        truncated=truncated,
        copies=copies,
        delay_s=max(0.0, delay_ms) / 1000.0,
        reorder=_chance(imp.reorder, *key, "reorder"),
    )
