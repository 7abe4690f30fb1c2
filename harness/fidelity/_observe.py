"""What one client saw of one fault, and how two such observations are judged."""

from __future__ import annotations

import errno
import os
import socket
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from faultnet.sockopts import tcp_segs_in

__all__ = ["Observation", "Verdict", "classify", "judge", "median_of", "segs_in"]

#: The judgement's tolerance: faultnet's time to notice may differ from the kernel's by
#: a quarter of it plus 0.3 s (scheduling noise on a shared 2-core machine, measured:
#: the same reference case spread 0.05-0.2 s across runs).
RATIO, SLACK_S = 0.25, 0.3

_STRERRORS = {os.strerror(code).lower(): name for code, name in errno.errorcode.items()}


@dataclass(frozen=True)
class Observation:
    """One client's view of one fault, times from the fault call's return."""

    #: ``ETIMEDOUT``, ``ECONNRESET``, ``EOF``, ``hang``, ``connected``, ``curl exit 28``,
    #: ``intact`` ... : an errno name where the client's error carries one.
    outcome: str
    #: Time to notice (None for a hang: nothing was noticed within the bound).
    seconds: float | None
    #: Bytes the client read after the fault call returned.
    bytes_after: int | None = None
    #: Segments the client's socket took in after the fault call returned (None where
    #: the client's socket cannot be asked, e.g. curl's).
    segs_in_after: int | None = None
    detail: str = ""

    def text(self) -> str:
        when = "" if self.seconds is None else f" {self.seconds:.2f} s"
        segs = "" if self.segs_in_after is None else f", {self.segs_in_after} segs in"
        return f"{self.outcome}{when}{segs}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    same: bool
    text: str


def judge(reference: Observation, faultnet: Observation, *, segments: bool = False) -> Verdict:
    """Same outcome, and a time to notice within :data:`RATIO` x + :data:`SLACK_S` of
    the reference's; with *segments*, faultnet's client also takes in no more segments
    after the fault than the reference's (a dead route sends nothing)."""
    if reference.outcome != faultnet.outcome:
        return Verdict(False, f"different outcome ({faultnet.outcome}, not {reference.outcome})")
    if reference.seconds is not None and faultnet.seconds is not None:
        allowed = RATIO * reference.seconds + SLACK_S
        if abs(faultnet.seconds - reference.seconds) > allowed:
            return Verdict(
                False,
                f"different time ({faultnet.seconds:.2f} s, not {reference.seconds:.2f} s"
                f" +- {allowed:.2f})",
            )
    if (
        segments
        and reference.segs_in_after is not None
        and faultnet.segs_in_after is not None
        and faultnet.segs_in_after > reference.segs_in_after
    ):
        return Verdict(
            False,
            f"{faultnet.segs_in_after} segments reached the client after the fault"
            f" ({reference.segs_in_after} through the kernel's)",
        )
    return Verdict(True, "same")


def classify(exc: BaseException) -> str:
    """The errno name an exception (or one in its chain, or its message) carries; else
    its class name (e.g. ``TimeoutError`` for a library's own read timeout)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in errno.errorcode:
            return errno.errorcode[e.errno]
        for arg in e.args:
            if isinstance(arg, int | str):
                name = _from_text(str(arg))
                if name:
                    return name
        e = e.__cause__ or e.__context__
    return type(exc).__name__


def _from_text(text: str) -> str | None:
    low = text.lower()
    for message, name in _STRERRORS.items():
        if message and message in low and len(message) > 8:
            return name
    if "error 110" in low:  # redis-py's "Error 110 while ..."
        return "ETIMEDOUT"
    return None


def segs_in(fd: int) -> int:
    """``tcpi_segs_in`` of the TCP socket behind descriptor *fd*."""
    s = socket.socket(fileno=os.dup(fd))
    try:
        return tcp_segs_in(s)
    finally:
        s.close()


def median_of(runs: list[Observation]) -> Observation:
    """Many runs as one observation: the commonest outcome, the median time over the
    runs that had it, and the run count and spread in *detail*."""
    outcomes = [r.outcome for r in runs]
    common = max(set(outcomes), key=outcomes.count)
    times = sorted(r.seconds for r in runs if r.outcome == common and r.seconds is not None)
    median = statistics.median(times) if times else None
    spread = f"{len(runs)} runs, {outcomes.count(common)} {common}"
    if times:
        spread += f", {times[0]:.2f}-{times[-1]:.2f} s"
    return Observation(common, median, detail=spread)
