"""The fleet's runner: the bots, their links, the workload, and chaos on the links.

It only RECORDS; :mod:`harness.fleet.verify` judges (see :mod:`harness.fleet` for the
run directory they share). The faults are ``faultnet chaos``'s: the plan
(:mod:`harness.fleet._plan`) is made by its planner, walked by its runner on the fleet's
in-process proxies, and its join log is the run's ``faults.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drivers.mcp import HANDSHAKE_TIMEOUT_S
from faultnet.chaos import JoinLog, Plan, PlanError, Runner, draw, make_plan
from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail
from faultnet.eventlog import JsonlWriter, read_jsonl
from faultnet.interrupts import cancel_on_signals
from harness.experiment import (
    EXIT_ENV,
    EXIT_OK,
    BotHandle,
    Context,
    RunProblem,
    TimeScale,
    claims_delivery,
    resolve_bot_argv,
    time_scale_from,
    unique_nick,
)
from harness.fleet._plan import FAULT_PHASE, POST_INTERVAL, fleet_config, slots_json
from harness.runner import default_run_dir, run_attempt, supervised

__all__ = ["MODES", "amain", "build_parser", "main", "run"]

NAME = "fleet"
PROG = "python -m harness.fleet"
MODES = ("main", "storm", "control")
CONTROL_DEFECT = "no-confirm"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "faultnet-fleet/1"
WORKERS_PER_OWNER = 2  # the enclave's quota is 3 per owner and the leader counts

#: Bots starting at once. A reference bot spends 1.7 s of CPU importing the MCP SDK (5 s
#: of wall time on a 2-core machine at load 9): four at once (two fleets of two) missed
#: the driver's 30 s initialize bound at load 12, so bots start one after another, each
#: as soon as the one before it has connected.
STARTING_AT_ONCE = 1
#: Descriptor drift allowed per bot between its baseline and its final count.
FD_TOLERANCE = 1
#: How much longer than the fault phase the attempt may take at time scale 1.0.
MAX_REAL_S = FAULT_PHASE + 400.0

# --------------------------------------------------------------------------- the run


@dataclass
class BotSpec:
    label: str
    nick: str
    token: str
    owner: str
    pace: float  # seconds between posts (scenario, scaled)
    proxy: Any = None
    bot: BotHandle | None = None
    link: str = ""

    def files(self) -> dict[str, str]:
        return {
            "posts": f"bots/{self.label}/posts.jsonl",
            "fds": f"bots/{self.label}/fds.jsonl",
            "stderr": f"{self.label}.stderr",
            "calls": f"calls/{self.label}",
        }


@dataclass
class Fleet:
    ctx: Context
    specs: list[BotSpec]
    ready: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(0))
    starting: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(STARTING_AT_ONCE))
    go: trio.Event = field(default_factory=trio.Event)
    stop_posting: trio.Event = field(default_factory=trio.Event)
    finish: trio.Event = field(default_factory=trio.Event)
    roll_call: trio.Event = field(default_factory=trio.Event)
    rolled: int = 0  # bots done with their roll call


async def _post(
    fleet: Fleet, spec: BotSpec, posts: JsonlWriter, fds: JsonlWriter, i: int, kind: str
) -> str:
    ctx = fleet.ctx
    assert spec.bot is not None
    text = ctx.payload(f"fleet {spec.label} {kind} {i:04d}")
    sent = time.monotonic()
    reply, _ = await spec.bot.send(text, ctx.scale.bound(30, floor=15))
    done = time.monotonic()
    posts.write("post", i=i, kind=kind, text=text, sent=sent, done=done, reply=reply)
    fds.write("fds", stage=kind, fds=spec.bot.fd_count())
    return reply


async def _worker(fleet: Fleet, spec: BotSpec) -> None:
    """One bot's whole life: its link, its process, its posts at its own pace."""
    from faultnet import open_proxy

    ctx = fleet.ctx
    env = ctx.env
    starting = True  # holding a place among the bots starting (STARTING_AT_ONCE)
    await fleet.starting.acquire()
    try:
        async with (
            open_proxy(
                (env.host, int(env.port)),
                name=spec.label,
                event_log=str(ctx.run_dir / "proxies.jsonl"),
                seed=ctx.seed,
            ) as proxy,
            ctx.bot(spec.nick, spec.token, spec.label, via=proxy) as bot,
        ):
            spec.proxy, spec.bot = proxy, bot
            spec.link = f"{proxy.address[0]}:{proxy.address[1]}"
            await ctx.connected(bot)
            fleet.starting.release()
            starting = False
            await _workload(fleet, spec, bot)
    finally:
        if starting:
            fleet.starting.release()


