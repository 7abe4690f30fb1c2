"""The fidelity verdict, as a table: what counts as the same failure."""

from __future__ import annotations

import errno

import pytest

from harness.fidelity import Observation, judge
from harness.fidelity._observe import classify, median_of

REF = Observation("ETIMEDOUT", 3.0, segs_in_after=0)


@pytest.mark.parametrize(
    ("faultnet", "segments", "same", "says"),
    [
        (Observation("ETIMEDOUT", 3.0, segs_in_after=0), True, True, "same"),
        # 1.25 x 3.0 + 0.3 = 4.05: inside; 6.4 s (the blackhole): outside.
        (Observation("ETIMEDOUT", 4.0, segs_in_after=0), True, True, "same"),
        (Observation("ETIMEDOUT", 6.4, segs_in_after=0), True, False, "different time"),
        (Observation("ETIMEDOUT", 1.9, segs_in_after=0), True, False, "different time"),
        (Observation("TimeoutError", 3.0, segs_in_after=0), True, False, "different outcome"),
        (Observation("hang", None), True, False, "different outcome"),
        # Segments after the fault count only where the row asks for them.
        (Observation("ETIMEDOUT", 3.0, segs_in_after=5), True, False, "5 segments"),
        (Observation("ETIMEDOUT", 3.0, segs_in_after=5), False, True, "same"),
    ],
)
def test_a_pair_is_the_same_only_with_the_same_outcome_at_about_the_same_time(
    faultnet: Observation, segments: bool, same: bool, says: str
) -> None:
    verdict = judge(REF, faultnet, segments=segments)
    assert verdict.same is same
    assert verdict.text.startswith(says)


def test_two_hangs_are_the_same() -> None:
    assert judge(Observation("hang", None), Observation("hang", None)).same


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (TimeoutError(errno.ETIMEDOUT, "Connection timed out"), "ETIMEDOUT"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "ECONNRESET"),
        # A library's own read timeout carries no errno: its class name.
        (TimeoutError("timed out"), "TimeoutError"),
        # libpq's message only (psycopg): the errno found by its text.
        (RuntimeError("server closed: Connection timed out"), "ETIMEDOUT"),
    ],
)
def test_an_error_is_classified_by_its_errno(exc: BaseException, name: str) -> None:
    assert classify(exc) == name


def test_runs_become_their_commonest_outcome_and_median_time() -> None:
    runs = [Observation("intact", t) for t in (1.0, 3.0, 2.0)] + [Observation("hang", None)]
    m = median_of(runs)
    assert (m.outcome, m.seconds) == ("intact", 2.0)
    assert "4 runs, 3 intact" in m.detail
