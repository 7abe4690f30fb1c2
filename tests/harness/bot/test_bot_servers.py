"""The reference bot on a standard IRC server (Debian's ngircd) as well as the enclave.

The same life is run against both servers: connect and log in, join, a post the server
confirms and an observer on a direct link sees, a frozen link (faultnet Proxy, new
connections too) detected by the bot's own keepalive, and a reconnect after the thaw.
The login differs and is checked: the enclave offers SASL PLAIN, ngircd offers no SASL
and takes a server password with PASS. Before the bot chose its login from the server's
``CAP LS`` it could not log in to ngircd at all ("server does not offer SASL PLAIN",
retried for ever).

ngircd throttles a client (about one command a second once it is busy), so the budgets
here are seconds, not the enclave tests' fractions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drivers.irc import open_observer
from faultnet.proxy import open_proxy
from tests.harness.bot.helpers import CHANNEL, bot_events, enclave, open_bot, status, wait_event
from tests.harness.ngircd import PING_TIMEOUT_S, open_ngircd

PASSWORD = "ngircd-server-password"
TIMINGS = {
    "keepalive_idle_s": 1.0,
    "pong_timeout_s": 1.0,
    "confirm_budget_s": 5.0,
    "reconnect_base_s": 0.2,
    "reconnect_max_s": 1.0,
    "register_timeout_s": 4.0,
}


@dataclass
class Server:
    """Where a bot and the observer log in, and the login the bot is expected to use."""

    host: str
    port: int
    token: str
    auth: str
    observer: dict[str, Any] = field(default_factory=dict)
    #: The server's own view of the bot's logins (the enclave's registered events).
    events: list[dict[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def irc_server(kind: str, tmp_path: Path, nick: str) -> AsyncIterator[Server]:
    if kind == "enclave":
        async with enclave(tmp_path) as env:
            yield Server(env.host, env.port, env.worker(nick), "sasl", events=env.events)
    else:
        async with open_ngircd(tmp_path, password=PASSWORD) as ng:
            yield Server(ng.host, ng.port, PASSWORD, "pass", {"password": PASSWORD})


@pytest.mark.parametrize("kind", ["enclave", "ngircd"])
async def test_the_bot_lives_on_the_enclave_and_on_ngircd(kind: str, tmp_path: Path) -> None:
    idle, pong = TIMINGS["keepalive_idle_s"], TIMINGS["pong_timeout_s"]
    async with (
        irc_server(kind, tmp_path, "wlife") as srv,
        open_proxy((srv.host, srv.port)) as proxy,
        open_observer(srv.host, srv.port, "obs", CHANNEL, **srv.observer) as obs,
        open_bot(proxy.address, "wlife", srv.token, **TIMINGS) as bot,
    ):
        connected = bot_events(bot, "connected")
        assert [e["auth"] for e in connected] == [srv.auth], bot.stderr_text()
        st = await status(bot)
        assert st["connected"] and st["joined"] and st["auth"] == srv.auth

        result = await bot.call("send-channel", text=f"first post on {kind}")
        assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)"), result.text
        assert await obs.wait_for(f"first post on {kind}", 5, sender="wlife") is not None

        # Frozen, new connections included: the bot notices by itself, long before the
        # server's own keepalive (ngircd's floor: 5 s + 5 s) would rescue it.
        await proxy.freeze(include_new=True)
        frozen_at = time.monotonic()
        detected = await wait_event(bot, "pong_timeout", idle + pong + 3)
        assert detected is not None, bot.stderr_text()
        assert detected["mono"] - frozen_at < min(idle + pong + 1.0, 2 * PING_TIMEOUT_S)
        down = await wait_event(bot, "disconnected", 2)
        assert down is not None and down["reason"] == "pong_timeout"
        assert await wait_event(bot, "connect_failed", 10) is not None  # into the freeze
        assert bot_events(bot, "reconnected") == []

        await proxy.thaw()
        back = await wait_event(bot, "reconnected", 15, session=2)
        assert back is not None, bot.stderr_text()
        assert [e["auth"] for e in bot_events(bot, "connected")] == [srv.auth] * 2
        result = await bot.call("send-channel", text=f"post after the thaw on {kind}")
        assert result.text.startswith(f"Broadcast to {CHANNEL} (1 line)"), result.text
        assert await obs.wait_for(f"post after the thaw on {kind}", 5) is not None
    if kind == "enclave":  # the server's record agrees with the bot's
        logins = [e["auth"] for e in srv.events if e["event"] == "registered"]
        assert logins.count("sasl") == 2, logins


async def test_bot_auth_chooses_or_forces_the_login(tmp_path: Path) -> None:
    """auto without a token logs in with nothing (ngircd without a password); BOT_AUTH=pass
    uses PASS where SASL is offered (the enclave says which it got); BOT_AUTH=sasl on a
    server without SASL fails its attempts, saying why; a wrong PASS is refused."""
    quick = {**TIMINGS, "reconnect_base_s": 0.2, "reconnect_max_s": 0.2}
    async with open_ngircd(tmp_path / "open") as open_ng:
        async with open_bot((open_ng.host, open_ng.port), "guest1", "", **quick) as bot:
            assert bot_events(bot, "connected")[0]["auth"] == "none"
            assert (await status(bot))["joined"]

    async with enclave(tmp_path) as env:
        token = env.worker("wpass")
        async with open_bot((env.host, env.port), "wpass", token, auth="pass", **quick) as bot:
            assert bot_events(bot, "connected")[0]["auth"] == "pass"
        assert [e["auth"] for e in env.events if e["event"] == "registered"] == ["pass"]

    async with open_ngircd(tmp_path / "locked", password=PASSWORD) as ng:
        for settings, reason in (
            ({"auth": "sasl"}, "server does not offer SASL PLAIN (BOT_AUTH=sasl)"),
            ({}, "Bad password"),  # auto: PASS, with the wrong token
        ):
            addr = (ng.host, ng.port)
            async with open_bot(addr, "wbad", "wrong", connected=False, **settings, **quick) as bot:
                failed = await wait_event(bot, "connect_failed", 10)
                assert failed is not None and reason in failed["reason"], bot.stderr_text()
                assert bot_events(bot, "connected") == []