async def _workload(fleet: Fleet, spec: BotSpec, bot: BotHandle) -> None:
    """Post at the bot's own pace until told to stop; then the roll call."""
    ctx = fleet.ctx
    bot_dir = ctx.run_dir / "bots" / spec.label
    with (
        JsonlWriter(bot_dir / "posts.jsonl", bot=spec.label) as posts,
        JsonlWriter(bot_dir / "fds.jsonl", bot=spec.label) as fds,
    ):
        await ctx.countdown(ctx.scale.real("settle"), "settle", quiet=True)
        fds.write("fds", stage="baseline", fds=bot.fd_count())
        fleet.ready.release()
        await fleet.go.wait()
        i = 0
        while not fleet.stop_posting.is_set():
            i += 1
            await _post(fleet, spec, posts, fds, i, "post")
            with trio.move_on_after(spec.pace):
                await fleet.stop_posting.wait()
        # Roll call: once every fault has ended, post until a post is claimed (a
        # bot still reconnecting says UNCONFIRMED); the verifier bounds how long.
        await fleet.roll_call.wait()
        deadline = time.monotonic() + ctx.args.liveness_bound
        while True:
            i += 1
            reply = await _post(fleet, spec, posts, fds, i, "roll_call")
            if claims_delivery(reply):
                break
            if time.monotonic() >= deadline:
                break
            await trio.sleep(min(spec.pace, 0.5))
        fleet.rolled += 1
        await fleet.finish.wait()
        fds.write("fds", stage="final", fds=bot.fd_count())


async def run(ctx: Context) -> None:
    """The runner's one attempt (called by :func:`harness.runner.run_attempt`)."""
    args, s = ctx.args, ctx.scale
    r = ctx.result
    labels = _labels(args.bots)
    plan = make_plan(args.plan_config, ctx.seed)  # validated before anything started
    if args.plan_document is not None:
        (ctx.run_dir / "chaos-plan.json").write_text(json.dumps(args.plan_document, indent=2))
    plan_json = slots_json(plan)
    attempted = sum(1 for sl in plan.slots if sl.skip is None)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "status": "running",
        "mode": args.mode,
        "seed": ctx.seed,
        "time_scale": s.factor,
        "bot_argv": ctx.bot_argv,
        "defect": args.control_defect if args.mode == "control" else None,
        "files": {"faults": "faults.jsonl", "observer": "observer.jsonl"},
        "timing": {
            "confirm_budget_s": s.real("confirm_budget"),
            "detection_window_s": s.detection_window,
            "liveness_bound_s": args.liveness_bound,
            "post_interval_s": s(POST_INTERVAL),
            "fd_tolerance": FD_TOLERANCE,
        },
        "planner": args.planner,
        "plan": plan_json,
        "bots": [],
    }
    _write_manifest(ctx.run_dir, manifest)
    async with ctx.leader(), contextlib.AsyncExitStack() as owners:
        specs = await _spawn_fleet(ctx, owners, labels)
        ctx.phase(f"{len(specs)} bots starting, each through its own proxy")
        fault_phase = await _drive(Fleet(ctx, specs), plan, attempted)
        manifest["bots"] = [
            {
                "label": sp.label,
                "nick": sp.nick,
                "owner": sp.owner,
                "link": sp.link,
                "pace_s": round(sp.pace, 4),
                **sp.files(),
            }
            for sp in specs
        ]
    manifest["timing"].update(fault_phase_mono=fault_phase)
    manifest["status"] = "complete"
    # observer.jsonl is written when the leader leaves, above: the manifest comes last.
    _write_manifest(ctx.run_dir, manifest)
    # The run's own controls: the workload ran. Whether it held is the verifier's call.
    applied = sum(
        1
        for rec in read_jsonl(ctx.run_dir / "faults.jsonl").records
        if rec["event"] in ("fault", "undo")
    )
    posted = {sp.label: len(read_jsonl(ctx.run_dir / sp.files()["posts"]).records) for sp in specs}
    idle = sorted(label for label, n in posted.items() if n < 2)
    r.check("every bot posted", not idle, f"posts per bot {posted}", role="control")
    r.check("faults were applied", applied > 0, f"{applied} fault actions applied", role="control")
    r.headline.update(
        {
            "bots": len(specs),
            "episodes": attempted,
            "fault actions applied": applied,
            "posts": sum(posted.values()),
        }
    )


