"""The runner: experiments as commands. BOT_BIN, usage errors, the repeat loop with
logged seeds, kept run directories, exit codes. Real processes where a process is the
point (the missing-BOT_BIN exit code, a real environment for the repeat loop)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.procs import ProcessIdentity
from harness import env, runner
from harness.experiment import Context
from tests import REPO
from tests.conftest import interrupt_module
from tests.harness.exputil import fake_experiment

EXPERIMENTS = ("confirm_latency", "silent_loss", "chatty_vs_silent", "fd_flatness")


# ----------------------------------------------------------------- BOT_BIN and usage


def run_silent_loss(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m harness.exp_silent_loss ARGV`` in a real interpreter, with *env*."""
    return subprocess.run(
        [sys.executable, "-m", "harness.exp_silent_loss", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_missing_bot_bin_exits_2_as_a_real_command(tmp_path: Path) -> None:
    # One experiment as a real command (an interpreter start is the point); the
    # others run in-process below.
    environ = {k: v for k, v in os.environ.items() if k not in ("BOT_BIN", "APIARY_BIN")}
    proc = run_silent_loss(["--env", "auto"], environ)
    assert proc.returncode == 2, proc.stderr
    assert "BOT_BIN is required" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


async def test_every_experiment_usage_errors_exit_2_without_a_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    monkeypatch.delenv("BOT_BIN", raising=False)
    monkeypatch.delenv("APIARY_BIN", raising=False)
    for name in EXPERIMENTS:
        mod = importlib.import_module(f"harness.exp_{name}")
        assert await mod.amain(["--help"]) == 0
        assert await mod.amain(["--env", "auto"]) == 2  # no BOT_BIN
        bot = f"{sys.executable} -m harness.bot"
        assert await mod.amain(["--bot-bin", bot, "--time-scale", "zero"]) == 2
        assert await mod.amain(["--bot-bin", bot, "--repeat", "0", "--env", "auto"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [["--bogus"], ["--repeat", "x"], ["--env", "manual"], ["--seed"]],
    ids=["unknown flag", "bad int", "bad choice", "missing value"],
)
def test_an_experiment_usage_error_is_one_line_and_leaves_no_run_directory(
    tmp_path: Path, argv: list[str]
) -> None:
    """Issue 24 item 6: argparse's mistakes were its usage dump (8 lines); now one line,
    exit 2, and nothing made under $TMPDIR."""
    environ = {**os.environ, "TMPDIR": str(tmp_path), "BOT_BIN": f"{sys.executable} -m harness.bot"}
    proc = run_silent_loss(argv, environ)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("python -m harness.exp_silent_loss: error: ")
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- the repeat loop


def _fake_experiment(fail_odd: bool = True) -> types.ModuleType:
    """An experiment with no bot: fails on odd seeds, so repeat/seed/keep can be seen."""

    async def run(ctx: Context) -> None:
        ctx.say(f"seed {ctx.seed} env port {ctx.env.port}")
        bad = fail_odd and ctx.seed % 2 == 1
        ctx.result.check("a control", True, role="control")
        ctx.result.check("the target", not bad, f"seed {ctx.seed}", role="target")
        ctx.result.control("steady thing", 1.0)

    return fake_experiment(run, extra="x")


def _listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture
async def state_dir(tmp_path: Path):
    st = await trio.to_thread.run_sync(env.up, tmp_path / "env")
    try:
        yield st.state_dir
    finally:
        await trio.to_thread.run_sync(env.down, st.state_dir)


async def test_repeat_logs_each_seed_first_and_keeps_only_failing_runs(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _fake_experiment()
    runs, out = tmp_path / "runs", tmp_path / "out.json"
    argv = ["--bot-bin", sys.executable, "--state", str(state_dir), "--run-dir", str(runs)]
    code = await runner.amain(exp, [*argv, "--repeat", "3", "--seed", "10", "--out", str(out)])
    assert code == 1
    recs = read_jsonl(runs / "report.jsonl").records
    assert [(r["event"], r["seed"]) for r in recs] == [
        ("attempt_start", 10),
        ("attempt_end", 10),
        ("attempt_start", 11),
        ("attempt_end", 11),
        ("attempt_start", 12),
        ("attempt_end", 12),
    ]
    ends = [r for r in recs if r["event"] == "attempt_end"]
    assert [e["passed"] for e in ends] == [True, False, True]
    kept = Path(ends[1]["run_dir"])
    assert _listing(kept) >= {"result.json", "progress.log", "events.jsonl"}
    assert ends[0]["run_dir"] is None and ends[2]["run_dir"] is None
    assert {p for p in _listing(runs) if p.startswith("attempt-")} == {kept.name}
    stdout = capsys.readouterr().out
    assert f"evidence kept in {kept}" in stdout
    assert "fake: 2/3 attempts passed" in stdout
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 1 and [a["seed"] for a in doc["attempts"]] == [10, 11, 12]

    # Replaying the failing seed fails the same way; a passing seed passes.
    assert await runner.amain(exp, [*argv, "--seed", "11"]) == 1
    assert await runner.amain(exp, [*argv, "--seed", "12"]) == 0


async def test_environment_problems_exit_2(tmp_path: Path, state_dir: Path) -> None:
    exp = _fake_experiment(fail_odd=False)
    base = ["--bot-bin", sys.executable, "--run-dir", str(tmp_path / "runs")]
    assert await runner.amain(exp, [*base, "--state", str(tmp_path / "nowhere")]) == 2
    os.environ.pop("ENCLAVE_STATE_DIR", None)
    assert await runner.amain(exp, base) == 2  # neither --state nor --env auto
    assert await runner.amain(exp, [*base, "--state", str(state_dir)]) == 0
    # A dead server is an environment problem, not a finding.
    await trio.to_thread.run_sync(env.down, state_dir)
    assert await runner.amain(exp, [*base, "--state", str(state_dir)]) == 2


def test_sigterm_mid_run_cleans_up_by_pid(tmp_path: Path) -> None:
    """A SIGTERM (a CI job's timeout) must not leave the private server or the bot behind:
    the run is cancelled, its finally blocks stop both by PID, exit 128 + the signal."""
    runs = tmp_path / "runs"
    environ = dict(os.environ, BOT_BIN=f"{sys.executable} -m harness.bot")
    # SIGTERM, and at once a second signal: the kernel may hand over either first; the
    # other then lands while the run unwinds, and must change nothing (was: re-raised
    # after the cleanup, a SIGTERM killed the process, exit -15).
    code, rest, _ = interrupt_module(
        "harness.exp_silent_loss",
        *["--env", "auto", "--time-scale", "0.05", "--run-dir", str(runs)],
        when="CONTROL A",
        signals=[signal.SIGTERM, signal.SIGINT],
        merge_stderr=True,
        env=environ,
        cwd=REPO,
    )
    first = {128 + 15: "SIGTERM", 128 + 2: "SIGINT"}.get(code)
    assert first is not None, rest
    assert f"interrupted by {first}" in rest and "Traceback" not in rest
    (attempt,) = [p for p in runs.iterdir() if p.is_dir()]
    st = env.read_state(attempt / "env")
    assert not st.identity.is_alive(), "the private enclave server survived"
    started = [
        r for r in read_jsonl(attempt / "events.jsonl").records if r["event"] == "bot_started"
    ]
    for rec in started:
        assert not ProcessIdentity.from_json(rec["identity"]).is_alive(), "a bot survived"
    assert started


@pytest.mark.parametrize("flag", ["--run-dir", "--report", "--out"])
async def test_an_unwritable_output_fails_before_the_run(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before any attempt runs, in one line, exit 2 (was: --out failed with a
    traceback after a run that had passed)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    runs = tmp_path / "runs"
    bad = {"--run-dir": blocker / "runs", "--report": blocker / "r.jsonl", "--out": blocker / "o"}
    argv = ["--bot-bin", sys.executable, "--env", "auto", "--run-dir", str(runs)]
    code = await runner.amain(_fake_experiment(), [*argv, flag, str(bad[flag])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{flag} {bad[flag]}" in err, err
    assert not (runs / "report.jsonl").exists() or flag != "--run-dir"
    assert not any(runs.glob("attempt-*")), "an attempt ran before the check"


async def test_a_passing_run_leaves_no_temporary_directory(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --run-dir a run makes its own directory under $TMPDIR: gone after a pass
    (was: left behind with its report), kept after a failure or with --keep."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    argv = ["--bot-bin", sys.executable, "--state", str(state_dir), "--out", str(tmp_path / "o")]
    assert await runner.amain(_fake_experiment(fail_odd=False), argv) == 0
    assert list(tmp.iterdir()) == []
    assert json.loads((tmp_path / "o").read_text())["report"] is None
    assert await runner.amain(_fake_experiment(fail_odd=False), [*argv, "--keep"]) == 0
    assert len(list(tmp.iterdir())) == 1


async def test_a_bots_start_extends_the_attempts_bound(tmp_path: Path, state_dir: Path) -> None:
    """The attempt's backstop bounds scenario time, scaled; a bot's start is the
    machine's (three fleet runs side by side under stress-ng: four bots one after
    another took 80 s and ran the backstop out). Each start moves the deadline on by
    what it took: here a BOT_BIN that sleeps 1.5 s before it starts."""
    moved: list[float] = []

    async def run(ctx: Context) -> None:
        assert ctx.backstop is not None
        before = ctx.backstop.deadline
        async with ctx.bot("nick", "token", "w01", via=None):
            moved.append(ctx.backstop.deadline - before)
        ctx.result.check("a control", True, role="control")

    slow_bot = f"sh -c 'sleep 1.5; exec {sys.executable} -m harness.bot'"
    argv = ["--bot-bin", slow_bot, "--state", str(state_dir), "--run-dir", str(tmp_path / "r")]
    assert await runner.amain(fake_experiment(run, extra="x"), argv) == 0
    assert len(moved) == 1 and moved[0] >= 1.5, moved
