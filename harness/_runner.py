"""The machinery every experiment shares: arguments, BOT_BIN, the environment, the run
directory, the repeat loop with logged seeds, and a :class:`Context` of helpers
(leader observer, spawning workers, starting bots, the proxy, waits with a countdown).

An experiment module provides::

    NAME = "silent_loss"
    DESCRIPTION = "..."
    MAX_REAL_S = 400.0            # its longest scenario at time scale 1.0
    def add_arguments(parser): ...
    async def run(ctx: Context) -> None: ...   # fills ctx.result

and gets ``main(argv)`` (a console entry point) and ``amain(argv)`` (the same, awaitable
from a running trio loop, which the tests use to save interpreter start-ups) from here,
in one line: ``amain, main = _runner.commands(__name__)``.

Topology of every experiment: the leader is an IRC observer (``drivers.irc``) that
authenticates with the environment's leader token and talks to the server DIRECTLY; it
spawns the workers and is the independent observer that scores delivery. Each worker is
the program under test (BOT_BIN), started through the MCP driver, and reaches the server
through a faultnet :class:`~faultnet.Proxy` that runs in this process.

Exit codes: 0 every check of every attempt passed; 1 a check failed (or the bot under test
could not do its job); 2 usage or environment (no BOT_BIN, no environment, the bot is not
an MCP server, the harness's own machinery failed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import secrets
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, TypeVar

import trio

from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail
from faultnet.eventlog import JsonlWriter, flatten
from faultnet.interrupts import cancel_on_signals
from faultnet.procs import stop_exact
from harness import env as envmod
from harness._contract import claims_delivery, parse_botevents
from harness._report import EXIT_ENV, EXIT_FAILED, EXIT_OK, Result, render_result
from harness._timescale import TimeScale, time_scale_from
from harness.report import publish_run

__all__ = [
    "BotHandle",
    "Context",
    "RunProblem",
    "add_common_arguments",
    "amain",
    "attempt_seeds",
    "run_cancellable",
    "claims_delivery",
    "main",
    "parse_botevents",
    "pct",
    "resolve_bot_argv",
    "run_attempt",
]

T = TypeVar("T")


class RunProblem(Exception):
    """The bot under test could not do its job (exit 1): it never connected, a spawn
    it needed failed. Recorded as the run's error; every check counts as failed."""


# --------------------------------------------------------------------------- helpers


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile *p* (0-100) of *values*; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    i = min(len(xs) - 1, max(0, round(p / 100.0 * (len(xs) - 1))))
    return xs[i]


def resolve_bot_argv(cli_value: str | None, environ: dict[str, str] | None = None) -> list[str]:
    """BOT_BIN as an argv: from --bot-bin, else BOT_BIN, else APIARY_BIN (an alias).

    Raises EnvironmentProblem with the reason when it is missing, empty, unparseable, or
    its program cannot be found. There is no default on purpose: a pair whose two arms
    silently ran the same default program would look like a result.
    """
    env = os.environ if environ is None else environ
    raw, source = cli_value, "--bot-bin"
    if raw is None:
        for name in ("BOT_BIN", "APIARY_BIN"):
            if env.get(name):
                raw, source = env[name], name
                break
    if raw is None or not raw.strip():
        raise EnvironmentProblem(
            "BOT_BIN is required and has no default: set BOT_BIN (or APIARY_BIN) or pass "
            "--bot-bin to the command line of the bot under test, e.g. "
            f"BOT_BIN='{shlex.quote(sys.executable)} -m harness.bot'"
        )
    try:
        argv = shlex.split(raw)
    except ValueError as exc:
        raise EnvironmentProblem(f"{source}: cannot parse {raw!r}: {exc}") from None
    if not argv:
        raise EnvironmentProblem(f"{source} is empty")
    if shutil.which(argv[0]) is None:
        raise EnvironmentProblem(f"{source}: program not found or not executable: {argv[0]!r}")
    return argv


def resolved_program(argv: Sequence[str]) -> list[str]:
    """*argv* with its program resolved through PATH and symlinks, for comparing arms."""
    found = shutil.which(argv[0])
    prog = os.path.realpath(found) if found else argv[0]
    return [prog, *argv[1:]]


