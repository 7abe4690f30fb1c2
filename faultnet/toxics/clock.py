"""trio's clock against the kernel's: what turns a plane's read time into trio time.

A plane stamps each chunk it reads for trio with CLOCK_MONOTONIC (C: ``clock_gettime``;
Python: ``time.monotonic()``). trio's real clock (``SystemClock``) is
``offset + time.perf_counter()``, a random offset it picks per run, and perf_counter is
CLOCK_MONOTONIC on Linux; so trio time = read time + offset, exactly. Under any other
clock (``MockClock`` in tests) the kernel's time means nothing to trio: callers fall back
to ``trio.current_time()`` when they take the chunk.
"""

from __future__ import annotations

import time

import trio

__all__ = ["monotonic_offset"]

_SAME_CLOCK = (
    time.get_clock_info("perf_counter").implementation
    == time.get_clock_info("monotonic").implementation
    == "clock_gettime(CLOCK_MONOTONIC)"
)


def monotonic_offset() -> float | None:
    """trio's clock minus CLOCK_MONOTONIC, if trio's clock is its real one (its
    SystemClock is ``offset + perf_counter()``, and perf_counter is CLOCK_MONOTONIC on
    Linux); None under any other clock (MockClock), whose time is not the kernel's."""
    clock = trio.lowlevel.current_clock()
    offset = getattr(clock, "offset", None)
    if type(clock).__name__ != "SystemClock" or not isinstance(offset, float):
        return None
    return offset if _SAME_CLOCK else None
