"""The experiment API: :class:`Context` (what an experiment's ``run`` gets: its settings,
the leader observer, spawning workers, starting bots, the proxy, waits with a countdown)
and :class:`BotHandle` (one running bot under test).

The seams are the real classes, not stand-ins: the leader is a
:class:`drivers.irc.Observer`, a bot's driver a :class:`drivers.mcp.MCPDriver`, a link
to the server a :class:`faultnet.Proxy` (or None: direct), the environment a
:class:`harness.env.EnvState`. ``mypy --strict`` checks this package (``.ci/run``).

Topology of every experiment: the leader is an IRC observer (``drivers.irc``) that
authenticates with the environment's leader token and talks to the server DIRECTLY; it
spawns the workers and is the independent observer that scores delivery. Each worker is
the program under test (BOT_BIN), started through the MCP driver, and reaches the server
through a faultnet :class:`~faultnet.Proxy` that runs in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import trio

from drivers.irc import Observer, open_observer
from drivers.mcp import MCPDriver, open_mcp
from faultnet import Proxy, open_proxy
from faultnet.errors import EnvironmentProblem
from faultnet.eventlog import JsonlWriter
from harness import enclave
from harness.env import EnvState
from harness.experiment._contract import parse_botevents
from harness.experiment._helpers import RunProblem, unique_nick
from harness.experiment._result import Result
from harness.experiment._timescale import TimeScale

__all__ = ["BotHandle", "Context"]


@dataclass
class BotHandle:
    """One running bot under test: its driver, nick, and BOTEVENT helpers."""

    drv: MCPDriver
    nick: str
    label: str
    ctx: Context

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        evs = parse_botevents(self.drv.stderr_text())
        return [e for e in evs if name is None or e.get("event") == name]

    async def wait_event(
        self, name: str, timeout: float, *, count: int = 1, after_mono: float | None = None
    ) -> dict[str, Any] | None:
        """Wait until the bot has logged *count* BOTEVENTs named *name* (optionally only
        those stamped after *after_mono*); return the count-th, or None on timeout.

        The bot's ``mono`` stamp is CLOCK_MONOTONIC, the same clock as this process's
        :func:`time.monotonic`, so times compare across the two processes.
        """
        deadline = trio.current_time() + timeout
        while True:
            # Count lines first, then look: a line landing in between is seen either by
            # this look or by the wait below, never missed.
            since = self.drv.process.stderr_count()
            evs = self.events(name)
            if after_mono is not None:
                evs = [e for e in evs if float(e.get("mono", 0.0)) >= after_mono]
            if len(evs) >= count:
                return evs[count - 1]
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                return None
            # Woken by the bot's next transport event (or None: timeout, stderr closed).
            if await self.drv.wait_stderr(r"^BOTEVENT ", remaining, since=since) is None:
                evs = [
                    e
                    for e in self.events(name)
                    if after_mono is None or float(e.get("mono", 0.0)) >= after_mono
                ]
                return evs[count - 1] if len(evs) >= count else None

    async def send(self, text: str, timeout: float) -> tuple[str, float]:
        """Call send-channel; return (result text, wall seconds of the call).

        A call with no answer within *timeout* returns ``"<NO ANSWER>"`` (the driver has
        cancelled it); a tool error returns ``"<TOOL ERROR> ..."``. Neither claims
        delivery.
        """
        t0 = time.monotonic()
        try:
            res = await self.drv.call_tool("send-channel", {"text": text}, timeout=timeout)
        except TimeoutError:
            return "<NO ANSWER>", time.monotonic() - t0
        body = res.text
        if res.is_error:
            body = f"<TOOL ERROR> {body}"
        return body, time.monotonic() - t0

    def fd_count(self) -> int | None:
        return self.drv.fd_count()


@dataclass
class Context:
    """What an experiment's ``run`` gets: its settings, helpers, and the result to fill."""

    args: argparse.Namespace
    scale: TimeScale
    bot_argv: list[str]
    env: EnvState
    run_dir: Path
    seed: int
    result: Result
    out: TextIO
    prefix: str = ""
    rng: random.Random = field(init=False)
    run_tag: str = field(init=False)
    log: JsonlWriter = field(init=False)
    _progress: TextIO | None = field(default=None, init=False)
    _spawned: list[str] = field(default_factory=list, init=False)
    #: The attempt's overall bound (the runner's); each bot's start extends it by what
    #: the start took (see :meth:`bot`).
    backstop: trio.CancelScope | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        # Not from the seed: a replay on the same server must not match the original's
        # messages.
        self.run_tag = secrets.token_hex(3)
        self.log = JsonlWriter(self.run_dir / "events.jsonl", seed=self.seed)
        self._progress = open(self.run_dir / "progress.log", "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        self.log.close()
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    # ---- output

    def say(self, msg: str = "") -> None:
        """Print one progress line now (flushed), and keep it in the run directory."""
        for line in msg.split("\n") if msg else [""]:
            text = f"{self.prefix}{line}"
            print(text, file=self.out, flush=True)
            if self._progress is not None:
                self._progress.write(text + "\n")
                self._progress.flush()

    def phase(self, name: str, **fields: Any) -> None:
        self.say(f"-- {name}")
        self.log.write("phase", name=name, **fields)

    async def countdown(
        self,
        seconds: float,
        what: str,
        until: Callable[[], bool] | None = None,
        *,
        quiet: bool = False,
    ) -> bool:
        """Wait *seconds* (a scenario wait, already scaled), printing a countdown when
        it is long. With *until*, return True as soon as it holds (polled every 20 ms);
        return False if the time ran out first. Without *until*, return True at the end.
        *quiet* waits print nothing unless they are long (10 s or more).
        """
        if seconds >= 3 and not (quiet and seconds < 10):
            self.say(f"   waiting {seconds:.0f} s: {what}")
        elif seconds > 0 and not quiet:
            self.say(f"   waiting {seconds:.2g} s: {what}")
        deadline = time.monotonic() + max(0.0, seconds)
        # A countdown line about every sixth of the wait, at least 5 s apart.
        step = max(5.0, seconds / 6)
        next_tick = time.monotonic() + step
        while True:
            now = time.monotonic()
            if until is not None and until():
                return True
            if now >= deadline:
                return until is None
            if now >= next_tick and deadline - now >= 1:
                self.say(f"   ... {deadline - now:.0f} s left")
                next_tick += step
            await trio.sleep(min(0.02 if until else 0.25, deadline - now))

    # ---- the leader / observer

    @contextlib.asynccontextmanager
    async def leader(self) -> AsyncIterator[Observer]:
        """The leader: an IRC observer with the leader's token, on a direct link.

        On exit it revokes every worker spawned through :meth:`spawn` (best effort,
        bounded), records its transcript in the run directory, and disconnects.
        """
        env = self.env
        entered = False
        try:
            async with open_observer(
                env.host,
                int(env.port),
                env.leader_nick,
                env.channel,
                sasl=(env.leader_nick, env.leader_token),
            ) as obs:
                entered = True
                self.log.write("leader_connected", nick=env.leader_nick)
                try:
                    yield obs
                finally:
                    with trio.CancelScope(shield=True):
                        await self._revoke_all(obs)
                        self._dump_transcript(obs)
        except Exception as exc:
            if entered:
                raise
            raise EnvironmentProblem(
                f"leader observer could not connect to {env.host}:{env.port} as "
                f"{env.leader_nick}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _revoke_all(self, obs: Observer) -> None:
        for nick in list(self._spawned):
            with trio.move_on_after(5):
                try:
                    await enclave.revoke_worker(obs, nick)
                    self.log.write("revoked", nick=nick)
                except Exception as exc:  # best effort: the run is over either way
                    self.log.write("revoke_failed", nick=nick, error=str(exc))
            self._spawned.remove(nick)

    def _dump_transcript(self, obs: Observer) -> None:
        with JsonlWriter(self.run_dir / "observer.jsonl") as w:
            for m in list(obs.messages):
                w.write("message", time=m.time, sender=m.sender, target=m.target, text=m.text)

    async def spawn(self, obs: Observer, prefix: str) -> tuple[str, str]:
        """Spawn a worker with a fresh nick; return (nick, token)."""
        nick = unique_nick(prefix)
        # Long enough to outlive the run at any scale; revoked at the end anyway.
        expires = int(self.scale.bound(3600, floor=600))
        try:
            with trio.fail_after(self.scale.bound(10, floor=15)):
                token = await enclave.spawn_worker(obs, nick, expires)
        except trio.TooSlowError:
            raise RunProblem(f"spawn {nick}: no answer from EnclaveServ") from None
        except Exception as exc:
            raise RunProblem(f"spawn {nick} failed: {exc}") from exc
        self._spawned.append(nick)
        self.log.write("spawned", nick=nick, expires_s=expires)
        return nick, token

    # ---- the proxy

    @contextlib.asynccontextmanager
    async def proxy(self) -> AsyncIterator[Proxy]:
        """A faultnet proxy in this process, in front of the server, logging to the run
        directory and seeded with this attempt's seed."""
        entered = False
        try:
            async with open_proxy(
                upstream=(self.env.host, int(self.env.port)),
                listen=("127.0.0.1", 0),
                event_log=str(self.run_dir / "proxy.jsonl"),
                seed=self.seed,
            ) as proxy:
                entered = True
                self.log.write("proxy_up", address=list(proxy.address))
                yield proxy
        except Exception as exc:
            if entered:
                raise
            raise EnvironmentProblem(f"faultnet proxy did not start: {exc}") from exc

    # ---- bots

    def bot_env(self, nick: str, token: str, host: str, port: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            ENCLAVE_HOST=host,
            ENCLAVE_PORT=str(port),
            ENCLAVE_TOKEN=token,
            ENCLAVE_NICK=nick,
            ENCLAVE_CHANNEL=self.env.channel,
        )
        env.update(self.scale.bot_env())
        return env

    @contextlib.asynccontextmanager
    async def bot(
        self, nick: str, token: str, label: str, via: Proxy | None
    ) -> AsyncIterator[BotHandle]:
        """Start BOT_BIN as worker *nick*, reaching the server through proxy *via*
        (None: directly). Its stderr and call records land in the run directory."""
        host, port = via.address if via is not None else (self.env.host, int(self.env.port))
        env = self.bot_env(nick, token, host, int(port))
        call_dir = self.run_dir / "calls" / label
        entered = False
        t0 = trio.current_time()
        try:
            async with open_mcp(
                self.bot_argv,
                env=env,
                call_log_dir=str(call_dir),
                # A post waits at most the confirmation budget; anything past this is a
                # hung call, and the experiments pass their own tighter bound anyway.
                timeout=self.scale.bound(60, floor=30),
            ) as drv:
                entered = True
                # A start is the machine's load, not the experiment's time: the attempt's
                # bound (scaled scenario time) does not pay for it. Each start is bounded
                # on its own (the driver's HANDSHAKE_TIMEOUT_S, at every time scale),
                # so the bound stays finite.
                if self.backstop is not None:
                    self.backstop.deadline += trio.current_time() - t0
                handle = BotHandle(drv, nick, label, self)
                ident = drv.identity
                self.log.write(
                    "bot_started",
                    label=label,
                    nick=nick,
                    via=[host, int(port)],
                    identity=ident.to_json(),
                )
                try:
                    yield handle
                finally:
                    # Saved before the driver closes the bot, and again after (the last
                    # lines of a shutdown are evidence too).
                    self._save_stderr(label, drv)
            self._save_stderr(label, drv)
        except Exception as exc:
            if entered:
                raise
            raise EnvironmentProblem(
                f"BOT_BIN {shlex.join(self.bot_argv)!r} did not start as an MCP server: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    @contextlib.asynccontextmanager
    async def worker(self, obs: Observer, proxy: Proxy, prefix: str) -> AsyncIterator[BotHandle]:
        """The usual single worker: spawned with a fresh nick (*prefix*), BOT_BIN started
        as it through *proxy*, connected (RunProblem if never) and settled."""
        nick, token = await self.spawn(obs, prefix)
        self.phase(f"worker {nick} starting, through the proxy at {proxy.address[1]}")
        async with self.bot(nick, token, "worker", via=proxy) as w:
            await self.connected(w)
            await self.countdown(self.scale.real("settle"), "the worker settles")
            yield w

    def _save_stderr(self, label: str, drv: MCPDriver) -> None:
        with contextlib.suppress(Exception):
            (self.run_dir / f"{label}.stderr").write_text(drv.stderr_text())

    @property
    def connect_bound(self) -> float:
        """How long a started bot has to report ``connected`` (:meth:`connected`)."""
        return self.scale.bound(15, floor=20)

    async def connected(self, bot: BotHandle) -> dict[str, Any]:
        """Wait for the bot's first ``connected`` BOTEVENT (bounded); RunProblem if never."""
        ev = await bot.wait_event("connected", self.connect_bound)
        if ev is None:
            tail = " | ".join(bot.drv.stderr_text().splitlines()[-5:])
            raise RunProblem(f"{bot.label} ({bot.nick}) never connected; stderr tail: {tail}")
        return ev

    def payload(self, *words: str) -> str:
        """A multi-word payload: the given words plus two seeded words and a run tag.

        Multi-word on purpose: an IRC hop may relay a single-token body without its ':'
        and it would arrive empty, which looks exactly like a loss.
        """
        pick = self.rng.choice
        extra = f"{pick(_WORDS)} {pick(_WORDS)}"
        return " ".join([*words, extra, f"run {self.run_tag}"])


_WORDS = (
    "amber basalt cobalt delta ember fjord garnet harbor indigo juniper kestrel lagoon "
    "meadow nimbus opal prairie quartz river sierra tundra umber violet willow zephyr"
).split()