def unique_nick(prefix: str) -> str:
    """A nick never used before on any server: revoked nicks stay burned, so a nick is
    never derived from the seed (a replay would collide with its own original)."""
    return f"{prefix}{secrets.token_hex(3)}"


def attempt_seeds(n: int, seed: int | None) -> list[int]:
    """Seeds for *n* attempts: ``seed, seed+1, ...`` when one is given (so ``--seed S``
    replays attempt 1 of a run whose first seed was S), else fresh random 32-bit seeds."""
    if seed is not None:
        return [seed + i for i in range(n)]
    return [secrets.randbits(32) for _ in range(n)]


# --------------------------------------------------------------------------- context


@dataclass
class BotHandle:
    """One running bot under test: its driver, nick, and BOTEVENT helpers."""

    drv: Any
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
    env: Any  # harness.env.EnvState
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
    async def leader(self) -> AsyncIterator[Any]:
        """The leader: an IRC observer with the leader's token, on a direct link.

        On exit it revokes every worker spawned through :meth:`spawn` (best effort,
        bounded), records its transcript in the run directory, and disconnects.
        """
        from drivers import irc

        env = self.env
        entered = False
        try:
            async with irc.open_observer(
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

    async def _revoke_all(self, obs: Any) -> None:
        from harness import enclave

        for nick in list(self._spawned):
            with trio.move_on_after(5):
                try:
                    await enclave.revoke_worker(obs, nick)
                    self.log.write("revoked", nick=nick)
                except Exception as exc:  # best effort: the run is over either way
                    self.log.write("revoke_failed", nick=nick, error=str(exc))
            self._spawned.remove(nick)

    def _dump_transcript(self, obs: Any) -> None:
        with JsonlWriter(self.run_dir / "observer.jsonl") as w:
            for m in list(getattr(obs, "messages", [])):
                w.write(
                    "message",
                    time=getattr(m, "time", None),
                    sender=getattr(m, "sender", None),
                    target=getattr(m, "target", None),
                    text=getattr(m, "text", None),
                )

    async def spawn(self, obs: Any, prefix: str) -> tuple[str, str]:
        """Spawn a worker with a fresh nick; return (nick, token)."""
        from harness import enclave

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
    async def proxy(self) -> AsyncIterator[Any]:
        """A faultnet proxy in this process, in front of the server, logging to the run
        directory and seeded with this attempt's seed."""
        from faultnet import open_proxy

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
    async def bot(self, nick: str, token: str, label: str, via: Any) -> AsyncIterator[BotHandle]:
        """Start BOT_BIN as worker *nick*, reaching the server through proxy *via*
        (None: directly). Its stderr and call records land in the run directory."""
        from drivers import mcp

        host, port = via.address if via is not None else (self.env.host, int(self.env.port))
        env = self.bot_env(nick, token, host, int(port))
        call_dir = self.run_dir / "calls" / label
        entered = False
        try:
            async with mcp.open_mcp(
                self.bot_argv,
                env=env,
                call_log_dir=str(call_dir),
                # A post waits at most the confirmation budget; anything past this is a
                # hung call, and the experiments pass their own tighter bound anyway.
                timeout=self.scale.bound(60, floor=30),
                # The SDK bot takes 1-2.5 s to answer initialize on an idle machine; four
                # starting at once on 2 loaded cores took over 10 s, hence the floor.
                # 30 s at real time, scaled with the rest.
                handshake_timeout=self.scale.bound(30, floor=20),
            ) as drv:
                entered = True
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
    async def worker(self, obs: Any, proxy: Any, prefix: str) -> AsyncIterator[BotHandle]:
        """The usual single worker: spawned with a fresh nick (*prefix*), BOT_BIN started
        as it through *proxy*, connected (RunProblem if never) and settled."""
        nick, token = await self.spawn(obs, prefix)
        self.phase(f"worker {nick} starting, through the proxy at {proxy.address[1]}")
        async with self.bot(nick, token, "worker", via=proxy) as w:
            await self.connected(w)
            await self.countdown(self.scale.real("settle"), "the worker settles")
            yield w

    def _save_stderr(self, label: str, drv: Any) -> None:
        with contextlib.suppress(Exception):
            (self.run_dir / f"{label}.stderr").write_text(drv.stderr_text())

    async def connected(self, bot: BotHandle) -> dict[str, Any]:
        """Wait for the bot's first ``connected`` BOTEVENT (bounded); RunProblem if never."""
        ev = await bot.wait_event("connected", self.scale.bound(15, floor=20))
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


# --------------------------------------------------------------------------- arguments


def add_common_arguments(p: argparse.ArgumentParser, *, pair: bool = False) -> None:
    """The flags every experiment (and, with pair=True, the pair runner) takes."""
    if not pair:
        p.add_argument(
            "--bot-bin",
            metavar="CMD",
            help="command line of the bot under test (shlex-split); default: $BOT_BIN, "
            "or $APIARY_BIN (a stale alias of BOT_BIN, still accepted). Required: there is "
            "no default.",
        )
        envg = p.add_mutually_exclusive_group()
        envg.add_argument(
            "--state",
            metavar="DIR",
            type=Path,
            help="use the environment env-up wrote to DIR (state.env)",
        )
        envg.add_argument(
            "--env",
            choices=["auto"],
            help="bring up a private environment for each attempt and tear it down after",
        )
    p.add_argument(
        "--time-scale",
        metavar="F",
        help="scale every wait and every bot timing by F (default $HARNESS_TIME_SCALE or 1.0)",
    )
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run N attempts")
    p.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="seed of the first attempt (replays it); later attempts use S+1, S+2, ...",
    )
    p.add_argument("--out", type=Path, metavar="PATH", help="write the JSON result here")
    p.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="the JSONL attempt report (default RUN_DIR/report.jsonl)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where attempts keep their evidence (default: a new directory under $TMPDIR)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the run directory of passing attempts too"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON result on stdout (progress goes to stderr)",
    )


