"""silent_loss, run for real at a small time scale: the no-confirm bot fails the target
check with its controls passing, the fixed bot passes everything, and each control goes
red when what it guards is broken."""

from __future__ import annotations

import sys
from pathlib import Path

from harness import exp_silent_loss as exp
from harness.experiment import Result, render_result
from tests.harness.exputil import BOT, run_experiment

TARGET = "no post claimed a delivery it did not achieve"


async def run(tmp_path: Path, bot: list[str], *args: str) -> tuple[int, Result]:
    return await run_experiment(exp, tmp_path, bot, *args)


def failed(res: Result) -> list[str]:
    return [c.name for c in res.failed_checks()]


async def test_no_confirm_defect_fails_the_target_with_controls_passing(tmp_path: Path) -> None:
    code, res = await run(tmp_path, [*BOT, "--defect", "no-confirm"])
    assert code == 1, render_result(res)
    assert failed(res) == [TARGET], render_result(res)
    assert res.error is None
    assert res.find("control A").role == "control"
    # The kept attempt carries its report.
    assert (Path(res.run_dir) / "report.html").is_file()


async def test_fixed_bot_passes_every_check(tmp_path: Path) -> None:
    code, res = await run(tmp_path, BOT)
    assert code == 0, render_result(res)
    assert res.passed and len(res.by_role("control")) == 4
    # Some posts really went into the dead link and came back UNCONFIRMED.
    posts = res.details["posts"]
    assert any(p["into_dead_link"] and not p["claimed"] for p in posts)


# A bot that reports failure for everything: the reference bot behind a stdio filter
# that rewrites every delivery claim into UNCONFIRMED (a deterministic stand-in for an
# over-eager fix; a tiny confirmation budget would race the server's PONG).
PESSIMIST = r"""
import json, signal, subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-m", "harness.bot"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
signal.signal(signal.SIGTERM, lambda *a: (child.terminate(), sys.exit(0)))
def pump_in():
    for line in sys.stdin.buffer:
        child.stdin.write(line)
        child.stdin.flush()
    child.stdin.close()
threading.Thread(target=pump_in, daemon=True).start()
for line in child.stdout:
    try:
        msg = json.loads(line)
    except ValueError:
        msg = None
    if isinstance(msg, dict) and isinstance(msg.get("result"), dict):
        for item in msg["result"].get("content") or []:
            if item.get("type") == "text" and item.get("text", "").startswith("Broadcast to"):
                item["text"] = "UNCONFIRMED: " + item["text"]
        line = (json.dumps(msg) + "\n").encode()
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
sys.exit(child.wait())
"""


async def test_control_b_catches_a_bot_that_reports_failure_for_everything(
    tmp_path: Path,
) -> None:
    # Every post says UNCONFIRMED, so the target passes vacuously: control A and
    # control B must be the checks that go red.
    script = tmp_path / "pessimist.py"
    script.write_text(PESSIMIST)
    code, res = await run(tmp_path, [sys.executable, str(script)], "--posts", "4")
    assert code == 1
    assert res.find(TARGET).passed, render_result(res)
    assert not res.find("control B").passed, render_result(res)
    assert not res.find("control A").passed


async def test_control_a_catches_an_observer_that_cannot_see_the_posts(tmp_path: Path) -> None:
    # The bot posts to a channel the observer is not in: "nothing arrived" must not be
    # scored at all. Control A goes red and the run stops (its sync line is never heard).
    bot = ["env", "ENCLAVE_CHANNEL=#elsewhere", *BOT, "--defect", "no-confirm"]
    code, res = await run(tmp_path, bot, "--posts", "2")
    assert code == 1
    assert not res.find("control A").passed, render_result(res)
    assert res.error and "sync line" in res.error


def test_scoring_counts_only_claimed_undelivered_posts_into_the_dead_link() -> None:
    rows = [
        {"at": 0.0, "text": "p1 a b", "claimed": True},
        {"at": 1.0, "text": "p2 a b", "claimed": False},
        {"at": 2.0, "text": "p3 a b", "claimed": True},
        {"at": 3.0, "text": "p4 a b", "claimed": True},
    ]
    score = exp.score_outage(rows, ["x p3 a b y", "p4 a b"], first_reconnect=102.5, freeze_mono=100)
    assert (score.silent, score.into_dead) == (1, 3)
    assert [r["silent_loss"] for r in rows] == [True, False, False, False]
    # Every post after the reconnect: "posts entered the dead link" has nothing to say.
    score = exp.score_outage(rows, [], first_reconnect=99.0, freeze_mono=100)
    assert score.into_dead == 0
