"""trio's clock against the kernel's: what turns a plane's read time into trio time.

A plane stamps each chunk it reads for trio with CLOCK_MONOTONIC (C: ``clock_gettime``;
Python: ``time.monotonic()``). trio's real clock (``SystemClock``) is
``offset + time.perf_counter()``, a random offset it picks per run, and perf_counter is
CLOCK_MONOTONIC on Linux; so trio time = read time + offset, exactly. Under any other
clock (``MockClock`` in tests) the kernel's time means nothing to trio: callers fall back
to ``trio.current_time()`` when they take the chunk.

:func:`sleep_until_precisely` sleeps until a trio time to within the kernel's timer
slack (~50 us), where trio's own timer rounds every sleep up to its next millisecond
(``epoll_wait``'s timeout): a timerfd on CLOCK_MONOTONIC, armed at the deadline less the
offset above, whose readiness trio's epoll reports. The slicer's pauses and the latency
toxic's delays wait with it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable

import trio

__all__ = ["monotonic_offset", "sleep_until_precisely"]

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


class _ITimerSpec(ctypes.Structure):
    # struct itimerspec: it_interval then it_value, each a struct timespec.
    _fields_ = [
        ("interval_sec", ctypes.c_long),
        ("interval_nsec", ctypes.c_long),
        ("value_sec", ctypes.c_long),
        ("value_nsec", ctypes.c_long),
    ]


_TFD_TIMER_ABSTIME = 1


def _load_timerfd() -> tuple[Callable[..., int], Callable[..., int]] | None:
    # Linux's timerfd through libc (os.timerfd_create is Python 3.13's); None elsewhere.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return create, settime


_timerfd = _load_timerfd()
_PR_GET_TIMERSLACK = 30


@functools.cache
def _timer_slack() -> float:
    """The timer slack in seconds (50 µs by default) of the first thread that asks:
    the kernel may fire a timer up to this late, and on a quiet machine it fires that
    late. Read once (a prctl each sleep would cost more than the precision it buys)."""
    try:
        slack = ctypes.CDLL(None).prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return 0.0
    return slack / 1e9 if 0 < slack < 10_000_000 else 0.0


async def sleep_until_precisely(deadline: float) -> None:
    """Sleep until the trio time *deadline*, to within the kernel's timer slack (~50 µs)
    where trio's own timer gives a millisecond; a checkpoint if it has passed."""
    offset = monotonic_offset() if _timerfd is not None else None
    if offset is None or _timerfd is None:
        await trio.sleep_until(deadline)
        return
    if deadline <= trio.current_time():
        await trio.lowlevel.checkpoint()
        return
    create, settime = _timerfd
    fd = create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:  # out of descriptors: the coarse sleep still keeps the schedule's average
        await trio.sleep_until(deadline)
        return
    try:
        # Armed a timer slack early: it fires between then and the deadline, not after.
        at = deadline - offset - _timer_slack()
        sec = int(at)
        spec = _ITimerSpec(0, 0, sec, int((at - sec) * 1e9))
        if settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await trio.sleep_until(deadline)
            return
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)  # the wait is over or was cancelled: trio no longer watches fd