def build_parser(exp: ModuleType) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m harness.exp_{exp.NAME}",
        description=exp.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 every check passed, 1 a check failed, 2 usage or environment.",
    )
    add_common_arguments(p)
    exp.add_arguments(p)
    return p


# --------------------------------------------------------------------------- environment


@contextlib.asynccontextmanager
async def environment(
    mode: str | None, state: Path | None, run_dir: Path, scale: TimeScale, say: Callable
) -> AsyncIterator[Any]:
    """Yield an EnvState: the one in *state* (or env's default), or, for mode "auto", a
    private one brought up under *run_dir* and brought down by its exact PID after."""
    if mode != "auto":
        if state is None and os.environ.get("ENCLAVE_STATE_DIR"):
            state = Path(os.environ["ENCLAVE_STATE_DIR"])
        if state is None:
            raise EnvironmentProblem(
                "no environment: pass --state DIR (written by scripts/env-up.sh or "
                "python -m harness.env up; or set ENCLAVE_STATE_DIR), or --env auto"
            )
        try:
            st = await trio.to_thread.run_sync(envmod.read_state, state)
        except Exception as exc:
            raise EnvironmentProblem(
                f"no usable environment in {state}: {exc}; run scripts/env-up.sh (or "
                "python -m harness.env up) first, or pass --env auto"
            ) from None
        if not st.identity.is_alive():
            raise EnvironmentProblem(
                f"the environment's server (pid {st.pid}) is not running; run env-up again "
                "or pass --env auto"
            )
        yield st
        return
    env_dir = run_dir / "env"
    kwargs: dict[str, Any] = {}
    if scale.factor != 1.0:
        kwargs = {
            "ping_interval": scale.real("server_ping_interval"),
            "ping_timeout": scale.real("server_ping_timeout"),
        }
    try:
        st = await trio.to_thread.run_sync(lambda: envmod.up(env_dir, **kwargs))
    except Exception as exc:
        raise EnvironmentProblem(f"env up failed: {type(exc).__name__}: {exc}") from exc
    say(f"-- environment up: server pid {st.pid} on {st.host}:{st.port} (state {env_dir})")
    try:
        yield st
    finally:
        with trio.CancelScope(shield=True):
            try:
                rep = await trio.to_thread.run_sync(envmod.down, env_dir)
                say(f"-- environment down: {rep.message}")
                done = rep.outcome in ("stopped", "killed", "gone")
            except Exception as exc:
                say(f"-- environment down FAILED: {type(exc).__name__}: {exc}")
                done = False
            if not done:
                # Backstop: this run started the server, and its PID and start time (read
                # once at spawn) pin that one process, which is all stop_exact needs.
                stopped = await trio.to_thread.run_sync(stop_exact, st.identity)
                say(
                    f"-- environment down (backstop): server pid {st.pid} by its recorded "
                    f"PID and start time: {stopped.outcome}"
                )


