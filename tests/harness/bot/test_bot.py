"""The reference bot (harness.bot), driven as a real process over MCP stdio.

Each test runs the real enclave server in-process on loopback, starts bot processes
through drivers.mcp, scores delivery with an IRC observer connected to the server
directly (never through the proxy), and puts a faultnet Proxy between bot and server
where a fault is the scenario. Every defect switch is run against the fixed bot as a
matched pair: the defect arm must go red where the fixed arm stays green.

Timings are scaled down (idle 0.5-1 s, PONG timeout 0.5 s, budgets <= 1 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import trio

from drivers.irc import open_observer
from drivers.mcp import MCPDriver
from faultnet.eventlog import read_jsonl
from harness.bot import DEFECTS, ConfigError, config_from_env, parse_expires_in
from harness.bot._irc_proto import LineSplitter, parse, render
from tests.harness.bot.helpers import (
    BOT,
    CHANNEL,
    bot_events,
    enclave,
    matched_pair,
    open_bot,
    rig,
    status,
    wait_event,
)

HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


# ---------------------------------------------------------------------- pure units


def test_config_from_env_defaults_and_errors() -> None:
    base = {"ENCLAVE_PORT": "6667", "ENCLAVE_TOKEN": "ab" * 32, "ENCLAVE_NICK": "w1"}
    cfg = config_from_env(base)
    assert (cfg.host, cfg.channel, cfg.keepalive_idle_s, cfg.pong_timeout_s) == (
        "127.0.0.1",
        "#enclave",
        60.0,
        30.0,
    )
    assert (cfg.confirm_budget_s, cfg.reconnect_base_s, cfg.reconnect_max_s) == (3.0, 1.0, 16.0)
    assert cfg.defects == frozenset() and cfg.auth == "auto"
    assert config_from_env({**base, "ENCLAVE_TOKEN": ""}).token is None  # auto: no login
    scaled = config_from_env({**base, "BOT_KEEPALIVE_IDLE_S": "0.25"}, ["no-confirm"])
    assert scaled.keepalive_idle_s == 0.25 and scaled.has("no-confirm")
    bad = [
        ({k: v for k, v in base.items() if k != "ENCLAVE_PORT"}, "ENCLAVE_PORT"),
        ({**base, "ENCLAVE_PORT": "x"}, "ENCLAVE_PORT"),
        ({**base, "ENCLAVE_TOKEN": "", "BOT_AUTH": "sasl"}, "BOT_AUTH=sasl needs ENCLAVE_TOKEN"),
        ({**base, "BOT_AUTH": "kerberos"}, "BOT_AUTH"),
        ({**base, "ENCLAVE_NICK": "bad nick"}, "ENCLAVE_NICK"),
        ({**base, "BOT_PONG_TIMEOUT_S": "-1"}, "BOT_PONG_TIMEOUT_S"),
        ({**base, "BOT_CONFIRM_BUDGET_S": "nan"}, "BOT_CONFIRM_BUDGET_S"),
        ({**base, "BOT_RECONNECT_BASE_S": "4", "BOT_RECONNECT_MAX_S": "2"}, "BOT_RECONNECT"),
    ]
    for env, word in bad:
        with pytest.raises(ConfigError, match=word):
            config_from_env(env)
    with pytest.raises(ConfigError, match="unknown defect"):
        config_from_env(base, ["no-such-defect"])


def test_expires_in_and_line_codec() -> None:
    assert [parse_expires_in(v) for v in (3600, "90", "90s", "30m", "2h", "1d")] == [
        3600,
        90,
        90,
        1800,
        7200,
        86400,
    ]
    for bad in (0, "soon", "1.5", True, None):
        with pytest.raises(ValueError):
            parse_expires_in(bad)
    # A one-word body is always sent as a trailing parameter, and survives a parse.
    assert render("PRIVMSG", "#c", "word") == b"PRIVMSG #c :word\r\n"
    line = parse("@time=2026-01-01T00:00:00.000Z :n!u@h PRIVMSG #c :two words")
    assert (line.command, line.params, line.source_nick) == ("PRIVMSG", ("#c", "two words"), "n")
    assert line.tags["time"].startswith("2026")
    with pytest.raises(ValueError):
        render("PRIVMSG", "#c", "line one\r\nQUIT :injected")
    splitter = LineSplitter()
    assert splitter.feed(b"PING :a\r\nPI") == ["PING :a"]
    assert splitter.feed(b"NG :b\n\r\n") == ["PING :b"]


# ---------------------------------------------------------------------- the command


async def test_help_and_configuration_errors_exit_2() -> None:
    run = trio.run_process
    helped = await run([*BOT, "--help"], capture_stdout=True, capture_stderr=True)
    text = helped.stdout.decode()
    assert helped.returncode == 0
    for word in ("ENCLAVE_PORT", "BOT_AUTH", "SASL", "PASS", "BOT_RECONNECT_MAX_S", *DEFECTS):
        assert word in text
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ENCLAVE_", "BOT_"))}
    cases = [
        ([], clean, "ENCLAVE_PORT is not set"),
        (
            [],
            {**clean, "ENCLAVE_PORT": "1", "ENCLAVE_NICK": "n", "BOT_AUTH": "pass"},
            "BOT_AUTH=pass needs ENCLAVE_TOKEN",
        ),
        (
            [],
            {**clean, "ENCLAVE_PORT": "1", "ENCLAVE_NICK": "n", "ENCLAVE_TOKEN": "t"}
            | {"BOT_PONG_TIMEOUT_S": "soon"},
            "BOT_PONG_TIMEOUT_S",
        ),
        (["--defect", "bogus"], clean, "invalid choice"),
    ]
    for args, env, message in cases:
        done = await run(
            [*BOT, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert done.stdout == b""  # nothing but MCP on stdout, and here no MCP at all


# ---------------------------------------------------------------------- healthy link


async def test_connects_posts_confirms_notifies_and_manages_workers(tmp_path: Path) -> None:
    event_log = tmp_path / "bot-events.jsonl"
    async with (
        enclave(tmp_path) as env,
        open_observer(env.host, env.port, "obs", CHANNEL) as obs,
        open_bot(
            (env.host, env.port), env.leader, env.leader_token, event_log=str(event_log)
        ) as bot,
    ):
        tools = {t["name"] for t in await bot.list_tools()}
        assert tools == {"status", "send-channel", "spawn-worker", "revoke-worker"}
        st = await status(bot)
        assert st["connected"] and st["joined"] and st["session"] == 1
        assert {"sasl", "echo-message", "message-tags", "server-time"} <= set(st["caps"])

        # A healthy post confirms, and the independent observer sees it (one-word body too).
        result = await bot.call("send-channel", text="healthy post one")
        assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)"), result.text
        assert not result.is_error
        seen = await obs.wait_for("healthy post one", 5)
        assert seen is not None and seen.sender == "lead"
        result = await bot.call("send-channel", text="single")
        assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)")
        assert await obs.wait_for("single", 5) is not None
        confirm = [e for e in bot_events(bot, "post_confirm") if e["result"] == "confirmed"]
        assert len(confirm) == 2 and all(e["elapsed_ms"] < 1000 for e in confirm)

        # A channel message arrives as a notification, with no request in flight.
        await obs.privmsg(CHANNEL, "hello from the observer")
        note = await bot.wait_notification(
            lambda n: (
                n.method == "notifications/message"
                and n.params.get("data", {}).get("text") == "hello from the observer"
            ),
            5,
        )
        assert note is not None
        assert note.params["level"] == "info" and note.params["logger"] == "channel"
        data = note.params["data"]
        assert (data["channel"], data["from"]) == (CHANNEL, "obs") and data["time"]

        # Leader tools: spawn returns the token, a burned nick is an error, revoke works.
        spawned = await bot.call_tool("spawn-worker", {"nick": "w1", "expires-in": "30m"})
        assert not spawned.is_error and HEX64.search(spawned.text), spawned.text
        again = await bot.call_tool("spawn-worker", {"nick": "w1", "expires-in": 60})
        assert again.is_error and "NAME_TAKEN" in again.text
        revoked = await bot.call("revoke-worker", nick="w1")
        assert not revoked.is_error and "Revoked" in revoked.text
        bad = await bot.call_tool("spawn-worker", {"nick": "w2", "expires-in": "soon"})
        assert bad.is_error and "expires-in" in bad.text

        assert bot.problems() == []  # nothing but MCP on stdout
        # BOT_EVENT_LOG holds the same records as the BOTEVENT lines.
        logged = read_jsonl(event_log).records
        assert [r["event"] for r in logged] == [e["event"] for e in bot_events(bot)]
        assert all(r["nick"] == "lead" for r in logged)


# ---------------------------------------------------------------------- frozen link


async def test_frozen_link_fixed_says_unconfirmed_no_confirm_claims_delivery(
    tmp_path: Path,
) -> None:
    budget = 1.0
    timings = {"confirm_budget_s": budget, "keepalive_idle_s": 30, "pong_timeout_s": 30}
    async with matched_pair(tmp_path, "no-confirm", "wlie", timings) as pair:
        _env, proxy, obs, fixed, liar = pair
        # Control before the freeze: both arms deliver and the observer sees it.
        for drv, nick in ((fixed, "wfix"), (liar, "wlie")):
            result = await drv.call("send-channel", text=f"control before freeze {nick}")
            assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)"), result.text
            assert await obs.wait_for(f"control before freeze {nick}", 5) is not None

        await proxy.freeze()
        fixed_result = await fixed.call("send-channel", text="frozen post from wfix")
        liar_result = await liar.call("send-channel", text="frozen post from wlie")

        # The fixed bot does not claim delivery, and says so within its budget.
        assert "UNCONFIRMED" in fixed_result.text and fixed_result.is_error
        assert "Broadcast to" not in fixed_result.text
        assert budget * 0.9 <= fixed_result.seconds <= budget + 1.0
        # The defective bot claims delivery at once ...
        assert liar_result.text.startswith(f"Broadcast to {CHANNEL} (1 line)")
        assert not liar_result.is_error and liar_result.seconds < budget
        # ... which the independent observer contradicts over a whole budget (the
        # wait IS the scenario: absence during the window in which it was claimed).
        assert await obs.wait_for("frozen post from", budget) is None
        assert bot_events(fixed, "post_confirm")[-1]["result"] == "unconfirmed"
        assert bot_events(liar, "post_confirm")[-1]["result"] == "skipped"

        # Control after: thawing delivers the held bytes, so the observer could have
        # seen them; their absence above was the freeze, not a blind observer.
        await proxy.thaw()
        assert await obs.wait_for("frozen post from wfix", 5) is not None
        assert await obs.wait_for("frozen post from wlie", 5) is not None


async def test_keepalive_detects_frozen_link_and_reconnects_after_thaw(tmp_path: Path) -> None:
    idle, pong, base, ceiling = 0.5, 0.5, 0.1, 0.4
    timings = {
        "keepalive_idle_s": idle,
        "pong_timeout_s": pong,
        "confirm_budget_s": 0.5,
        "reconnect_base_s": base,
        "reconnect_max_s": ceiling,
        "register_timeout_s": 0.5,
    }
    async with (
        rig(tmp_path) as (env, proxy, obs),
        open_bot(proxy.address, "wka", env.worker("wka"), **timings) as bot,
    ):
        # Frozen, new connections included: the bot must notice by itself, and cannot
        # reconnect until the thaw.
        await proxy.freeze(include_new=True)
        frozen_at = time.monotonic()
        timeout_event = await wait_event(bot, "pong_timeout", idle + pong + 3)
        assert timeout_event is not None, bot.stderr_text()
        detected_after = timeout_event["mono"] - frozen_at
        assert detected_after <= idle + pong + 0.5, detected_after
        assert timeout_event["waited_ms"] >= pong * 1000 * 0.95
        down = await wait_event(bot, "disconnected", 2)
        assert down is not None and down["reason"] == "pong_timeout"

        # A dead link never blocks a tool call: prompt UNCONFIRMED, nothing claimed.
        result = await bot.call("send-channel", text="post while disconnected")
        assert "UNCONFIRMED" in result.text and "not connected" in result.text
        # Not blocked: the bot's own record says nothing was written and no confirmation
        # was waited for (its elapsed time is inside the bot, so a loaded test process or
        # the MCP pipe cannot make this flaky the way `result.seconds < 0.5` could).
        posted = await wait_event(bot, "post_confirm", 2, connected=False)
        assert posted is not None and posted["result"] == "unconfirmed"
        assert posted["elapsed_ms"] < timings["confirm_budget_s"] * 1000, posted
        st = await status(bot)
        assert not st["connected"] and st["caps"] == [] and st["session"] is None

        # Attempts into the frozen proxy fail and back off; no reconnect before the thaw.
        assert await wait_event(bot, "connect_failed", 5) is not None
        assert bot_events(bot, "reconnected") == []
        await proxy.thaw()
        back = await wait_event(bot, "reconnected", 5)
        assert back is not None and back["session"] == 2, bot.stderr_text()
        st = await status(bot)
        assert st["connected"] and st["session"] == 2 and st["reconnects"] == 1
        result = await bot.call("send-channel", text="post after the thaw")
        assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)"), result.text
        assert await obs.wait_for("post after the thaw", 5) is not None

        # Back-off: with the port refused, waits double from base up to the ceiling.
        before = len(bot_events(bot, "connect_failed"))
        await proxy.refuse()
        await proxy.sever()
        assert await wait_event(bot, "disconnected", 5, session=2) is not None
        assert await wait_event(bot, "connect_failed", 5, count=before + 4) is not None
        refused = bot_events(bot, "connect_failed")[before : before + 4]
        assert [e["attempt"] for e in refused] == [1, 2, 3, 4]
        assert all("refused" in e["reason"].lower() for e in refused), [
            e["reason"] for e in refused
        ]
        waits = [e["retry_in_s"] for e in refused]
        assert waits == pytest.approx([base, 2 * base, ceiling, ceiling]), waits
        await proxy.restore()
        assert await wait_event(bot, "reconnected", ceiling + 5, session=3) is not None


async def test_chatty_bot_with_outbound_refreshes_idle_never_detects(tmp_path: Path) -> None:
    # Idle 1 s and a post every 0.25 s: a 4x margin against scheduling jitter on a busy
    # machine (a late post must not give the defective arm a PING by accident).
    idle, pong, every, watch = 1.0, 0.5, 0.25, 4.0
    timings = {"keepalive_idle_s": idle, "pong_timeout_s": pong, "confirm_budget_s": 0.15}
    async with matched_pair(tmp_path, "outbound-refreshes-idle", "wblind", timings) as pair:
        _env, proxy, _obs, fixed, blind = pair
        await proxy.freeze()  # both links at the same instant
        frozen_at = time.monotonic()

        async def chatter(drv: MCPDriver, tag: str) -> None:
            n = 0
            while time.monotonic() - frozen_at < watch:
                n += 1
                await drv.call("send-channel", text=f"chatty milestone {tag} {n}")
                await trio.sleep(every)  # the posting cadence is the scenario

        async with trio.open_nursery() as nursery:
            nursery.start_soon(chatter, fixed, "fix")
            nursery.start_soon(chatter, blind, "blind")
        stopped_at = time.monotonic()

        # Fixed arm: detected on its own keepalive, posting notwithstanding.
        fixed_timeout = bot_events(fixed, "pong_timeout")
        assert fixed_timeout, fixed.stderr_text()
        assert fixed_timeout[0]["mono"] - frozen_at <= idle + pong + 0.5
        # Defective arm: a whole watch window (> 2x idle + PONG timeout), blind.
        assert bot_events(blind, "pong_timeout") == []
        assert bot_events(blind, "disconnected") == []

        # Internal control: once it stops posting, the same defective bot detects,
        # so its keepalive works and the blindness above was the posting alone.
        late = await wait_event(blind, "pong_timeout", idle + pong + 3)
        assert late is not None
        assert late["mono"] - stopped_at <= idle + pong + 0.5


# ---------------------------------------------------------------------- reconnect defects


async def test_leak_fd_on_reconnect_grows_fds_fixed_stays_flat(tmp_path: Path) -> None:
    cycles = 3
    timings = {"reconnect_base_s": 0.1, "reconnect_max_s": 0.4, "keepalive_idle_s": 30}
    async with matched_pair(tmp_path, "leak-fd-on-reconnect", "wleak", timings) as pair:
        _env, proxy, _obs, fixed, leaky = pair
        bots = (fixed, leaky)
        for drv in bots:  # warm the confirmation path before the baseline
            assert not (await drv.call("send-channel", text="warm up post")).is_error
        baseline = [drv.fd_count() for drv in bots]
        for cycle in range(2, cycles + 2):
            await proxy.sever()
            for drv in bots:
                back = await wait_event(drv, "reconnected", 5, session=cycle)
                assert back is not None, drv.stderr_text()
        for drv in bots:
            result = await drv.call("send-channel", text="post after reconnects")
            assert result.text.startswith("Broadcast to"), result.text
        after = [drv.fd_count() for drv in bots]
        assert after[0] == baseline[0], (baseline, after)
        assert after[1] - baseline[1] == cycles, (baseline, after)


async def test_drop_caps_on_reconnect_loses_caps_fixed_keeps_them(tmp_path: Path) -> None:
    timings = {"reconnect_base_s": 0.1, "reconnect_max_s": 0.4, "keepalive_idle_s": 30}
    full = {"sasl", "echo-message", "message-tags", "server-time"}
    async with matched_pair(tmp_path, "drop-caps-on-reconnect", "wcaps", timings) as pair:
        env, proxy, obs, fixed, dropper = pair
        for drv in (fixed, dropper):
            assert set((await status(drv))["caps"]) == full
        await proxy.sever()
        for drv in (fixed, dropper):
            assert await wait_event(drv, "reconnected", 5, session=2) is not None
        assert set((await status(fixed))["caps"]) == full
        assert (await status(dropper))["caps"] == ["sasl"]
        # The server's own record agrees with each bot's report.
        assert [set(c) for c in env.registered_caps("wfix")] == [full, full]
        assert [set(c) for c in env.registered_caps("wcaps")] == [full, {"sasl"}]

        # The loss has an effect: without echo-message a bot no longer hears its own
        # post. Proved by order, not by a timeout: the server relays in order, so a
        # marker the observer sends AFTER both posts were confirmed arrives after any
        # echo would have.
        for drv, nick in ((fixed, "wfix"), (dropper, "wcaps")):
            result = await drv.call("send-channel", text=f"echo check {nick}")
            assert result.text.startswith("Broadcast to"), result.text
        await obs.privmsg(CHANNEL, "marker after the echo checks")

        def texts(drv: MCPDriver) -> list[str]:
            return [str(n.params.get("data", {}).get("text")) for n in drv.notifications()]

        for drv in (fixed, dropper):
            marker = await drv.wait_notification(
                lambda n: n.params.get("data", {}).get("text") == "marker after the echo checks",
                5,
            )
            assert marker is not None
        before_marker = {
            nick: texts(drv)[: texts(drv).index("marker after the echo checks")]
            for drv, nick in ((fixed, "wfix"), (dropper, "wcaps"))
        }
        assert "echo check wfix" in before_marker["wfix"]
        assert "echo check wcaps" not in before_marker["wcaps"]
