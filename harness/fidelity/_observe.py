"""What one client saw of one fault, and how two such observations are judged."""

from __future__ import annotations

import errno
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from faultnet.sockopts import tcp_segs_in

__all__ = [
    "Inconclusive",
    "Observation",
    "Verdict",
    "classify",
    "confirmed",
    "dispersion",
    "judge",
    "segs_in",
    "share_bound",
    "turn_shares",
]

#: The judgement's tolerance: faultnet's time to notice may differ from the kernel's by
#: a quarter of it plus 0.3 s (scheduling noise on a shared 2-core machine, measured:
#: the same reference case spread 0.05-0.2 s across runs).
RATIO, SLACK_S = 0.25, 0.3

#: A share (of many tries, e.g. connects that needed a SYN retry) is judged by the
#: two-proportion z-test: with both sides drawing from the same probability p, the
#: difference of the shares k1/n1 - k2/n2 has standard deviation
#: sqrt(p (1 - p) (1/n1 + 1/n2)), p estimated pooled ((k1 + k2) / (n1 + n2)). Two
#: shares further apart than Z of those are judged different: Z = 3.29 is the two-sided
#: 0.1 % point of the normal, so two faithful sides are called different once in 1,000
#: judged shares. At n = 128 a side and p = 0.5 the bound is 0.21 (0.14 at p = 0.125):
#: a faultnet side losing no SYNs (0 against the kernel's 0.5) is 9 bounds away.
SHARE_Z = 3.29

#: That bound assumes every try of a side drew from one probability. A side's turns run
#: minutes apart, and the machine's load moves the retransmission timings between them
#: (the two-way loss row's "backed off" share moved 33-44 % a side with the load, and was
#: once judged different under a loaded whole-suite run). A row whose tries come in
#: turns (:attr:`Observation.batch`) measures that itself: the spread of its turns'
#: shares against the binomial spread (Pearson's chi-square over the turns, both sides
#: pooled: the dispersion phi, about 1 when the load held still). A difference beyond
#: :func:`share_bound` but within phi's widening of it (sqrt(phi) times, phi >= 1) is
#: *inconclusive*, not different: the row's turns disagree with each other as much as
#: with the other side, and more tries in quieter turns would decide it.
#:
#: The sides take turns (kernel, faultnet, faultnet, kernel, ...), so a load that moves
#: between turns falls on both and widens phi; one that holds the sides apart for a
#: whole sample does not show in phi. Measured:
#: the two-way loss row's ``unfinished`` downloads, 3-15 of 192 through nft and 9-17
#: through faultnet in 9 samples (quiet, and beside stress-ng --cpu 2), were once 25
#: against 2 in a quiet whole-suite run, every kernel turn (2-7) above every faultnet
#: one (0-1). So a share judged different is measured again (:func:`confirmed`): a
#: difference that a second sample of the row shows too is different, one it does not
#: is *inconclusive* (the row's two samples disagree with each other).

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
    #: For a row of many tries (syn_loss's connects): how many, and how many of them
    #: fell in each share the row counts (e.g. ``retried``, ``failed``), judged by
    #: :func:`share_bound`; None for a row of one try.
    tries: int | None = None
    counts: Mapping[str, int] = field(default_factory=dict)
    #: For a row of many tries: what they are (``connects``), what *seconds* is (``a
    #: retry got in at``), and, where each try took a time of its own, those times (kept
    #: for the record; the shares and the median are what is judged).
    tries_of: str = ""
    seconds_of: str = ""
    times: tuple[float, ...] = ()
    #: For a row whose tries run in turns: how many a turn (*times* holds them in turn
    #: order), so the spread between turns can be measured (see :data:`SHARE_Z`).
    batch: int | None = None

    def text(self) -> str:
        when = "" if self.seconds is None else f" {self.seconds:.2f} s"
        segs = "" if self.segs_in_after is None else f", {self.segs_in_after} segs in"
        if self.tries:
            shares = ", ".join(f"{n} {k} ({n / self.tries:.0%})" for k, n in self.counts.items())
            timed = f"{self.seconds_of}{when}" if when else f"{self.seconds_of}: none"
            return f"{self.outcome}; of {self.tries} {self.tries_of}: {shares}; {timed}"
        return f"{self.outcome}{when}{segs}"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.seconds is not None:
            doc["seconds"] = round(self.seconds, 3)  # ms: the record's diffs stay legible
        doc["times"] = [round(t, 3) for t in self.times]
        return doc


@dataclass(frozen=True)
class Verdict:
    same: bool
    text: str
    #: Not the same, but not shown different either: a share whose turns disagreed with
    #: each other as much as with the other side's (see :data:`SHARE_Z`). Reported, and
    #: not counted as a difference.
    inconclusive: bool = False
    #: Different by a share of one sample's tries (see :func:`confirmed`).
    by_share: bool = False


class Inconclusive(str):
    """A check's finding that does not decide the pair (see :attr:`Verdict.inconclusive`)."""


class ShareDifference(str):
    """A share of one sample's tries judged different: :func:`confirmed` measures again."""


def share_bound(k1: int, n1: int, k2: int, n2: int) -> float:
    """How far apart the shares k1/n1 and k2/n2 may be and still be judged the same
    (:data:`SHARE_Z` pooled standard deviations of their difference)."""
    pooled = (k1 + k2) / (n1 + n2)
    return SHARE_Z * math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))


