"""fd_flatness, run for real at a small time scale: the leak-fd-on-reconnect bot fails
the target check with its controls passing (as a real `python -m` command, exit 1), the
fixed bot passes everything, and the controls go red when the paths are not exercised."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from harness import exp_fd_flatness as exp
from harness.experiment import Result, render_result
from tests.harness.exputil import BOT, SCALE, run_experiment, run_json_command

TARGET = "fd count flat across detection and reconnects"


async def run(tmp_path: Path, bot: list[str], *args: str) -> tuple[int, Result]:
    return await run_experiment(exp, tmp_path, bot, *args)


def test_leaking_bot_fails_the_target_as_a_real_command(tmp_path: Path) -> None:
    environ = dict(os.environ, BOT_BIN=shlex.join([*BOT, "--defect", "leak-fd-on-reconnect"]))
    environ.pop("APIARY_BIN", None)
    proc, doc = run_json_command(
        ["-m", "harness.exp_fd_flatness", "--env", "auto", "--json"]
        + ["--time-scale", SCALE, "--run-dir", str(tmp_path / "runs")],
        code=1,
        timeout=100,
        env=environ,
    )
    res = Result.from_json(doc["attempts"][0])
    assert [c.name for c in res.failed_checks()] == [TARGET], render_result(res)
    counts = res.details["fd_counts"]
    assert counts["cycles"] - counts["connect"] == 3  # one per reconnect
    # Progress went to stderr (--json), with the failing attempt's kept evidence.
    assert "evidence kept in" in proc.stderr and res.run_dir
    kept = {p.name for p in Path(res.run_dir).iterdir()}
    assert kept >= {"worker.stderr", "proxy.jsonl", "calls", "result.json", "events.jsonl"}
    assert list((Path(res.run_dir) / "calls" / "worker").glob("*.jsonl"))


async def test_fixed_bot_stays_flat(tmp_path: Path) -> None:
    code, res = await run(tmp_path, BOT)
    assert code == 0, render_result(res)
    counts = res.details["fd_counts"]
    assert counts["cycles"] == counts["connect"], counts


async def test_controls_go_red_when_the_paths_are_not_exercised(tmp_path: Path) -> None:
    # No confirmation wait at all (no-confirm) and no detection (an idle threshold past
    # the run): a flat count here would prove nothing, and the controls must say so.
    bot = ["env", "BOT_KEEPALIVE_IDLE_S=1000", *BOT, "--defect", "no-confirm"]
    code, res = await run(tmp_path, bot, "--posts", "5")
    assert code == 1
    assert not res.find("the confirmation path was exercised").passed, render_result(res)
    assert not res.find("the reconnect path was exercised").passed, render_result(res)
    assert not res.find(TARGET).passed  # not measured is never flat


def test_flatness_scoring() -> None:
    counts = {"connect": 11, "posts": 12, "outage": 13, "cycles": None}
    assert exp.is_flat(counts, "posts")
    assert not exp.is_flat(counts, "outage")
    assert not exp.is_flat(counts, "cycles")
    assert exp.stage_delta(counts, "outage") == 2
    assert not exp.is_flat({"connect": None, "posts": 11}, "posts")
