"""confirm_latency, run for real at a small time scale over a link with 40 ms of
server-to-worker latency: a bot whose budget is below that latency fails the target check
with its controls passing, the fixed bot passes everything, and the observer control goes
red when the observer cannot see the posts."""

from __future__ import annotations

from pathlib import Path

from harness import exp_confirm_latency as exp
from harness.experiment import Result, render_result
from tests.harness.exputil import BOT, run_experiment

LATENCY = "40"
TARGET = "every healthy post CONFIRMED within the budget"


async def run(tmp_path: Path, bot: list[str], *args: str) -> tuple[int, Result]:
    return await run_experiment(exp, tmp_path, bot, *args)


async def test_budget_below_the_link_latency_fails_the_target(tmp_path: Path) -> None:
    # 20 ms of budget on a link whose PONG takes 40 ms: every post is UNCONFIRMED.
    bot = ["env", "BOT_CONFIRM_BUDGET_S=0.02", *BOT]
    code, res = await run(tmp_path, bot, "10", "--link-latency-ms", LATENCY)
    assert code == 1, render_result(res)
    assert not res.find(TARGET).passed, render_result(res)
    assert all(c.passed for c in res.by_role("control")), render_result(res)
    assert res.headline["confirmation budget s"] == 0.02  # read back from the bot


async def test_fixed_bot_confirms_every_post_and_the_clocks_agree(tmp_path: Path) -> None:
    code, res = await run(tmp_path, BOT, "10", "--link-latency-ms", LATENCY)
    assert code == 0, render_result(res)
    # The toxic is in force: no confirmation can beat the link's latency.
    assert res.headline["bot log (confirmed) p50 ms"] >= 40, render_result(res)
    assert res.headline["tool-call wall p50 ms"] >= res.headline["bot log (confirmed) p50 ms"]


async def test_a_stalled_event_loop_fails_the_loop_check_only(tmp_path: Path) -> None:
    # The bot blocks its loop for 60% of the budget after each post: confirmations still
    # come within the budget (target passes) but never within half of it.
    code, res = await run(tmp_path, [*BOT, "--defect", "stall-loop-on-confirm"], "5")
    assert code == 1, render_result(res)
    assert [c.name for c in res.failed_checks()] == [
        "the event loop runs during the confirmation wait"
    ], render_result(res)


async def test_observer_control_goes_red_when_it_cannot_see_the_posts(tmp_path: Path) -> None:
    bot = ["env", "ENCLAVE_CHANNEL=#elsewhere", *BOT]
    code, res = await run(tmp_path, bot, "3")
    assert code == 1
    assert not res.find("the observer received every post").passed, render_result(res)
    assert res.find(TARGET).passed  # confirmation does not depend on who is listening


def test_clock_agreement_goes_red() -> None:
    assert exp.clocks_agree([5.0, 6.0], [2.0, 3.0])[0]
    # A bot that logs more than the call took is not measuring its own posts.
    ok, inside, _ = exp.clocks_agree([5.0, 6.0], [9.0, 3.0])
    assert not ok and not inside
    # A call far slower than the bot's figure: the log is not the call's own clock.
    assert not exp.clocks_agree([500.0, 600.0], [2.0, 3.0])[0]
    assert not exp.clocks_agree([5.0], [2.0, 3.0])[0]  # a post missing from the log
    assert not exp.clocks_agree([], [])[0]
