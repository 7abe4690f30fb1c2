"""The pair runner: refuses identical arms, runs both arms on fresh environments with one
seed, prints them side by side with the internal control's drift, and exits 0 only when
arm b passed everything with the control steady."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from faultnet.eventlog import read_jsonl
from harness import pair
from harness.experiment import Check, Context, ControlValue, Result
from tests.harness.exputil import fake_experiment

PY = sys.executable


def test_identical_arms_are_refused_even_through_a_symlink(tmp_path: Path) -> None:
    argv = [PY, "-m", "harness.bot"]
    with pytest.raises(pair.PairRefused, match="same program and arguments"):
        pair.refuse_identical(argv, list(argv))
    link = tmp_path / "python-alias"
    link.symlink_to(os.path.realpath(PY))
    with pytest.raises(pair.PairRefused):
        pair.refuse_identical([str(link), "-m", "harness.bot"], argv)
    pair.refuse_identical(argv, [*argv, "--defect", "no-confirm"])  # differ: fine


async def test_identical_arms_exit_2_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = f"{PY} -m harness.bot"
    code = await pair.amain(
        ["silent_loss", "--a", cmd, "--b", cmd, "--run-dir", str(tmp_path / "r")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing the pair" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing ran


async def test_usage_errors_exit_2() -> None:
    a, b = f"{PY} -m harness.bot", f"{PY} -m harness.bot --defect no-confirm"
    assert await pair.amain(["--help"]) == 0
    assert await pair.amain(["no_such_experiment", "--a", a, "--b", b]) == 2
    assert await pair.amain(["silent_loss", "--a", "/nonexistent/bot", "--b", b]) == 2
    assert await pair.amain(["silent_loss", "--a", a, "--b", b, "--names", "x,x"]) == 2
    assert await pair.amain(["silent_loss", "--a", a, "--b", b, "--", "--state", "/tmp"]) == 2
    assert await pair.amain(["silent_loss", "--a", a, "--b", b, "--", "--posts", "0"]) == 2


def _result(arm: str, target: bool, control_ok: bool, value: float | None) -> Result:
    r = Result(experiment="x", arm=arm)
    r.checks = [Check("ctl", control_ok, role="control"), Check("tgt", target, role="target")]
    r.controls = [ControlValue("detect", value, "s", 0.5)]
    return r


def test_judge_reports_drift_and_which_arm_failed_which_check() -> None:
    p = pair.judge(_result("pre", False, True, 1.0), _result("post", True, True, 1.2))
    assert p.steady and p.b_passed and p.exit_code == 0
    assert "the pre arm failed: tgt" in p.summary and "internal control steady" in p.summary
    moved = pair.judge(_result("pre", False, True, 1.0), _result("post", True, True, 2.0))
    assert not moved.steady and moved.exit_code == 1
    assert "internal control MOVED: detect" in moved.summary
    assert moved.drifts[0].drift == pytest.approx(1.0)
    bad_b = pair.judge(_result("pre", True, True, 1.0), _result("post", False, True, 1.0))
    assert bad_b.exit_code == 1 and "the post arm failed: tgt" in bad_b.summary
    # A control failing in arm a makes the pair incomparable even if b passed.
    bad_ctl = pair.judge(_result("pre", False, False, 1.0), _result("post", True, True, 1.0))
    assert bad_ctl.exit_code == 1 and "a control failed: pre: ctl" in bad_ctl.summary
    text = pair.render_pair(moved)
    assert "pre" in text and "post" in text and "MOVED" in text


def _fake_experiment() -> types.ModuleType:
    """No bot: the arm's argv decides the outcome (--defect fails the target, --drift
    moves the internal control), so the runner's plumbing can be seen end to end."""

    async def run(ctx: Context) -> None:
        argv = ctx.bot_argv
        server = [ctx.env.pid, ctx.env.start_time]  # the environment's server, exactly
        ctx.result.headline.update(seed=ctx.seed, extra=ctx.args.extra, server=server)
        ctx.result.check("a control", True, role="control")
        ctx.result.check("the target", "--defect" not in argv, role="target")
        ctx.result.control("detect", 5.0 if "--drift" in argv else 1.0, "s", 0.5)

    return fake_experiment(run, extra="unset")


async def test_pair_runs_both_arms_fresh_with_one_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pair, "load_experiment", lambda name: _fake_experiment())
    a, b = f"{PY} -c pass --defect", f"{PY} -c pass"
    out = tmp_path / "out.json"
    code = await pair.amain(
        ["fake", "--a", a, "--b", b, "--names", "pre,post", "--time-scale", "0.05"]
        + ["--repeat", "2", "--seed", "5", "--run-dir", str(tmp_path / "r"), "--out", str(out)]
        + ["--", "--extra", "passed-through"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "fake: pre vs post" in printed and "steady" in printed
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 0 and len(doc["attempts"]) == 2
    for att, seed in zip(doc["attempts"], (5, 6), strict=True):
        ha, hb = att["a"]["headline"], att["b"]["headline"]
        assert ha["seed"] == hb["seed"] == seed  # the same workload in both arms
        # Each arm on its own fresh environment: another server process (the port may
        # come round again: once both arms' servers drew the same one).
        assert ha["server"] != hb["server"]
        assert ha["extra"] == "passed-through"
    recs = read_jsonl(tmp_path / "r" / "report.jsonl").records
    assert [(r["event"], r["seed"]) for r in recs] == [
        ("attempt_start", 5),
        ("attempt_end", 5),
        ("attempt_start", 6),
        ("attempt_end", 6),
    ]


async def test_pair_fails_when_b_fails_or_the_control_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pair, "load_experiment", lambda name: _fake_experiment())
    base = ["fake", "--time-scale", "0.05", "--names", "pre,post"]
    code = await pair.amain(
        [*base, "--a", f"{PY} -c pass", "--b", f"{PY} -c pass --defect"]
        + ["--run-dir", str(tmp_path / "r1")]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "the post arm failed: the target" in out
    assert "evidence kept in" in out and (tmp_path / "r1").is_dir()
    code = await pair.amain(
        [*base, "--a", f"{PY} -c pass --defect", "--b", f"{PY} -c pass --drift"]
        + ["--run-dir", str(tmp_path / "r2")]
    )
    assert code == 1
    assert "internal control MOVED: detect" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--run-dir", "--report", "--out"])
async def test_an_unwritable_output_fails_before_the_pair_runs(
    tmp_path: Path,
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(pair, "load_experiment", lambda name: _fake_experiment())
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "x"
    argv = ["fake", "--a", f"{PY} -c pass --defect", "--b", f"{PY} -c pass"]
    argv += ["--run-dir", str(tmp_path / "runs"), flag, str(bad)]
    assert await pair.amain(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {bad}" in err, err
    assert not list((tmp_path / "runs").glob("attempt-*")), "the pair ran before the check"
