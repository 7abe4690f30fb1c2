"""``slicer``: chunks split into pieces of ``average_size`` ± ``size_variation`` bytes,
``delay`` microseconds apart.

Theory of operation: the pauses are a schedule, not a sleep after each send. Piece *i*
of a run is due ``delay`` after piece *i - 1* was *due* (not after it was sent), so the
time a send, a wake-up or the scheduler takes is not added to every pause. The wait for
a due time is a timerfd (nanosecond resolution) whose readiness trio's own epoll
reports: trio's timer sleeps in whole milliseconds (``epoll_wait``'s timeout, rounded
up), so a 100 µs pause took ~1.5 ms and 500 KB in 64-byte slices 15.2 s instead of
~0.8 s. Pieces already due (after a late wake-up) go out back to back, each its own
write; a schedule that fell more than ``_MAX_LAG`` behind (a write held up by a slow
reader, a starved process) starts again from now rather than paying the debt in a burst.
Under trio's MockClock (tests) the wait is an ordinary trio sleep.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable

import trio

from faultnet.toxics._attributes import Attribute, AttributeToxic
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.clock import monotonic_offset
from faultnet.toxics.registry import register

__all__ = ["Slicer"]

#: How far behind its schedule a stream may fall and still catch up with pieces sent back
#: to back; beyond it the schedule restarts from now. Wake-ups measured here were late by
#: 50-150 µs at a load of 7 on 2 cores; a write blocked by a slow reader can be late by
#: anything.
_MAX_LAG = 0.002


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


@register
class Slicer(AttributeToxic):
    """Split every chunk into small pieces, with a pause between consecutive pieces.

    Piece sizes are drawn uniformly from ``average_size ± size_variation`` (at least 1
    byte) with the connection's seeded rng. ``average_size`` 0 passes chunks whole. The
    pause separates every two consecutive pieces of the stream, across chunks too, kept
    as a schedule (piece *i* due ``delay`` after piece *i - 1* was due), so it holds to
    within ~20 % down to 100 µs (the median of the gaps between pieces, measured). Bytes
    are kept exact and in order.
    """

    type = "slicer"
    ATTRIBUTES = (
        Attribute("average_size", 0, "mean size of a piece, in bytes"),
        Attribute("size_variation", 0, "random variation of a piece's size, ± bytes"),
        Attribute("delay", 0, "pause between two pieces, in microseconds"),
    )
    average_size: int
    size_variation: int
    delay: int

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        pos = 0
        while pos < len(data):
            size = self.average_size
            if size <= 0:
                size = len(data) - pos
            elif self.size_variation > 0:
                size = max(1, size + ctx.rng.randint(-self.size_variation, self.size_variation))
            piece = data[pos : pos + size]
            delay = max(0, self.delay) / 1_000_000
            due = t_read
            scheduled = ctx.state.get("next_due")
            if scheduled is not None and delay > 0:
                due = max(due, scheduled)
                now = trio.current_time()
                if due > now:
                    await sleep_until_precisely(due)
                elif now - due > _MAX_LAG:
                    due = now  # too far behind to catch up: the schedule restarts
            await ctx.forward(piece, due)
            ctx.state["next_due"] = due + delay
            pos += len(piece)