# --------------------------------------------------------------------------- attempts


async def run_attempt(
    exp: ModuleType,
    args: argparse.Namespace,
    *,
    bot_argv: list[str],
    scale: TimeScale,
    seed: int,
    run_dir: Path,
    arm: str = "",
    out: TextIO | None = None,
) -> Result:
    """Run *exp* once against one arm; never raises for a failure of the bot or the
    environment (they become ``result.error``). Writes ``run_dir/result.json``.

    The environment is the one *args* names: ``args.env`` ("auto": a private one for
    this attempt) or ``args.state`` (the directory env-up wrote)."""
    out = out if out is not None else sys.stdout
    _mkdir(run_dir)
    result = Result(
        experiment=exp.NAME,
        arm=arm,
        bot_argv=list(bot_argv),
        seed=seed,
        time_scale=scale.factor,
        run_dir=str(run_dir),
    )
    prefix = f"[{arm}] " if arm else ""

    def say(msg: str) -> None:
        print(f"{prefix}{msg}", file=out, flush=True)

    t0 = time.monotonic()
    say(
        f"== {exp.NAME}: bot {shlex.join(bot_argv)} | time scale {scale.factor:g} | "
        f"seed {seed} | run dir {run_dir}"
    )
    ctx: Context | None = None
    try:
        # Everything the experiment waits for is bounded on its own; this is the
        # backstop so no attempt can hang a CI job.
        with trio.fail_after(scale.bound(getattr(exp, "MAX_REAL_S", 600.0), floor=60) + 60):
            async with environment(args.env, args.state, run_dir, scale, say) as env:
                ctx = Context(args, scale, bot_argv, env, run_dir, seed, result, out, prefix)
                ctx.log.write("attempt", experiment=exp.NAME, arm=arm, bot_argv=bot_argv)
                await exp.run(ctx)
    except Exception as raw:
        exc = _leaf(raw)
        if isinstance(exc, EnvironmentProblem):
            result.error, result.error_kind = str(exc), "environment"
        elif isinstance(exc, RunProblem):
            result.error, result.error_kind = str(exc), "run"
        elif isinstance(exc, trio.TooSlowError):
            result.error = "the attempt exceeded its overall time bound"
            result.error_kind = "run"
        else:
            tb = "".join(traceback.format_exception(raw))
            (run_dir / "traceback.txt").write_text(tb)
            result.error = f"{type(exc).__name__}: {exc} (traceback in {run_dir / 'traceback.txt'})"
            result.error_kind = "run"
    finally:
        if ctx is not None:
            ctx.close()
    result.duration_s = round(time.monotonic() - t0, 3)
    if result.error:
        say(f"!! {result.error}")
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    return result


