"""The experiment API's pure parts: the time scale, the contract reader, the helpers,
results and their drift, the freeze control."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import trio

from faultnet import open_proxy
from faultnet.errors import EnvironmentProblem
from faultnet.testing import echo_server
from harness.experiment import (
    REAL,
    Check,
    ControlValue,
    FreezeRecord,
    Result,
    TimeScale,
    attempt_seeds,
    claims_delivery,
    control_drift,
    freeze_held,
    freeze_links,
    parse_botevents,
    pct,
    render_result,
    resolve_bot_argv,
    time_scale_from,
)
from tests import REPO

# ----------------------------------------------------------------- time scale


def test_real_time_hands_the_bot_the_contract_defaults() -> None:
    got = TimeScale(1.0).bot_env()
    assert got == {
        "BOT_KEEPALIVE_IDLE_S": "60",
        "BOT_PONG_TIMEOUT_S": "30",
        "BOT_CONFIRM_BUDGET_S": "3",
        "BOT_RECONNECT_BASE_S": "1",
        "BOT_RECONNECT_MAX_S": "16",
    }
    ts = TimeScale(1.0)
    assert (ts.real("chat_interval"), ts.real("outage_post_interval")) == (20, 10)
    assert ts.real("late_delivery_wait") == 30


def test_scale_shrinks_scenario_and_bot_timings_together_with_floors() -> None:
    ts = TimeScale(0.02)
    assert ts.real("keepalive_idle") == pytest.approx(1.2)
    assert ts.real("pong_timeout") == pytest.approx(0.6)
    assert ts.real("chat_interval") == pytest.approx(0.4)
    # The ratio the chatty experiment depends on holds at every scale.
    assert ts.real("chat_interval") < ts.real("keepalive_idle")
    # Floored: 60 ms of budget would measure the machine, not the bot.
    assert ts.real("confirm_budget") == 0.25
    assert ts.real("confirm_budget") < ts.real("pong_timeout")
    assert ts.bound(30, floor=10) == 10
    assert TimeScale(1.0).bound(30, floor=10) == 30
    assert ts.detection_window == pytest.approx(1.8)


def test_time_scale_from_flag_env_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_TIME_SCALE", raising=False)
    assert time_scale_from(None).factor == 1.0
    monkeypatch.setenv("HARNESS_TIME_SCALE", "0.05")
    assert time_scale_from(None).factor == 0.05
    assert time_scale_from("0.1").factor == 0.1  # the flag wins
    for bad in ("fast", "0", "-1", "nan", "100"):
        with pytest.raises(ValueError):
            time_scale_from(bad)
    assert set(REAL) >= {"keepalive_idle", "pong_timeout", "confirm_budget"}


# ----------------------------------------------------------------- helpers


def test_claims_delivery_never_counts_unconfirmed() -> None:
    assert claims_delivery("Broadcast to #enclave (1 line); confirmed by the server in 2 ms")
    assert not claims_delivery("Broadcast to #enclave (1 line) UNCONFIRMED")
    assert not claims_delivery("UNCONFIRMED: 1 line written toward #enclave")
    assert not claims_delivery("<NO ANSWER>")
    assert not claims_delivery("")


def test_parse_botevents_and_pct() -> None:
    text = (
        "starting\n"
        'BOTEVENT {"event":"connected","mono":1.5}\n'
        "BOTEVENT {not json}\n"
        'BOTEVENT {"event":"pong_timeout","mono":3.0}\n'
    )
    evs = parse_botevents(text)
    assert [e["event"] for e in evs] == ["connected", "pong_timeout"]
    assert pct([], 50) is None
    assert pct([3.0, 1.0, 2.0], 50) == 2.0
    assert pct(list(range(101)), 95) == 95


def test_bot_bin_is_required_and_aliased() -> None:
    with pytest.raises(EnvironmentProblem, match="BOT_BIN is required"):
        resolve_bot_argv(None, {})
    with pytest.raises(EnvironmentProblem, match="BOT_BIN is required"):
        resolve_bot_argv(None, {"BOT_BIN": "  "})
    assert resolve_bot_argv(None, {"APIARY_BIN": "python3 -m harness.bot"})[1:] == [
        "-m",
        "harness.bot",
    ]
    assert resolve_bot_argv("python3 -x", {"BOT_BIN": "python3 -y"})[-1] == "-x"
    with pytest.raises(EnvironmentProblem, match="not found"):
        resolve_bot_argv("/nonexistent/bot --x", {})
    with pytest.raises(EnvironmentProblem, match="cannot parse"):
        resolve_bot_argv("python3 'unterminated", {})


def test_attempt_seeds_replay_and_random() -> None:
    assert attempt_seeds(3, 7) == [7, 8, 9]
    fresh = attempt_seeds(3, None)
    assert len(set(fresh)) == 3


# ----------------------------------------------------------------- results


def _result(arm: str, target_ok: bool, control: float | None, tol: float = 0.5) -> Result:
    r = Result(experiment="demo", arm=arm)
    r.checks = [
        Check("the control", True, role="control"),
        Check("the target", target_ok, "detail", role="target"),
    ]
    r.headline = {"number": 3.14159, "text": "x"}
    r.controls = [ControlValue("ctl", control, "s", tol)]
    return r


def test_result_render_roundtrip_and_exit_codes() -> None:
    r = _result("a", False, 1.0)
    text = render_result(r)
    assert "[PASS] CONTROL: the control" in text
    assert "[FAIL] the target -- detail" in text
    assert text.splitlines()[-1].startswith("FAIL: demo [a]")
    assert r.exit_code == 1 and not r.passed
    back = Result.from_json(json.loads(json.dumps(r.to_json())))
    assert back == r
    ok = _result("b", True, 1.0)
    assert ok.exit_code == 0 and ok.passed
    ok.error, ok.error_kind = "environment went away", "environment"
    assert ok.exit_code == 2 and not ok.passed
    empty = Result(experiment="demo")
    assert not empty.passed  # no checks is never a pass


def test_control_drift_steady_moved_and_unmeasured() -> None:
    a, b = _result("a", False, 1.0), _result("b", True, 1.4)
    (d,) = control_drift(a, b)
    assert d.steady and d.drift == pytest.approx(0.4)
    (d,) = control_drift(a, _result("b", True, 1.6))
    assert not d.steady
    (d,) = control_drift(a, _result("b", True, None))
    assert not d.steady and d.drift is None


# ----------------------------------------------------------------- the freeze control


async def test_freeze_held_goes_red_when_bytes_cross_or_nothing_was_frozen() -> None:
    async with echo_server() as addr, open_proxy(upstream=addr) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        await stream.send_all(b"hello")
        assert await stream.receive_some(5) == b"hello"
        ctx = types.SimpleNamespace(log=types.SimpleNamespace(write=lambda *a, **k: None))
        rec = await freeze_links(ctx, proxy)  # type: ignore[arg-type]
        assert rec.count == 1
        await stream.send_all(b"into the frozen link")
        ok, detail = freeze_held(proxy, rec)
        assert ok, detail
        # Break it: thaw, so bytes move (the control must go red).
        await proxy.thaw()
        with trio.fail_after(5):
            got = b""
            while len(got) < 20:
                got += await stream.receive_some(64)
        ok, detail = freeze_held(proxy, rec)
        assert not ok and "moved" in detail
        await stream.aclose()
    empty = FreezeRecord(0.0, 0, {})
    ok, detail = freeze_held(types.SimpleNamespace(connections=lambda: []), empty)
    assert not ok and "no link was frozen" in detail


# ----------------------------------------------------------------- what importing costs


def test_reading_results_loads_no_trio_and_the_api_loads_on_first_use() -> None:
    """The run report imports this package for Result and the contract reader alone:
    that must not drag in trio and the drivers (0.3 s -> 2.0 s for `import
    harness.report` when it did). Context and BotHandle still import as names."""
    code = (
        "import sys\n"
        "import harness.report\n"
        "from harness.experiment import Result, claims_delivery\n"
        "print('trio' in sys.modules, 'drivers.mcp' in sys.modules)\n"
        "from harness.experiment import BotHandle, Context\n"
        "from harness.experiment._context import Context as Direct\n"
        "print(Context is Direct, BotHandle.__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "True", "BotHandle"]
