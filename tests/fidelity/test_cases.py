"""The fidelity table covers the modes table: every TCP mode has a row or says why not."""

from __future__ import annotations

from faultnet.modes import MODES
from harness.fidelity._cases import CASES, LOSS_SHARES, NOT_HELD
from harness.fidelity._observe import SLACK_S


def test_every_tcp_mode_has_a_row_or_a_reason_for_none() -> None:
    held = {c.mode for c in CASES}
    missing = sorted(set(MODES) - held - set(NOT_HELD))
    assert not missing, f"modes with no fidelity row and no reason in NOT_HELD: {missing}"


def test_a_reason_names_a_mode_that_has_no_row() -> None:
    held = {c.mode for c in CASES}
    assert set(NOT_HELD) <= set(MODES), "NOT_HELD names no mode of faultnet.modes.MODES"
    assert not set(NOT_HELD) & held, "a mode has a row and a reason for none"
    assert all(reason.strip() for reason in NOT_HELD.values())


def test_each_row_calls_its_own_mode_and_undoes_it_with_the_mode_s_undo() -> None:
    for c in CASES:
        method, kwargs, undoing = c.faultnet
        assert method == c.mode, c.name
        assert MODES[c.mode].undone_by in (undoing, None), c.name
        MODES[c.mode].request(**kwargs)  # arguments the mode takes


def test_each_share_counted_by_time_is_slower_than_the_judge_s_slack() -> None:
    # Else the time the judge lets the proxy add could alone move a try across it.
    assert LOSS_SHARES
    for share, threshold in LOSS_SHARES.items():
        assert threshold > SLACK_S, share