async def _drive(fleet: Fleet, plan: Plan, attempted: int) -> list[float]:
    """Start the bots, run chaos's plan on their links while they post, then the roll
    call; returns the fault phase's [start, end] (CLOCK_MONOTONIC)."""
    ctx, specs, s, args = fleet.ctx, fleet.specs, fleet.ctx.scale, fleet.ctx.args
    async with trio.open_nursery() as nursery:
        for spec in specs:
            nursery.start_soon(_worker, fleet, spec)
        # Each bot's start (answered initialize, then connected) is bounded on its own;
        # they go STARTING_AT_ONCE at a time. The former 60 s + 3 s a bot ran out with
        # three runs side by side under stress-ng: 12.7-23.2 s a bot, one at a time.
        bound = math.ceil(len(specs) / STARTING_AT_ONCE) * (HANDSHAKE_TIMEOUT_S + ctx.connect_bound)
        started = 0
        try:
            with trio.fail_after(bound):
                for _ in specs:
                    await fleet.ready.acquire()
                    started += 1
        except trio.TooSlowError:
            raise RunProblem(
                f"{started} of {len(specs)} bots started and connected within {bound:.0f} s"
            ) from None
        ctx.phase(f"posting; {attempted} {args.planner} faults over {s(args.fault_phase):.3g} s")
        fault_start = time.monotonic()
        fleet.go.set()
        await _run_chaos(ctx, plan, specs)
        fault_end = time.monotonic()
        ctx.phase("every fault has ended; posting on until the bots are back")
        await ctx.countdown(min(args.liveness_bound, s(POST_INTERVAL) * 3), "recovery", quiet=True)
        fleet.stop_posting.set()
        fleet.roll_call.set()
        ctx.phase("roll call: every bot posts until one post is confirmed")
        # Late deliveries (held bytes a thaw released) and the roll calls arrive.
        await ctx.countdown(
            args.liveness_bound + s.bound(30, floor=5),
            "roll call",
            until=lambda: fleet.rolled == len(specs),
            quiet=True,
        )
        await ctx.countdown(s.bound(10, floor=2), "late deliveries", quiet=True)
        fleet.finish.set()
    return [fault_start, fault_end]


def _labels(bots: int) -> list[str]:
    return [f"w{i:02d}" for i in range(1, bots + 1)]


async def _spawn_fleet(
    ctx: Context, owners: contextlib.AsyncExitStack, labels: list[str]
) -> list[BotSpec]:
    """Mint one owner per two workers, connect each owner's leader, spawn its workers."""
    from drivers import irc
    from harness import enclave

    env = ctx.env
    specs: list[BotSpec] = []
    for k in range(math.ceil(len(labels) / WORKERS_PER_OWNER)):
        owner = unique_nick("fo")
        token = await trio.to_thread.run_sync(_mint_owner, env.state_dir, owner)
        leader = await owners.enter_async_context(
            irc.open_observer(env.host, int(env.port), owner, None, sasl=(owner, token))
        )
        mine = labels[k * WORKERS_PER_OWNER : (k + 1) * WORKERS_PER_OWNER]
        for label in mine:
            nick = unique_nick(f"f{label}")
            expires = int(ctx.scale.bound(3600, floor=600))
            try:
                wtoken = await enclave.spawn_worker(leader, nick, expires)
            except Exception as exc:
                raise RunProblem(f"owner {owner}: spawn {nick} failed: {exc}") from exc
            ctx.log.write("spawned", nick=nick, owner=owner, label=label)
            # Negative counters: the plan's draws count up from 0, a bot's pace is its own.
            index = len(specs) + 1
            pace = ctx.scale(POST_INTERVAL) * (0.6 + 0.8 * draw(ctx.seed, -index))
            specs.append(BotSpec(label, nick, wtoken, owner, pace))
        owners.push_async_callback(_revoke, ctx, leader, specs[-len(mine) :])
    return specs


