"""What an experiment command leaves in $TMPDIR: a passing attempt's directory is removed
and the run says so (its first line printed that path); a run that cannot start (its
environment missing, a mistyped defect of the reference bot) leaves nothing at all."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
import trio

from harness import env, pair, runner
from harness.bot import DEFECTS
from harness.experiment import Context
from tests.harness.exputil import fake_experiment


async def _passes(ctx: Context) -> None:
    ctx.result.check("a control", True, role="control")
    ctx.result.check("the target", True, role="target")


def _empty(d: Path) -> bool:
    return not any(d.iterdir())


@pytest.fixture
def tmpdir_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TMPDIR for run directories made with no --run-dir: an empty directory of the test's."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


async def test_a_passing_attempt_says_its_directory_is_removed(
    tmp_path: Path, tmpdir_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    st = await trio.to_thread.run_sync(env.up, tmp_path / "env")
    try:
        argv = ["--bot-bin", sys.executable, "--state", str(st.state_dir)]
        assert await runner.amain(fake_experiment(_passes, extra="x"), argv) == 0
    finally:
        await trio.to_thread.run_sync(env.down, st.state_dir)
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("== fake:"))
    attempt_dir = first.rsplit("run dir ", 1)[1]
    assert f"its run directory {attempt_dir} is removed (--keep keeps it)" in out, out
    assert _empty(tmpdir_here)


async def test_a_missing_environment_is_refused_before_any_run_directory(
    tmp_path: Path, tmpdir_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--bot-bin", sys.executable, "--state", str(tmp_path / "no-env")]
    assert await runner.amain(fake_experiment(_passes, extra="x"), argv) == 2
    out, err = capsys.readouterr()
    assert "no usable environment" in err and len(err.strip().splitlines()) == 1, err
    assert "run dir" not in out and _empty(tmpdir_here)


async def test_a_mistyped_defect_is_refused_before_either_arm_runs(
    tmpdir_here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It ran arm a until the bot's MCP handshake failed (16.9 s, measured), then arm b,
    # and exited 2 leaving the pair's directory and a report.
    bot = f"{sys.executable} -m harness.bot"
    code = await pair.amain(["silent_loss", "--a", f"{bot} --defect no-confirmm", "--b", bot])
    assert code == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        "harness.pair: error: --a: the reference bot has no defect 'no-confirmm' "
        f"(one of {', '.join(DEFECTS)})"
    ], err
    assert out == "" and _empty(tmpdir_here)
    # The same for one experiment's BOT_BIN, in both spellings, and for enclave-bot.
    exp = pair.load_experiment("silent_loss")
    installed = Path(sys.executable).with_name("enclave-bot")  # the console script
    for bad in (f"{bot} --defect=nope", f"{bot} --defect", f"{installed} --defect nope"):
        assert await runner.amain(exp, ["--bot-bin", bad, "--env", "auto"]) == 2
        assert "the reference bot has no defect" in capsys.readouterr().err
    assert _empty(tmpdir_here)
