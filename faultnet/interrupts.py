"""Ending a command cleanly when it is interrupted: one routine every front door shares.

A default SIGTERM kills a process on the spot, and trio's default SIGINT raises
KeyboardInterrupt wherever the program happens to be, which surfaces as a traceback (an
exception group) and skips nothing but can interleave with cleanup. Instead
:func:`cancel_on_signals` turns SIGINT, SIGTERM and SIGHUP into a cancellation of the
command: every ``finally`` and ``async with`` unwinds (proxies closed, processes stopped
by their recorded identity), and the command exits 128 + the signal number with one line
on stderr. Signals that arrive while it unwinds (a second Ctrl-C) are swallowed: the
cleanup is already under way and is bounded on its own.

Synchronous code (no trio loop to cancel) gets the same from :func:`raising_on_signals`:
the first such signal raises :class:`Interrupted` where the code is, so its ``finally``
blocks unwind just the same.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

__all__ = ["INTERRUPT_SIGNALS", "Interrupted", "cancel_on_signals", "raising_on_signals"]

#: The signals that cancel a command instead of killing it.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def cancel_on_signals(
    fn: Callable[..., Awaitable[int]], *args: Any, cleaned: str = "cleaned up"
) -> int:
    """Await ``fn(*args)`` (an exit code); a signal in :data:`INTERRUPT_SIGNALS` cancels
    it instead, and then this returns 128 + the signal number after printing
    ``interrupted by SIGNAME; CLEANED`` on stderr. Main thread only (trio's signal
    receiver)."""
    got: int | None = None
    code = 2
    body = trio.CancelScope()
    # Leaving trio's receiver redelivers the signals still queued in it, with the
    # handlers from before it: make those handlers swallow them, or a second Ctrl-C in
    # the cleanup would come back as a KeyboardInterrupt traceback (or a SIGTERM as a
    # kill) once the cleanup is done.
    previous = {signum: signal.signal(signum, _swallow) for signum in INTERRUPT_SIGNALS}
    try:
        with trio.open_signal_receiver(*INTERRUPT_SIGNALS) as sigs:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    nonlocal got
                    async for signum in sigs:  # every signal, so none stays queued
                        if got is None:
                            got = signum
                            body.cancel()

                nursery.start_soon(watch)
                with body:
                    code = await fn(*args)
                nursery.cancel_scope.cancel()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if got is not None:
        return Interrupted(got).report(cleaned)
    return code


class Interrupted(BaseException):
    """A signal of :data:`INTERRUPT_SIGNALS` arrived inside :func:`raising_on_signals`.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` does not stop it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended."""
        return 128 + self.signum

    def report(self, cleaned: str = "cleaned up") -> int:
        """Print ``interrupted by SIGNAME; CLEANED`` on stderr; return :attr:`exit_code`."""
        print(f"interrupted by {self}; {cleaned}", file=sys.stderr)
        return self.exit_code


#: How long after a lost :class:`Interrupted` it is raised again (see raising_on_signals).
REDELIVER_S = 0.001


@contextlib.contextmanager
def raising_on_signals() -> Iterator[None]:
    """Inside this block (main thread), the first signal of :data:`INTERRUPT_SIGNALS`
    raises :class:`Interrupted` wherever the code is, so every ``finally`` unwinds
    (processes stopped by their recorded identity); later ones are swallowed while it
    unwinds. The previous handlers are back once the block is left.

    Python runs a signal handler wherever the main thread is, also inside a weakref
    callback or a ``__del__``, where an exception can only be printed ("Exception
    ignored in ...") and is lost: seen once in ~10 runs of the bench's SIGTERM test,
    which then ran to its end. So a lost Interrupted is raised again REDELIVER_S later
    (SIGALRM, taken over for the block), by then back in the code it was meant for."""
    got: list[int] = []

    def interrupt(signum: int, _frame: object) -> None:
        if not got:  # later ones: the first is already unwinding the code
            got.append(signum)
            raise Interrupted(signum)

    def again(signum: int, _frame: object) -> None:
        if got:  # else a SIGALRM of someone else's: nothing of ours to raise
            raise Interrupted(got[0])

    def lost(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)
        else:
            hook(unraisable)

    previous = {signum: signal.signal(signum, interrupt) for signum in INTERRUPT_SIGNALS}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, again)
    hook, sys.unraisablehook = sys.unraisablehook, lost
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _swallow(signum: int, _frame: object) -> None:
    """A signal that arrived after the first one, while the command unwound: ignored."""