def _leaf(exc: BaseException) -> BaseException:
    """The exception that matters inside nested exception groups (trio's nurseries wrap
    what a body raises): a harness verdict first, else the first leaf."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(exc)
    for kind in (EnvironmentProblem, RunProblem, trio.TooSlowError):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0] if leaves else exc


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def overall_exit(results: Sequence[Result]) -> int:
    """2 if any attempt could not measure (environment), else 1 if any failed, else 0."""
    if any(r.exit_code == EXIT_ENV for r in results):
        return EXIT_ENV
    if any(r.exit_code != EXIT_OK for r in results):
        return EXIT_FAILED
    return EXIT_OK if results else EXIT_ENV


def default_run_dir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"faultnet-{name}-"))


def finish_attempt_dir(run_dir: Path, passed: bool, keep: bool, say: Callable) -> str | None:
    """Keep a failing attempt's directory (and say where); remove a passing one unless
    asked to keep it. Returns the kept path or None."""
    if passed and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        return None
    if not passed:
        say(f"!! attempt failed: evidence kept in {run_dir}")
    return str(run_dir)


async def amain(exp: ModuleType, argv: Sequence[str] | None = None) -> int:
    """The experiment command, awaitable: parse *argv*, run the attempts, print, exit code."""
    parser = build_parser(exp)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    out = sys.stderr if args.json else sys.stdout
    prog = parser.prog
    try:
        bot_argv = resolve_bot_argv(args.bot_bin)
        scale = time_scale_from(args.time_scale)
        if args.repeat < 1:
            raise UsageError("--repeat must be at least 1")
        check_args = getattr(exp, "check_arguments", None)
        if check_args is not None:
            check_args(args)
        base, report = open_run(args, exp.NAME, experiment=exp.NAME)
    except (CommandError, ValueError) as exc:
        return fail(prog, exc)

    def attempt_end(res: Result, kept: str | None, seed: int) -> dict[str, Any]:
        res.run_dir = kept
        publish_run(kept, f"harness.exp_{exp.NAME}", argv, seed, out)
        return {
            "passed": res.passed,
            "exit_code": res.exit_code,
            "failed": [c.name for c in res.failed_checks()],
            "error": res.error,
        }

    results = await repeat_attempts(
        args,
        base,
        report,
        out,
        {"bot_argv": bot_argv, "time_scale": scale.factor},
        functools.partial(run_attempt, exp, args, bot_argv=bot_argv, scale=scale, out=out),
        render_result,
        lambda res: res.passed,
        attempt_end,
    )
    return conclude(
        exp.NAME,
        args,
        base,
        report,
        out,
        overall_exit(results),
        sum(r.passed for r in results),
        {"experiment": exp.NAME},
        [r.to_json() for r in results],
    )


def open_run(args: argparse.Namespace, name: str, **fields: Any) -> tuple[Path, JsonlWriter]:
    """The run's base directory (``--run-dir``, else a new one under $TMPDIR) and its JSONL
    report (``--report``, else RUN_DIR/report.jsonl), opened with *fields* in each record.

    ``--out``, the run directory and the report are all checked before any attempt runs:
    one that cannot be written is an EnvironmentProblem now, not an error after a run
    that passed."""
    if args.out is not None:
        writable_file(args.out, "--out")
    if args.run_dir is not None:
        writable_dir(args.run_dir, "--run-dir")
    base = args.run_dir or default_run_dir(name)
    path = args.report or base / "report.jsonl"
    try:
        return base, JsonlWriter(path, **fields)
    except OSError as exc:
        if args.run_dir is None:
            shutil.rmtree(base, ignore_errors=True)
        raise EnvironmentProblem(
            f"--report {path}: cannot write it: {exc.strerror or exc}"
        ) from None


def writable_dir(path: Path, flag: str) -> None:
    """Make directory *path* (and its parents) and prove a file can be created in it;
    EnvironmentProblem naming *flag* if not."""
    try:
        _probe_dir(path)
    except OSError as exc:
        raise EnvironmentProblem(
            f"{flag} {path}: cannot write there: {exc.strerror or exc}"
        ) from None


def writable_file(path: Path, flag: str) -> None:
    """Prove file *path* can be written later (its directory made, a file creatable there,
    *path* itself not a directory) without creating it; EnvironmentProblem if not."""
    try:
        _probe_dir(path.parent)
    except OSError as exc:
        raise EnvironmentProblem(f"{flag} {path}: cannot write it: {exc.strerror or exc}") from None
    if path.is_dir():
        raise EnvironmentProblem(f"{flag} {path}: is a directory")


def _probe_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
        pass


async def repeat_attempts(
    args: argparse.Namespace,
    base: Path,
    report: JsonlWriter,
    out: TextIO,
    start: dict[str, Any],
    attempt: Callable[..., Awaitable[T]],
    render: Callable[[T], str],
    passed: Callable[[T], bool],
    end: Callable[[T, str | None, int], dict[str, Any]],
) -> list[T]:
    """Run ``--repeat`` attempts, one seed each (see :func:`attempt_seeds`), each in its
    own directory under *base*: ``await attempt(seed=SEED, run_dir=DIR)``. Log
    ``attempt_start`` (with *start*) before each; after it, print what *render* makes of
    its outcome to *out* and log ``attempt_end`` (with what *end* makes of the outcome,
    its kept directory and its seed).
    The report is closed at the end, whatever happened."""
    outcomes: list[T] = []
    try:
        for i, seed in enumerate(attempt_seeds(args.repeat, args.seed), 1):
            # The seed is on disk before the attempt runs: a killed run still says how
            # to replay every attempt it started.
            report.write("attempt_start", attempt=i, seed=seed, **start)
            run_dir = base / f"attempt-{i:03d}-seed-{seed}"
            outcome = await attempt(seed=seed, run_dir=run_dir)
            print(render(outcome), file=out, flush=True)
            kept = finish_attempt_dir(
                run_dir, passed(outcome), args.keep, lambda m: print(m, file=out, flush=True)
            )
            report.write(
                "attempt_end",
                attempt=i,
                seed=seed,
                **end(outcome, kept, seed),
                run_dir=kept,
                replay=f"--seed {seed}",
            )
            outcomes.append(outcome)
    finally:
        report.close()
    return outcomes


def conclude(
    label: str,
    args: argparse.Namespace,
    base: Path,
    report: JsonlWriter,
    out: TextIO,
    code: int,
    npass: int,
    head: dict[str, Any],
    attempts: list[dict[str, Any]],
) -> int:
    """Say how many attempts passed (with ``--repeat``), write the result document, and
    return *code*.

    A run directory this run made for itself (no ``--run-dir``) is removed when every
    attempt passed, unless ``--keep``: passing runs leave nothing behind in $TMPDIR. The
    document's ``report`` is then null, unless ``--report`` put it elsewhere."""
    report_path: Path | None = report.path
    if args.run_dir is None and code == EXIT_OK and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
        if not report.path.exists():
            report_path = None
    if args.repeat > 1:
        where = f"report {report_path}" if report_path else "passing: run directory removed"
        print(f"{label}: {npass}/{len(attempts)} attempts passed ({where})", file=out, flush=True)
    doc = {
        **head,
        "passed": code == EXIT_OK,
        "exit_code": code,
        "report": str(report_path) if report_path else None,
        "attempts": attempts,
    }
    write_result(doc, args)
    return code


