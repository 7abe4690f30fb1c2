"""One time scale for an experiment: every wait it makes and every timing it hands the bot.

At ``factor == 1.0`` the experiments keep the real timings the bot contract names (60 s
keepalive idle, 30 s PONG timeout, 3 s confirmation budget, ...). CI runs them at a small
factor (0.02-0.05) so each experiment takes seconds. The factor scales the *scenario*
(how long a link stays frozen, how often a chatty bot posts, how long the bot waits
before it pings) and the bot's own clocks by the same amount, so the ratios the
experiments are about (chat interval below idle threshold, confirmation budget below the
PONG timeout) hold at every scale.

Two kinds of duration, deliberately kept apart:

* :meth:`TimeScale.scenario` (also ``scale(x)``): a timing that IS the experiment. Scaled,
  never floored, except for the few bot timings in :data:`BOT_FLOORS` (see there).
* :meth:`TimeScale.bound`: how long to wait for something that should happen (a process
  starting, a message arriving). Scaled, but never below its floor: an interpreter takes
  the same 1-2.5 s to start at any time scale, and a bound that expires first turns a
  slow machine into a false finding.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "BOT_ENV",
    "BOT_FLOORS",
    "REAL",
    "TimeScale",
    "time_scale_from",
]

#: Real timings (seconds) at factor 1.0: the bot contract's defaults and the seed
#: experiments' scenario timings.
REAL: dict[str, float] = {
    # the bot's own clocks (handed over as BOT_* variables)
    "keepalive_idle": 60.0,
    "pong_timeout": 30.0,
    "confirm_budget": 3.0,
    "reconnect_base": 1.0,
    "reconnect_max": 16.0,
    # the scenarios
    "chat_interval": 20.0,  # a chatty worker posts this often: below keepalive_idle
    "outage_post_interval": 10.0,  # silent_loss: between posts into the dead link
    "late_delivery_wait": 30.0,  # silent_loss: how long a lost post may still arrive
    "latency_post_interval": 1.0,  # confirm_latency: between healthy posts
    "settle": 2.0,  # after connect, before the first measurement
    "server_ping_interval": 90.0,  # the enclave's own keepalive (--env auto only)
    "server_ping_timeout": 60.0,
}

#: Which REAL key feeds which bot environment variable.
BOT_ENV: dict[str, str] = {
    "keepalive_idle": "BOT_KEEPALIVE_IDLE_S",
    "pong_timeout": "BOT_PONG_TIMEOUT_S",
    "confirm_budget": "BOT_CONFIRM_BUDGET_S",
    "reconnect_base": "BOT_RECONNECT_BASE_S",
    "reconnect_max": "BOT_RECONNECT_MAX_S",
}

#: Floors (seconds) for bot timings that, scaled further, would measure this machine's
#: scheduler rather than the bot. The confirmation budget scaled to 0.02 would be 60 ms;
#: one post's round trip through an MCP SDK bot on a loaded 2-core box has been seen
#: past that, so a healthy post would come back UNCONFIRMED and every arm would fail the
#: same way. 0.25 s keeps it far below the scaled PONG timeout at factor >= 0.02
#: (0.6 s), preserving the contract's "budget well under the PONG timeout".
BOT_FLOORS: dict[str, float] = {
    "confirm_budget": 0.25,
    "pong_timeout": 0.5,
    "reconnect_base": 0.05,
}

MIN_FACTOR = 0.005
MAX_FACTOR = 10.0


@dataclass(frozen=True)
class TimeScale:
    """A time scale factor. ``TimeScale(1.0)`` is real time."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and MIN_FACTOR <= self.factor <= MAX_FACTOR):
            raise ValueError(
                f"time scale must be between {MIN_FACTOR} and {MAX_FACTOR}, got {self.factor!r}"
            )

    def scenario(self, seconds: float) -> float:
        """*seconds* of scenario time at this scale."""
        return seconds * self.factor

    __call__ = scenario

    def real(self, key: str) -> float:
        """The named :data:`REAL` timing at this scale (bot timings floored)."""
        value = REAL[key] * self.factor
        return max(value, BOT_FLOORS.get(key, 0.0))

    def bound(self, seconds: float, floor: float = 10.0) -> float:
        """A wait bound: *seconds* scaled, but never below *floor*."""
        return max(seconds * self.factor, floor)

    def bot_env(self) -> dict[str, str]:
        """The BOT_* timing variables for this scale (strings, as the environment wants)."""
        return {var: _fmt(self.real(key)) for key, var in BOT_ENV.items()}

    @property
    def detection_window(self) -> float:
        """When a silent bot's own keepalive must have fired after inbound stops:
        idle threshold plus PONG timeout."""
        return self.real("keepalive_idle") + self.real("pong_timeout")


def _fmt(seconds: float) -> str:
    return f"{seconds:.6g}"


def time_scale_from(value: float | str | None) -> TimeScale:
    """The time scale from a flag value, else ``HARNESS_TIME_SCALE``, else 1.0.

    Raises ValueError (with the offending text) for a value that is not a usable factor.
    """
    raw: float | str | None = value
    source = "--time-scale"
    if raw is None:
        raw = os.environ.get("HARNESS_TIME_SCALE")
        source = "HARNESS_TIME_SCALE"
    if raw is None or raw == "":
        return TimeScale(1.0)
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{source}: not a number: {raw!r}") from None
    try:
        return TimeScale(factor)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
