"""The fidelity verdict, as a table: what counts as the same failure."""

from __future__ import annotations

import errno
import random
import statistics

import pytest

from harness.fidelity import Observation, judge
from harness.fidelity._observe import CHECKS, Verdict, classify, confirmed, dispersion, share_bound

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


def _connects(retried: int, failed: int, tries: int = 128, at: float | None = 1.02) -> Observation:
    return Observation(
        "connected or timed out",
        at,
        tries=tries,
        counts={"retried": retried, "failed": failed},
        tries_of="connects",
        seconds_of="a retry got in at",
    )


# The kernel dropping 50 % of SYNs: 128 connects, half needing a retry, an eighth not in
# within the timeout (three SYNs dropped). The bound: 3.29 pooled standard deviations.
SYN_REF = _connects(64, 16)


@pytest.mark.parametrize(
    ("faultnet", "same", "says"),
    [
        (_connects(64, 16), True, "same"),
        # Two faithful draws differ by chance: 48 % and 56 % retried, 9 % and 14 % failed.
        (_connects(56, 12), True, "same"),
        (_connects(72, 18), True, "same"),
        # A faultnet side dropping no SYNs (0 %), with the same outcome words (a
        # timeout elsewhere): no retries, none failed. Measured for real, its outcome
        # differs first ("connected": no timeout at all).
        (_connects(0, 0, at=None), False, "different share failed (0/128, not 16/128"),
        # As many failures but too few retried: the other share alone.
        (_connects(16, 16), False, "different share retried (16/128, not 64/128"),
        # Dropping 25 %, measured: 29 retried, 2 failed against the kernel's 50 %.
        (_connects(29, 2), False, "different share failed"),
        # Every SYN dropped: all fail.
        (_connects(128, 128), False, "different share failed"),
        # The same shares, retries that got in late: the time is judged as ever.
        (_connects(64, 16, at=2.0), False, "different time"),
        # A different number of tries is judged by the shares, not the counts.
        (_connects(32, 8, tries=64), True, "same"),
    ],
)
def test_many_tries_are_judged_by_their_shares_within_the_binomial_bound(
    faultnet: Observation, same: bool, says: str
) -> None:
    verdict = judge(SYN_REF, faultnet)
    assert verdict.same is same, verdict.text
    assert verdict.text.startswith(says), verdict.text


@pytest.mark.parametrize(
    ("k1", "k2", "n", "bound"),
    [
        (64, 64, 128, 0.206),  # p = 0.5: 3.29 x sqrt(0.25 x 2 / 128)
        (16, 16, 128, 0.136),  # p = 0.125
        (0, 0, 128, 0.0),  # nothing to tell apart: any difference differs
    ],
)
def test_the_share_bound_is_the_two_proportion_z_test(
    k1: int, k2: int, n: int, bound: float
) -> None:
    assert share_bound(k1, n, k2, n) == pytest.approx(bound, abs=0.001)


def test_the_checks_are_one_table_in_order() -> None:
    names = [name for name, _ in CHECKS]
    assert names[0] == "the same outcome" and len(names) == 4
    assert any("share" in n for n in names) and any("segments" in n for n in names)


def test_a_row_of_many_tries_reads_as_its_shares() -> None:
    text = _connects(61, 18).text()
    assert text == (
        "connected or timed out; of 128 connects: 61 retried (48%), 18 failed (14%);"
        " a retry got in at 1.02 s"
    )
    assert "a retry got in at: none" in _connects(0, 0, at=None).text()


def _downloads(per_turn: list[int], batch: int = 32) -> Observation:
    """Lossy downloads in turns of *batch*: per turn, how many backed off (0.6 s; the
    rest 0.1 s)."""
    times: list[float] = []
    for k in per_turn:
        times += [0.6] * k + [0.1] * (batch - k)
    return Observation(
        "intact",
        0.1,
        tries=len(times),
        counts={"backed off": sum(per_turn), "unfinished": 0},
        times=tuple(times),
        batch=batch,
    )


@pytest.mark.parametrize(
    "kernel,faultnet,verdict",
    [
        # Each side's turns alike, the sides apart (41 % against 66 %): different.
        ([13] * 6, [21] * 6, "different share backed off"),
        # The same shares: the same, however the turns spread.
        ([4, 22] * 3, [22, 4] * 3, "same"),
        # As far apart, but each side's own turns spread 13x the binomial's (the load
        # moved between turns) and overlap the other side's: not decided.
        ([4, 22] * 3, [12, 30] * 3, "inconclusive share backed off"),
        # A side that never backs off is different however widely the other spreads:
        # every one of its turns lies below every turn of the other's.
        ([4, 22] * 3, [0] * 6, "different share backed off"),
    ],
)
def test_a_share_whose_turns_spread_beyond_chance_is_inconclusive_not_different(
    kernel: list[int], faultnet: list[int], verdict: str
) -> None:
    v = judge(_downloads(kernel), _downloads(faultnet))
    assert v.text.startswith(verdict), v
    assert v.inconclusive == verdict.startswith("inconclusive")
    assert v.same == (verdict == "same")


Turns = tuple[list[int], list[int]]


@pytest.mark.parametrize(
    "first,second,verdict",
    [
        # Different in one sample, not in the next: the row's two samples disagree.
        (([13] * 6, [21] * 6), ([13] * 6, [14] * 6), "inconclusive: a first sample: different"),
        (([13] * 6, [21] * 6), ([4, 22] * 3, [12, 30] * 3), "inconclusive: a first sample"),
        # Different in both: different, the first named too.
        (([13] * 6, [21] * 6), ([13] * 6, [22] * 6), "different share backed off"),
        # The same at once: not measured again.
        (([13] * 6, [13] * 6), None, "same"),
    ],
)
def test_a_share_judged_different_stands_only_if_a_second_sample_differs_too(
    first: Turns, second: Turns | None, verdict: str
) -> None:
    measured: list[Turns] = []

    def again() -> Verdict:
        assert second is not None, "measured again"
        measured.append(second)
        return judge(_downloads(second[0]), _downloads(second[1]))

    v = confirmed(judge(_downloads(first[0]), _downloads(first[1])), again)
    assert v.text.startswith(verdict), v
    assert len(measured) == (second is not None)
    assert v.inconclusive == verdict.startswith("inconclusive")
    assert v.same == (verdict == "same")
    if not v.same and not v.inconclusive:
        assert "the first sample too: different share" in v.text


@pytest.mark.parametrize(
    "faultnet", [Observation("hang", None), Observation("ETIMEDOUT", 6.4, segs_in_after=0)]
)
def test_a_different_outcome_or_time_is_not_measured_again(faultnet: Observation) -> None:
    v = confirmed(judge(REF, faultnet), lambda: pytest.fail("measured again"))
    assert not v.same and not v.inconclusive


def test_the_dispersion_is_about_one_for_binomial_turns() -> None:
    """Turns drawn from one probability spread as the binomial does: phi near 1, so the
    bound is not widened by chance alone (seeded: 200 rows of 6 turns of 32 at p=0.4)."""
    rng = random.Random(35)
    phis = []
    for _ in range(200):
        kernel = [sum(rng.random() < 0.4 for _ in range(32)) for _ in range(6)]
        faultnet = [sum(rng.random() < 0.4 for _ in range(32)) for _ in range(6)]
        phis.append(dispersion(_downloads(kernel), _downloads(faultnet), "backed off"))
    assert 0.8 < statistics.mean(phis) < 1.2
    assert dispersion(_downloads([13] * 6), _downloads([13] * 6), "backed off") == 0.0