async def _run_chaos(ctx: Context, plan: Plan, specs: list[BotSpec]) -> None:
    """Run *plan* with faultnet chaos's runner on the fleet's proxies; its join log is
    the run's faults.jsonl. Armed on purpose: the run directory holds the marker."""
    marker = ctx.run_dir / ".faultnet-chaos-armed"
    marker.touch()
    log = JoinLog(ctx.run_dir / "faults.jsonl", seed=ctx.seed, dry=False)
    try:
        result = await Runner(
            plan,
            log,
            proxies={sp.label: sp.proxy for sp in specs},
            armed=True,
            marker=marker,
            time_unit=ctx.scale.factor,
        ).run()
    finally:
        log.close()
    ctx.log.write("chaos_end", counts=result.counts, not_undone=result.not_undone)


def _mint_owner(state_dir: Path, owner: str) -> str:
    """A new owner and its leader in the environment's registry (SQLite: one thread)."""
    from harness.enclave import Registry

    registry = Registry(state_dir)
    try:
        return registry.mint_leader(owner)
    finally:
        registry.close()


async def _revoke(ctx: Context, leader: Any, specs: list[BotSpec]) -> None:
    from harness import enclave

    with trio.CancelScope(shield=True):
        for spec in specs:
            with trio.move_on_after(5):
                try:
                    await enclave.revoke_worker(leader, spec.nick)
                    ctx.log.write("revoked", nick=spec.nick)
                except Exception as exc:  # best effort: the run is over either way
                    ctx.log.write("revoke_failed", nick=spec.nick, error=str(exc))


def _write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(tmp, run_dir / MANIFEST)  # the verifier never sees half a manifest


# --------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        # The package's docstring is the fleet's manual (read now: it imports this module).
        description=importlib.import_module("harness.fleet").__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mode", choices=MODES, default="main", help="main (default), storm, control")
    p.add_argument("--bots", type=int, default=12, metavar="N", help="bots in the fleet (12)")
    p.add_argument("--bot-bin", metavar="CMD", help="the bot under test (default $BOT_BIN)")
    envg = p.add_mutually_exclusive_group()
    envg.add_argument("--state", type=Path, metavar="DIR", help="use the environment in DIR")
    envg.add_argument("--env", choices=["auto"], help="bring up a private environment")
    p.add_argument("--time-scale", metavar="F", help="scale every timing by F (default 1.0)")
    p.add_argument("--seed", type=int, metavar="S", help="the fault plan's seed")
    p.add_argument(
        "--fault-phase",
        type=float,
        default=FAULT_PHASE,
        metavar="S",
        help=f"seconds of faults at time scale 1.0 ({FAULT_PHASE:g})",
    )
    p.add_argument(
        "--control-defect",
        default=CONTROL_DEFECT,
        metavar="NAME",
        help=f"the control's bot defect ({CONTROL_DEFECT}); 'none' runs the control with "
        "fixed bots, which the verifier must reject (a control that loses nothing)",
    )
    p.add_argument(
        "--planner",
        choices=("episodes", "chaos"),
        default="episodes",
        help="episodes (default: outages that end in a thaw or a torn connection) or "
        "chaos (the link faults at faultnet chaos's own weights); chaos plans either",
    )
    p.add_argument(
        "--chaos-plan",
        type=Path,
        metavar="FILE",
        help="a faultnet chaos plan file instead of the --planner's plan (checked first)",
    )
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="where the run keeps its records")
    p.add_argument("--verify", action="store_true", help="run harness.fleet_verify after")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON line on stdout (the run; with --verify, the verdict); progress to stderr",
    )
    return p