def turn_shares(obs: Observation, share: str) -> list[float]:
    """*share* in each of *obs*'s turns, in turn order ([] where its tries do not come in
    turns). A share counts the slowest tries (slower than a threshold, or unfinished and
    timed at what they were given), so a turn's count is of its tries at or above the
    share's slowest-k cut of all the times."""
    k_total = obs.counts.get(share)
    if not obs.batch or not obs.times or k_total is None or len(obs.times) <= obs.batch:
        return []
    n = len(obs.times)
    cut = sorted(obs.times, reverse=True)[k_total - 1] if k_total else float("inf")
    turns = [obs.times[i : i + obs.batch] for i in range(0, n, obs.batch)]
    return [sum(1 for t in turn if t >= cut) / len(turn) for turn in turns]


def dispersion(ref: Observation, fn: Observation, share: str) -> float:
    """Phi of *share* over the turns of both sides: Pearson's chi-square of the turns'
    counts against the side's share, over its degrees of freedom (1.0 where there are no
    turns, or a side's share is none or all of its tries)."""
    chi2, df = 0.0, 0
    for obs in (ref, fn):
        shares = turn_shares(obs, share)
        p = obs.counts.get(share, 0) / len(obs.times) if obs.times else 0.0
        if not shares or not 0 < p < 1:
            continue
        assert obs.batch is not None
        m = obs.batch
        chi2 += sum((x * m - m * p) ** 2 / (m * p * (1 - p)) for x in shares)
        df += len(shares) - 1
    return chi2 / df if df else 1.0


# Each check of a pair: None when it holds, else what differs. judge() runs them in
# order and the first that differs is the verdict.
_Check = Callable[[Observation, Observation, bool], "str | None"]


def _same_outcome(ref: Observation, fn: Observation, segments: bool) -> str | None:
    if ref.outcome != fn.outcome:
        return f"different outcome ({fn.outcome}, not {ref.outcome})"
    return None


def _same_time(ref: Observation, fn: Observation, segments: bool) -> str | None:
    if ref.seconds is None or fn.seconds is None:
        return None
    allowed = RATIO * ref.seconds + SLACK_S
    if abs(fn.seconds - ref.seconds) > allowed:
        return f"different time ({fn.seconds:.2f} s, not {ref.seconds:.2f} s +- {allowed:.2f})"
    return None


def _no_more_segments(ref: Observation, fn: Observation, segments: bool) -> str | None:
    if not segments or ref.segs_in_after is None or fn.segs_in_after is None:
        return None
    if fn.segs_in_after > ref.segs_in_after:
        return (
            f"{fn.segs_in_after} segments reached the client after the fault"
            f" ({ref.segs_in_after} through the kernel's)"
        )
    return None


def _same_shares(ref: Observation, fn: Observation, segments: bool) -> str | None:
    if not ref.tries or not fn.tries:
        return None
    for share in sorted(ref.counts.keys() | fn.counts.keys()):
        k1, k2 = ref.counts.get(share, 0), fn.counts.get(share, 0)
        bound = share_bound(k1, ref.tries, k2, fn.tries)
        diff = abs(k2 / fn.tries - k1 / ref.tries)
        if diff <= bound:
            continue
        phi = dispersion(ref, fn, share)
        a, b = turn_shares(ref, share), turn_shares(fn, share)
        # Every turn of one side beyond every turn of the other is different, however
        # widely the turns spread (a side that never backs off, say).
        apart = bool(a and b) and (max(a) < min(b) or max(b) < min(a))
        if not apart and diff <= bound * math.sqrt(max(1.0, phi)):
            return Inconclusive(
                f"inconclusive share {share} ({k2}/{fn.tries}, not {k1}/{ref.tries} +- "
                f"{bound:.2f}; its turns spread {phi:.1f}x the binomial's: the load moved)"
            )
        return ShareDifference(
            f"different share {share} ({k2}/{fn.tries}, not {k1}/{ref.tries} +- {bound:.2f})"
        )
    return None


#: What makes two observations the same failure, in the order judged.
CHECKS: tuple[tuple[str, _Check], ...] = (
    ("the same outcome", _same_outcome),
    (f"time to notice within {1 + RATIO:g}x + {SLACK_S:g} s", _same_time),
    ("no more segments after the fault (rows that count them)", _no_more_segments),
    ("each share of many tries within the binomial bound", _same_shares),
)


def judge(reference: Observation, faultnet: Observation, *, segments: bool = False) -> Verdict:
    """Judge a pair by :data:`CHECKS`: the same outcome; a time to notice within
    :data:`RATIO` x + :data:`SLACK_S` of the reference's; with *segments*, faultnet's
    client takes in no more segments after the fault than the reference's (a dead route
    sends nothing); for many tries, each share within :func:`share_bound`."""
    for _, check in CHECKS:
        why = check(reference, faultnet, segments)
        if why is not None:
            return Verdict(
                False,
                why,
                inconclusive=isinstance(why, Inconclusive),
                by_share=isinstance(why, ShareDifference),
            )
    return Verdict(True, "same")


def confirmed(first: Verdict, again: Callable[[], Verdict]) -> Verdict:
    """*first*, unless it is a difference in a share of tries (:attr:`Verdict.by_share`):
    then the row is measured and judged again (*again*). A second sample that differs
    too decides it (its verdict, naming the first); one that does not makes the row
    *inconclusive*: its two samples disagree (see :data:`SHARE_Z`)."""
    if not first.by_share:
        return first
    second = again()
    if second.same or second.inconclusive:
        return Verdict(
            False,
            f"inconclusive: a first sample: {first.text}; a second: {second.text}",
            inconclusive=True,
        )
    return Verdict(False, f"{second.text}; the first sample too: {first.text}")


def classify(exc: BaseException) -> str:
    """The errno name an exception (or one in its chain, or its message) carries; else
    its class name (e.g. ``TimeoutError`` for a library's own read timeout)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None and e.errno in errno.errorcode:
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
