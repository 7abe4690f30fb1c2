"""What the bot tests share: an in-process enclave, a bot process over MCP, its events.

Timings are scaled down by the callers (idle 0.5-1 s, PONG timeout 0.5 s, budgets <= 1 s
on the enclave).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import trio

from drivers.irc import Observer, open_observer
from drivers.mcp import MCPDriver, open_mcp
from faultnet.proxy import Proxy, open_proxy
from harness.enclave import open_server

BOT = [sys.executable, "-m", "harness.bot"]
CHANNEL = "#enclave"


@dataclass
class Enclave:
    host: str
    port: int
    server: Any
    leader: str
    leader_token: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def worker(self, nick: str) -> str:
        """Mint a worker token straight through the registry (spawned by the leader)."""
        token, _expires = self.server.registry.spawn(self.leader, nick, 600)
        return token

    def registered_caps(self, nick: str) -> list[list[str]]:
        """The caps the SERVER recorded at each registration of *nick*, in order."""
        return [
            e["caps"] for e in self.events if e["event"] == "registered" and e.get("nick") == nick
        ]


@asynccontextmanager
async def enclave(tmp_path: Path) -> AsyncIterator[Enclave]:
    events: list[dict[str, Any]] = []
    # The server's own keepalive is slow on purpose: a bot must detect a dead link by
    # itself, not be rescued by the server timing it out.
    async with open_server(
        tmp_path / "enclave", ping_interval=60, ping_timeout=60, events=events.append
    ) as server:
        host, port = server.address
        token = server.registry.mint_leader("lead")
        yield Enclave(host, port, server, "lead", token, events)


@asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Enclave, Proxy, Observer]]:
    """The enclave; a faultnet proxy in front of it, for the bots; and an observer on a
    direct link, joined to the channel, to score what the bots claim."""
    async with (
        enclave(tmp_path) as env,
        open_proxy((env.host, env.port)) as proxy,
        open_observer(env.host, env.port, "obs", CHANNEL) as obs,
    ):
        yield env, proxy, obs


class Pair(NamedTuple):
    env: Enclave
    proxy: Proxy
    obs: Observer
    fixed: MCPDriver
    defective: MCPDriver


@asynccontextmanager
async def matched_pair(
    tmp_path: Path, defect: str, nick: str, timings: dict[str, Any]
) -> AsyncIterator[Pair]:
    """A matched pair on one :func:`rig`: two bots with the same timings through the
    same proxy, ``wfix`` (no defect) and *nick* with *defect* switched on."""
    async with (
        rig(tmp_path) as (env, proxy, obs),
        open_bot(proxy.address, "wfix", env.worker("wfix"), **timings) as fixed,
        open_bot(proxy.address, nick, env.worker(nick), defect, **timings) as defective,
    ):
        yield Pair(env, proxy, obs, fixed, defective)


def bot_env(
    addr: tuple[str, int], nick: str, token: str, **settings: float | str
) -> dict[str, str]:
    """The bot's environment; each keyword ``name=value`` becomes ``BOT_NAME=value``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENCLAVE_", "BOT_"))}
    env.update(
        ENCLAVE_HOST=addr[0],
        ENCLAVE_PORT=str(addr[1]),
        ENCLAVE_NICK=nick,
        ENCLAVE_TOKEN=token,
        ENCLAVE_CHANNEL=CHANNEL,
    )
    env.update({f"BOT_{k.upper()}": str(v) for k, v in settings.items()})
    return env


@asynccontextmanager
async def open_bot(
    addr: tuple[str, int],
    nick: str,
    token: str,
    *defects: str,
    connected: bool = True,
    **settings: float | str,
) -> AsyncIterator[MCPDriver]:
    """A bot process; unless *connected* is False, once it says it is connected."""
    argv = [*BOT, *(a for d in defects for a in ("--defect", d))]
    async with open_mcp(argv, env=bot_env(addr, nick, token, **settings), timeout=10) as drv:
        if connected:
            assert await wait_event(drv, "connected", 10), drv.stderr_text()
        yield drv


def bot_events(drv: MCPDriver, name: str | None = None) -> list[dict[str, Any]]:
    out = []
    for line in drv.grep_stderr(r"^BOTEVENT "):
        record = json.loads(line.split(" ", 1)[1])
        if name is None or record["event"] == name:
            out.append(record)
    return out


async def wait_event(
    drv: MCPDriver, name: str, timeout: float, *, count: int = 1, **match: Any
) -> dict[str, Any] | None:
    """The *count*-th BOTEVENT *name* whose fields equal *match*; None after *timeout*."""

    def found() -> dict[str, Any] | None:
        hits = [e for e in bot_events(drv, name) if all(e.get(k) == v for k, v in match.items())]
        return hits[count - 1] if len(hits) >= count else None

    with trio.move_on_after(timeout):
        while True:
            since = drv.process.stderr_count()  # before looking: no line slips between
            if (hit := found()) is not None:
                return hit
            if await drv.wait_stderr(r"^BOTEVENT ", timeout, since=since) is None:
                return None  # stderr closed (the bot exited) or the time is up
    return None


async def status(drv: MCPDriver) -> dict[str, Any]:
    result = await drv.call("status")
    assert not result.is_error, result.text
    return json.loads(result.text)
