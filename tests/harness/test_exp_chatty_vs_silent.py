"""chatty_vs_silent, run for real at a small time scale: the outbound-refreshes-idle bot
never detects while posting (target red, controls green), the fixed bot detects in both
roles, and the internal control goes red when the silent worker cannot detect either."""

from __future__ import annotations

from pathlib import Path

from harness import exp_chatty_vs_silent as exp
from harness.experiment import Result, render_result
from tests.harness.exputil import BOT, run_experiment

TARGET = "the CHATTY worker detected on its own keepalive"
INTERNAL = "the silent worker (the internal control) detected on its own keepalive"


async def run(tmp_path: Path, bot: list[str], *args: str) -> tuple[int, Result]:
    return await run_experiment(exp, tmp_path, bot, *args)


async def test_outbound_refreshes_idle_never_detects_while_posting(tmp_path: Path) -> None:
    code, res = await run(tmp_path, [*BOT, "--defect", "outbound-refreshes-idle"])
    assert code == 1, render_result(res)
    assert [c.name for c in res.failed_checks()] == [TARGET], render_result(res)
    # Not rescued either: the freeze held the server's FIN, so no reconnect at all.
    assert res.headline["chatty: reconnected t+ s"] is None
    assert res.headline["silent: own detection t+ s"] is not None


async def test_fixed_bot_detects_in_both_roles(tmp_path: Path) -> None:
    code, res = await run(tmp_path, BOT)
    assert code == 0, render_result(res)
    (ctl,) = res.controls
    window = res.headline["detection window (idle + PONG timeout) s"]
    # Synced idle clocks: both detect about one window after the freeze.
    assert abs(ctl.value - window) <= ctl.tolerance, render_result(res)
    assert abs(res.headline["chatty: own detection t+ s"] - window) <= ctl.tolerance


async def test_internal_control_goes_red_when_the_silent_worker_cannot_detect(
    tmp_path: Path,
) -> None:
    # A keepalive idle threshold far past the watch window: neither worker can detect,
    # so the run is not comparable, and the internal control must say so.
    bot = ["env", "BOT_KEEPALIVE_IDLE_S=1000", *BOT]
    code, res = await run(tmp_path, bot)
    assert code == 1
    assert not res.find(INTERNAL).passed, render_result(res)
    assert res.controls[0].value is None


def test_gap_and_rescue_scoring_go_red() -> None:
    posts = [{"at": 0.0}, {"at": 0.5}, {"at": 2.5}, {"at": 9.0}]
    assert exp.max_post_gap(posts, until=3.0) == 2.0
    assert exp.max_post_gap(posts[:1], until=3.0) is None  # one post proves no rhythm
    assert exp.rescued_without_detection({"a": 1.0, "b": None}, {"a": 1.1, "b": None}) == []
    # A reconnect before (or without) the bot's own PONG timeout: a close leaked through.
    assert exp.rescued_without_detection({"a": 2.0, "b": None}, {"a": 1.0, "b": 3.0}) == [
        "a",
        "b",
    ]