def write_result(doc: dict[str, Any], args: argparse.Namespace) -> None:
    """Write the result document to ``--out`` (pretty) and, with ``--json``, to stdout
    (one line)."""
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str))
    if args.json:
        print(flatten(doc))


#: What an interrupted run says it did before exiting 128 + the signal number.
CLEANED = "cleaned up (processes stopped by PID)"


def run_cancellable(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """``trio.run(fn, *args)`` (an exit code), where SIGINT, SIGTERM or SIGHUP cancel the
    run cleanly (bots closed, workers revoked, a private environment brought down by its
    PID, none of which a default SIGTERM would do) and it exits 128 + the signal number
    (:func:`faultnet.interrupts.cancel_on_signals`)."""
    return trio.run(functools.partial(cancel_on_signals, cleaned=CLEANED), fn, *args)


def main(exp: ModuleType, argv: Sequence[str] | None = None) -> int:
    return run_cancellable(amain, exp, argv)


def commands(
    module_name: str,
) -> tuple[Callable[[Sequence[str] | None], Awaitable[int]], Callable[[Sequence[str] | None], int]]:
    """The experiment module *module_name*'s ``amain`` and ``main``; in the module::

        amain, main = _runner.commands(__name__)

    The module is looked up when a command runs, so this works under ``python -m`` too
    (where the module is ``__main__``).
    """

    async def exp_amain(argv: Sequence[str] | None = None) -> int:
        return await amain(sys.modules[module_name], argv)

    def exp_main(argv: Sequence[str] | None = None) -> int:
        return main(sys.modules[module_name], argv)

    return exp_amain, exp_main
