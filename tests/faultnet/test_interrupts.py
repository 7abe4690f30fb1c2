"""faultnet.interrupts for synchronous code: real signals sent to this very process."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref

import pytest

from faultnet.interrupts import INTERRUPT_SIGNALS, Interrupted, raising_on_signals


def test_a_signal_raises_where_the_code_is_and_every_finally_runs() -> None:
    before = {s: signal.getsignal(s) for s in INTERRUPT_SIGNALS}
    unwound: list[str] = []
    with pytest.raises(Interrupted) as got, raising_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("not reached: the handler raises as kill returns")
        finally:
            unwound.append("inner")
            os.kill(os.getpid(), signal.SIGHUP)  # a second one while unwinding: swallowed
            unwound.append("after the second")
    assert got.value.signum == signal.SIGTERM and got.value.exit_code == 143
    assert str(got.value) == "SIGTERM"
    assert unwound == ["inner", "after the second"]
    assert {s: signal.getsignal(s) for s in INTERRUPT_SIGNALS} == before


def test_report_says_which_signal_and_returns_its_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert Interrupted(signal.SIGINT).report("stopped two processes") == 130
    assert capsys.readouterr().err == "interrupted by SIGINT; stopped two processes\n"


def test_an_interrupt_lost_in_a_weakref_callback_is_raised_again_outside_it() -> None:
    # The signal's handler runs inside the callback, where Python can only print what
    # it raises: the bench once ran to its end through a SIGTERM lost that way.
    class Thing:
        pass

    def callback(ref: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        ran.append("callback")  # the handler has run by now, here, inside the callback

    ran: list[str] = []
    thing = Thing()
    ref = weakref.ref(thing, callback)
    with pytest.raises(Interrupted) as got, raising_on_signals():
        del thing  # the callback runs now
        ran.append("after the callback")
        time.sleep(5)  # the interrupt comes again and ends the sleep
        pytest.fail("not reached: the interrupt was lost for good")
    assert got.value.signum == signal.SIGTERM
    assert ran == ["after the callback"]  # the raise inside the callback cut it short
    assert ref() is None


def test_a_sigalrm_with_no_lost_interrupt_raises_nothing_and_is_given_back() -> None:
    # The block takes SIGALRM over to raise a lost interrupt again; a SIGALRM with none
    # behind it ends nothing, and the handler and sys.unraisablehook are back after.
    before = signal.getsignal(signal.SIGALRM), sys.unraisablehook
    with raising_on_signals():
        os.kill(os.getpid(), signal.SIGALRM)  # the handler runs as kill returns
        reached = True
    assert reached
    assert (signal.getsignal(signal.SIGALRM), sys.unraisablehook) == before
