"""The UDP proxy's pure core, by tables: each impairment's effect, the order of the
steps, validation, and that a seed fixes every decision."""

from __future__ import annotations

import pytest

from faultnet.udp.impairments import Fate, Impairment, draw, fate

KEY = {"seed": 7, "stream": "upstream"}


def fates(imp: Impairment, n: int = 1000, payload: bytes = b"x" * 50) -> list[Fate]:
    return [fate(imp, payload, seq=i, **KEY) for i in range(n)]


@pytest.mark.parametrize(
    ("imp", "check"),
    [
        (Impairment(), lambda f: f == Fate(payload=b"x" * 50)),
        (Impairment(loss=100), lambda f: f.dropped == "loss"),
        (Impairment(duplicate=100), lambda f: f.copies == 2 and f.dropped is None),
        (Impairment(reorder=100), lambda f: f.reorder),
        (Impairment(latency_ms=40), lambda f: f.delay_s == 0.04),
        (Impairment(latency_ms=40, jitter_ms=10), lambda f: 0.03 <= f.delay_s <= 0.05),
        (Impairment(latency_ms=5, jitter_ms=10), lambda f: 0.0 <= f.delay_s <= 0.015),
        (Impairment(size_limit=20), lambda f: f.payload == b"x" * 20 and f.truncated),
        (Impairment(size_limit=50), lambda f: f.payload == b"x" * 50 and not f.truncated),
        (Impairment(size_limit=20, size_action="drop"), lambda f: f.dropped == "oversize"),
        (Impairment(size_limit=50, size_action="drop"), lambda f: f.dropped is None),
        # The size limit comes first: a dropped oversize datagram is not also "lost".
        (Impairment(size_limit=0, size_action="drop", loss=100), lambda f: f.dropped == "oversize"),
    ],
)
def test_each_impairment_does_what_it_says_to_every_datagram(imp, check) -> None:
    assert all(check(f) for f in fates(imp, 200))


def test_percentages_are_honoured_and_zero_never_fires() -> None:
    for percent in (1, 10, 50):
        lost = sum(f.dropped == "loss" for f in fates(Impairment(loss=percent), 20_000))
        assert abs(lost / 20_000 - percent / 100) < 0.01, percent
    assert not any(f.dropped or f.copies > 1 or f.reorder for f in fates(Impairment(latency_ms=1)))


def test_jitter_spans_its_whole_range() -> None:
    delays = [f.delay_s for f in fates(Impairment(latency_ms=50, jitter_ms=20), 2000)]
    assert min(delays) < 0.032 and max(delays) > 0.068


def test_a_seed_fixes_every_decision_and_another_seed_changes_them() -> None:
    imp = Impairment(loss=30, duplicate=20, reorder=10, latency_ms=10, jitter_ms=5)
    assert fates(imp) == fates(imp)
    other = [fate(imp, b"x" * 50, seed=8, stream="upstream", seq=i) for i in range(1000)]
    assert other != fates(imp)
    # The drop of datagram seq is predictable from draw() alone.
    predicted = [draw(7, "upstream", i, "loss") < 0.3 for i in range(1000)]
    assert predicted == [f.dropped == "loss" for f in fates(imp)]


def test_streams_and_decisions_draw_independently() -> None:
    a = [draw(1, "upstream", i, "loss") for i in range(100)]
    assert a != [draw(1, "downstream", i, "loss") for i in range(100)]
    assert a != [draw(1, "upstream", i, "duplicate") for i in range(100)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"loss": 101}, "percentage 0-100"),
        ({"duplicate": -1}, "percentage 0-100"),
        ({"latency_ms": -5}, "must not be negative"),
        ({"size_limit": -1}, "must not be negative"),
        ({"size_action": "squash"}, "truncate, drop"),
        ({"bogus": 1}, "unknown impairment attribute"),
        ({"size_limit": 10.5}, "whole number of bytes"),
        ({"loss": "5"}, "must be a number"),
    ],
)
def test_bad_values_are_refused_saying_why(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        Impairment().with_(**changes)
