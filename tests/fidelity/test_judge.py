"""The fidelity verdict, as a table: what counts as the same failure."""

from __future__ import annotations

import errno

import pytest

from harness.fidelity import Observation, judge
from harness.fidelity._observe import CHECKS, classify, rank_sum_z, share_bound

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
    assert names[0] == "the same outcome" and len(names) == 5
    assert any("share" in n for n in names) and any("segments" in n for n in names)
    assert names[-1].endswith("rank-sum test")


def test_a_row_of_many_tries_reads_as_its_shares() -> None:
    text = _connects(61, 18).text()
    assert text == (
        "connected or timed out; of 128 connects: 61 retried (48%), 18 failed (14%);"
        " a retry got in at 1.02 s"
    )
    assert "a retry got in at: none" in _connects(0, 0, at=None).text()


@pytest.mark.parametrize(
    ("xs", "ys", "z"),
    [
        # One sample: the rank sum is what it would be by chance.
        ([0.1, 0.5, 0.2] * 10, [0.1, 0.5, 0.2] * 10, 0.0),
        # All tied (every try unfinished, timed at what it was given): nothing to tell.
        ([3.0] * 20, [3.0] * 25, 0.0),
        # Wholly apart, 20 a side: ranks 21-40 against 11 x 41 = 410 expected, sd
        # sqrt(20 x 20 x 41 / 12) = 36.97: (610 - 410) / 36.97.
        ([1.0 + i for i in range(20)], [i / 100 for i in range(20)], 5.410),
        ([i / 100 for i in range(20)], [1.0 + i for i in range(20)], -5.410),
    ],
)
def test_the_rank_sum_statistic_is_wilcoxon_s_as_a_z_score(
    xs: list[float], ys: list[float], z: float
) -> None:
    assert rank_sum_z(xs, ys) == pytest.approx(z, abs=0.001)


def _downloads(times: list[float]) -> Observation:
    return Observation("intact", sorted(times)[len(times) // 2], times=tuple(times))


#: A heavy-tailed sample like the kernel's 20 % two-way loss (144 downloads): most wait
#: out one timeout (0.2 s) or none, some two or a doubled one, a few give up at 3 s.
HEAVY = ([0.01] * 12 + [0.21] * 10 + [0.42] * 6 + [0.63] * 4 + [1.5] * 2 + [3.0] * 2) * 4


@pytest.mark.parametrize(
    ("faultnet", "same", "says"),
    [
        (_downloads(list(reversed(HEAVY))), True, "same"),
        # The same medians within 1.25x + 0.3 s, every download 80 ms slower: the rank-sum
        # test sees the whole distribution move.
        (_downloads([t + 0.08 for t in HEAVY]), False, "different times (slower"),
        # Half the timeouts (a leg losing one way only): faster.
        (_downloads([0.01] * 96 + [0.21] * 32 + [0.42] * 16), False, "different times (faster"),
        # Fewer than 20 a side: the median alone is judged.
        (_downloads([t + 0.08 for t in HEAVY[::8]]), True, "same"),
    ],
)
def test_many_timed_tries_are_judged_by_the_rank_sum_test(
    faultnet: Observation, same: bool, says: str
) -> None:
    verdict = judge(_downloads(HEAVY), faultnet)
    assert verdict.same is same, verdict.text
    assert verdict.text.startswith(says), verdict.text