def _checked(args: argparse.Namespace) -> tuple[list[str], TimeScale]:
    """The bot's argv and the time scale, every argument checked and the plan made ready
    (``args.plan_config``), before anything starts: a bad ``--chaos-plan`` is a usage
    error, not a run that brought the environment up and then failed. Raises
    CommandError (or ValueError, from the time scale)."""
    bot_argv = resolve_bot_argv(args.bot_bin)
    scale = time_scale_from(args.time_scale)
    if args.bots < 1:
        raise UsageError("--bots must be at least 1")
    if not (0 < args.fault_phase < math.inf):
        raise UsageError("--fault-phase must be a positive number of seconds")
    try:
        args.plan_config, args.plan_document = fleet_config(
            _labels(args.bots), args.mode, args.planner, args.fault_phase, args.chaos_plan
        )
    except PlanError as exc:
        raise UsageError(f"--chaos-plan {args.chaos_plan}: {exc}") from None
    if args.mode == "control" and args.control_defect != "none":
        bot_argv = [*bot_argv, "--defect", args.control_defect]
    # Liveness: a bot whose link died undetected needs its detection window, then its
    # reconnect back-off ceiling, then a post's confirmation; plus slack for start-ups.
    args.liveness_bound = round(
        scale.detection_window
        + scale.real("reconnect_max")
        + 2 * scale.real("confirm_budget")
        + scale.bound(10, floor=2),
        3,
    )
    return bot_argv, scale


async def amain(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        bot_argv, scale = _checked(args)
    except (CommandError, ValueError) as exc:
        return fail(PROG, exc)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    run_dir = args.run_dir or default_run_dir("fleet")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ".probe").touch()
        (run_dir / ".probe").unlink()
    except OSError as exc:
        return fail(PROG, EnvironmentProblem(f"cannot write the run directory {run_dir}: {exc}"))
    out = sys.stderr if args.json else sys.stdout
    res = await run_attempt(
        sys.modules[__name__],
        args,
        bot_argv=bot_argv,
        scale=scale,
        seed=seed,
        run_dir=run_dir,
        out=out,
    )
    print(
        f"fleet run ({args.mode}, seed {seed}): {'complete' if res.error is None else res.error}",
        file=out,
    )
    if res.error is not None:
        code = EXIT_ENV if res.error_kind == "environment" else 1
        if code == EXIT_ENV and args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing ran: nothing to keep
            run_dir = None
    else:
        code = await _verify_and_report(args, run_dir, out)
    if args.json and not args.verify:
        doc = {
            "run_dir": str(run_dir) if run_dir else None,
            "mode": args.mode,
            "seed": seed,
            "complete": res.error is None,
            "error": res.error,
        }
        print(json.dumps(doc))
    print(run_dir if run_dir else "no run directory kept", file=out)
    return code


async def _verify_and_report(args: argparse.Namespace, run_dir: Path, out: Any) -> int:
    """After a complete run: the verifier (with --verify; its exit code), the report."""
    code = EXIT_OK
    if args.verify:
        # The verdict is also kept in the run directory (verdict.json) for the report.
        cmd = [sys.executable, "-m", "harness.fleet.verify", str(run_dir)]
        cmd += ["--out", str(run_dir / "verdict.json")] + (["--json"] if args.json else [])
        code = (await trio.run_process(cmd, check=False)).returncode
    await _build_report(run_dir, out)
    return code


async def _build_report(run_dir: Path, out: Any) -> None:
    """Hook for harness.report: draw the run's timeline and report.html when it exists."""
    if importlib.util.find_spec("harness.report") is None:
        return
    cmd = [sys.executable, "-m", "harness.report", str(run_dir)]
    try:
        with trio.fail_after(120):
            done = await trio.run_process(
                cmd, check=False, capture_stdout=True, capture_stderr=True
            )
    except (OSError, trio.TooSlowError) as exc:
        print(f"report: {shlex.join(cmd)} failed: {exc!r}", file=out)
        return
    # Exit 1 is a report built that shows a failed check (a control run's, as it must):
    # its path, as for 0. Only 2 (nothing could be drawn) is the command's failure.
    if done.returncode in (0, 1):
        for line in done.stdout.decode(errors="replace").splitlines():
            if line.startswith("report: "):
                print(line, file=out)
        return
    tail = (done.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
    print(f"report: {shlex.join(cmd)} exited {done.returncode}: {tail}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    """The fleet command, under a supervisor: nothing it starts outlives it, even killed
    with SIGKILL (:func:`harness.runner.supervised`)."""
    return supervised(functools.partial(trio.run, cancel_on_signals, amain, argv))
