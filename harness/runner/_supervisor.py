"""A command whose children cannot outlive it: the runner under a supervisor.

:func:`supervised` forks once, before the command has started anything (no thread yet):
the process the user started becomes the **supervisor**, and its child, the
**runner**, runs the command. Theory of operation:

* The runner asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``,
  through ``prctl``), then checks that its parent is still the supervisor (it may have
  died before the ``prctl``: then the runner ends before it starts anything). So a
  SIGKILL of the command's PID becomes a SIGTERM of the runner, which undoes what it did
  as on any SIGTERM (bots closed, the private server stopped by its recorded PID). The
  death signal is reliable here because the supervisor's only thread made the fork: the
  kernel sends it when the forking THREAD ends, which is why the server and the bots,
  started from trio's worker threads (they end after 10 s idle), cannot carry one.
* The supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``): if the runner
  itself is killed, what it started is re-parented to the supervisor, not to init. The
  supervisor then stops each (SIGTERM, a bounded wait, SIGKILL: :func:`stop_exact`) and
  reaps it; a process it has not reaped keeps its PID, so the signal cannot reach
  another. Only the runner's descendants can be re-parented to it: it stops what the
  runner started and nothing else (a process that double-forked on purpose to outlive
  the command included: none of the harness's do).
* SIGINT, SIGTERM and SIGHUP sent to the supervisor by ``kill`` are passed on to the
  runner; one the terminal sends already reaches the whole process group, the runner
  with it, and is not passed twice.
* The supervisor ends with the runner's exit status (128 + N when signal N ended it),
  once nothing the runner started is left.

Without ``prctl`` (not Linux) the command runs unsupervised, as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

from faultnet.procs import ProcessIdentity, children, stop_exact

__all__ = ["PASSED_ON", "supervised"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: siginfo's si_code of a signal the kernel itself sent (a terminal's Ctrl-C, SIGCHLD).
SI_KERNEL = 0x80
#: The signals the supervisor passes on to the runner.
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds a left-over process gets after SIGTERM, then after SIGKILL.
STOP_BOUNDS_S = (5.0, 5.0)
#: Rounds of stopping what is left: a stopped process's own children come to us next.
MAX_ROUNDS = 20


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def supervised(main: Callable[[], int]) -> int:
    """Run *main* (an exit code) in a runner under a supervisor (see the module's
    docstring). Returns *main*'s exit code in the runner and the runner's in the
    supervisor: call it once, first thing, and exit with what it returns."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):  # not Linux: no supervisor
        return main()
    sys.stdout.flush()
    sys.stderr.flush()
    watched = {*PASSED_ON, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    supervisor = os.getpid()
    runner = os.fork()
    if runner == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor:  # it died before the prctl: nothing started yet
            return 128 + signal.SIGTERM
        return main()
    return _supervise(runner, watched)


def _supervise(runner: int, watched: set[signal.Signals]) -> int:
    status: int | None = None
    while status is None:
        info = signal.sigwaitinfo(watched)
        if info.si_signo == signal.SIGCHLD:
            status = _reap(runner)
        elif info.si_code != SI_KERNEL and info.si_pid != runner:
            try:
                os.kill(runner, info.si_signo)  # unreaped: the PID is still the runner's
            except ProcessLookupError:
                pass
    left = _stop_left()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        code = 128 + sig
        how = f"was killed by {signal.Signals(sig).name}"
    else:
        code = os.waitstatus_to_exitcode(status)
        how = f"exited {code}"
    if left:
        print(
            f"harness: the runner (pid {runner}) {how}; stopped what it left, by PID: "
            + ", ".join(left),
            file=sys.stderr,
            flush=True,
        )
    return code


def _reap(runner: int) -> int | None:
    """Reap every child that has exited; the runner's wait status if it is one."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == runner:
            status = st


def _stop_left() -> list[str]:
    """Stop and reap every process the runner left (re-parented to us); say each."""
    said: list[str] = []
    for _ in range(MAX_ROUNDS):
        pids = children(os.getpid())
        if not pids:
            break
        for pid in pids:
            try:
                ident = ProcessIdentity.of(pid)
            except ProcessLookupError:
                continue
            report = stop_exact(ident, term_timeout=STOP_BOUNDS_S[0], kill_timeout=STOP_BOUNDS_S[1])
            what = " ".join(ident.cmdline[:4]) or "?"
            if report.outcome != "gone":
                said.append(f"{pid} ({what}): {report.outcome}")
            try:  # a process that survived SIGKILL is not waited for: it may never end
                os.waitpid(pid, os.WNOHANG if report.outcome == "survived" else 0)
            except ChildProcessError:
                pass
        _reap(-1)
    return said
