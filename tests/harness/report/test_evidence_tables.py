"""The report's pure parts, by tables: fault intervals from a proxy log, a post's outcome,
and the replay command."""

from __future__ import annotations

import shlex
import sys

import pytest

from harness.report import replay_command
from harness.report._evidence import score_post
from harness.report._faults import fault_intervals


def rec(mono: float, event: str, **fields) -> dict:
    return {"mono": mono, "event": event, **fields}


def test_fault_intervals_from_a_proxy_log() -> None:
    log = [
        rec(10, "fault_applied", mode="freeze", stream="both", connections=[1]),
        rec(11, "fault_applied", mode="blackhole", stream="upstream", connections=[2]),
        rec(12, "fault_removed", mode="thaw", stream="both", connections=[3]),  # others only
        rec(13, "fault_applied", mode="drop_syn"),
        rec(14, "fault_applied", mode="severed", connections=[1]),
        rec(15, "toxic_added", toxic="lat", type="latency", stream="downstream"),
        rec(16, "fault_removed", mode="thaw", stream="both", connections=[1, 2]),
        rec(17, "fault_removed", mode="restore"),
        rec(18, "toxic_removed", toxic="lat"),
        rec(19, "fault_applied", mode="refuse"),
        rec(20, "fault_applied", mode="freeze", stream="both", connections=[4]),
        rec(21, "fault_applied", mode="reset", connections=[4, 5]),  # closes what it froze
    ]
    got = [(f.mode, f.start, f.end, f.removed_by) for f in fault_intervals(log, "p", 10)]
    assert got == [
        ("freeze", 0, 4, "severed"),  # its connection severed: gone with it
        ("blackhole", 1, 6, "thaw"),
        ("drop_syn", 3, 7, "restore"),
        ("severed", 4, 4, None),  # an instant
        ("latency toxic", 5, 8, "toxic_removed"),
        ("refuse", 9, None, None),  # never removed
        ("freeze", 10, 11, "reset"),
        ("reset", 11, 11, None),
    ]


@pytest.mark.parametrize(
    "claimed,received_t,observed,fault_end,outcome",
    [
        (True, 1.0, True, None, "delivered"),
        (True, None, True, None, "silent_loss"),
        (True, None, True, 5.0, "silent_loss"),
        (True, 6.0, True, 5.0, "late"),
        (True, 4.0, True, 5.0, "delivered"),
        (False, None, True, 5.0, "unconfirmed"),
        (False, 1.0, True, None, "unconfirmed_received"),
        (None, 1.0, True, None, "unknown"),
        (True, None, False, None, "unknown"),  # no transcript: no loss can be claimed
    ],
)
def test_a_posts_outcome(claimed, received_t, observed, fault_end, outcome) -> None:
    assert score_post(claimed, received_t, observed, fault_end) == outcome


def test_the_replay_command_keeps_what_the_run_did_and_pins_the_seed() -> None:
    argv = [
        "--bot-bin", "python -m harness.bot", "--env", "auto", "--time-scale", "0.05",
        "--repeat", "3", "--seed", "5", "--run-dir", "/tmp/x", "--keep", "--json",
        "--out=/tmp/o.json", "--posts", "4",
    ]  # fmt: skip
    got = shlex.split(replay_command("harness.exp_silent_loss", argv, 7))
    assert got == [
        sys.executable, "-m", "harness.exp_silent_loss",
        "--bot-bin", "python -m harness.bot", "--env", "auto", "--time-scale", "0.05",
        "--posts", "4", "--seed", "7",
    ]  # fmt: skip
    # A pair's experiment arguments after -- are the experiment's, kept as they are.
    got = shlex.split(
        replay_command("harness.pair", ["silent_loss", "--seed", "1", "--", "--posts", "2"], 9)
    )
    assert got[3:] == ["silent_loss", "--seed", "9", "--", "--posts", "2"]
