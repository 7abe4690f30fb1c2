"""The fleet soak: N reference bots posting at once, each through its own faultnet link,
while a seeded schedule of faults runs on those links.

    python -m harness.fleet --env auto [--mode main|storm|control] [--bots 12]
        [--time-scale F] [--seed S] [--run-dir DIR] [--verify]
    python -m harness.fleet_verify RUN_DIR

The run only RECORDS; :mod:`harness.fleet_verify` judges, and the two share nothing but
the run directory, whose ``manifest.json`` names every file (the runner prints the run
directory as its last line). What the run directory holds:

* ``manifest.json``: mode, seed, time scale, the timings the verifier bounds by, one entry
  per bot (label, nick, owner, link address, the files below), ``status``;
* ``faults.jsonl``: one line per fault decision, in the shape ``faultnet chaos`` writes
  (``ts``, ``seed``, ``counter``, ``action``, ``target``, ``detail``, ``dry``) plus
  ``mono`` (CLOCK_MONOTONIC, the clock every bot stamps its events with) and ``outcome``;
* ``bots/LABEL/posts.jsonl``: every post the workload made, written by the task that
  drove the bot: the text, ``sent``/``done`` monotonic stamps, the bot's reply verbatim;
* ``bots/LABEL/fds.jsonl``: the bot's descriptor count, sampled after every post;
* ``LABEL.stderr``: the bot's stderr (its own BOTEVENT transport events);
* ``calls/LABEL/``: the drivers.mcp call record of every MCP request to that bot;
* ``observer.jsonl``: the transcript of the observer (the leader, on a direct link);
* ``verdict.json``: with ``--verify``, the verifier's verdict.

Topology: owners are minted in the environment's registry (the enclave allows 3 live
bots per owner, the leader counting), each owner's leader connects and spawns two
workers; every worker gets its own in-process :class:`faultnet.Proxy`. The observer is
the environment's leader, on a direct link, so nothing a fault does reaches it.

Faults. ``--planner chaos`` hands the links to ``faultnet chaos`` (its planner, runner
and join log; ``--chaos-plan FILE`` tunes its catalogue). The default planner,
``episodes``, draws with chaos's draws (``sha256("<seed>:<counter>")``) but plans what
chaos's catalogue has no entry for, and what the control needs to be able to lose a post:
an *episode* takes one link down and ends it one of two ways, or is one instant fault:

* ``freeze`` or ``blackhole`` then ``thaw``: an outage the link recovers from (held bytes
  are delivered late);
* ``freeze`` then ``sever``, ``blackhole`` then ``reset``: an outage that ends with the
  connection torn down, so what was held is lost -- the case a post that claimed
  delivery without confirmation turns into silent loss;
* ``sever`` or ``reset`` alone.

The ending acts only on the connections the episode took down (``only=``): a bot that
reconnected meanwhile keeps its new link. Modes: ``main`` (episodes on random links,
never two at once on one link), ``storm`` (waves in which every link goes down at the
same instant), ``control`` (main's workload and schedule with ``--defect no-confirm``
bots, which must lose posts; see the verifier).

Exit codes: 0 the run completed (with ``--verify``: the verifier's code), 1 the run could
not do its job (a bot never connected), 2 usage or environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from faultnet.chaos import Draws, draw
from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail
from faultnet.eventlog import JsonlWriter, read_jsonl
from harness._contract import claims_delivery
from harness._report import EXIT_ENV, EXIT_OK
from harness._runner import (
    BotHandle,
    Context,
    RunProblem,
    cancel_on_signals,
    default_run_dir,
    resolve_bot_argv,
    run_attempt,
    unique_nick,
)
from harness._timescale import TimeScale, time_scale_from

__all__ = ["MODES", "Episode", "main", "plan_faults"]

NAME = "fleet"
DESCRIPTION = __doc__
PROG = "python -m harness.fleet"
MODES = ("main", "storm", "control")
CONTROL_DEFECT = "no-confirm"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "faultnet-fleet/1"
WORKERS_PER_OWNER = 2  # the enclave's quota is 3 per owner and the leader counts

#: Scenario timings in seconds at time scale 1.0 (the bot's own are in _timescale.REAL).
POST_INTERVAL = 5.0  # a bot's mean gap between posts; each bot's own pace is 0.6-1.4x
FAULT_PHASE = 240.0  # how long the schedule runs
OUTAGE = (8.0, 120.0)  # an outage episode's length: either side of the 90 s detection
GAP = (4.0, 16.0)  # main: between episode starts (on any link)
STORM_WAVES = 3
#: Bots starting at once. A reference bot spends 1.7 s of CPU importing the MCP SDK (5 s
#: of wall time on a 2-core machine at load 9): four at once (two fleets of two) missed
#: the driver's 30 s initialize bound at load 12, so bots start one after another, each
#: as soon as the one before it has connected.
STARTING_AT_ONCE = 1
#: Descriptor drift allowed per bot between its baseline and its final count.
FD_TOLERANCE = 1
#: How much longer than the fault phase the attempt may take at time scale 1.0.
MAX_REAL_S = FAULT_PHASE + 400.0

# Episode kinds: (down action or None, ending action), weights for main/control.
EPISODES: dict[str, tuple[tuple[str | None, str], float]] = {
    "freeze-thaw": (("freeze", "thaw"), 2.0),
    "freeze-sever": (("freeze", "sever"), 2.0),
    "blackhole-thaw": (("blackhole", "thaw"), 1.0),
    "blackhole-reset": (("blackhole", "reset"), 1.0),
    "sever": ((None, "sever"), 1.0),
    "reset": ((None, "reset"), 1.0),
}
LOSSY = ("freeze-sever", "blackhole-reset")


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Episode:
    """One fault on one link: ``down`` at ``start`` then ``end`` after ``duration``
    (scenario seconds, already scaled); ``down`` None is an instant fault."""

    counter: int
    kind: str
    target: str
    start: float
    duration: float
    down: str | None
    end: str
    wave: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "counter": self.counter,
            "kind": self.kind,
            "target": self.target,
            "start_s": round(self.start, 4),
            "duration_s": round(self.duration, 4),
            "down": self.down,
            "end": self.end,
            "wave": self.wave,
        }


def plan_faults(
    seed: int, targets: Sequence[str], mode: str, scale: TimeScale, phase: float = FAULT_PHASE
) -> tuple[list[Episode], list[dict[str, Any]]]:
    """The whole schedule, computed before anything is touched: episodes sorted by
    start, and the planner's own decisions (skips, a forced kind) as records.

    Pure: the same seed, targets, mode and scale give the same plan.
    """
    kinds = [(k, weight) for k, (_, weight) in EPISODES.items()]
    draws = Draws(seed)  # faultnet chaos's draws: sha256("<seed>:<counter>")
    notes: list[dict[str, Any]] = []

    def span(lo_hi: tuple[float, float]) -> float:
        return scale(draws.uniform(*lo_hi))

    episodes: list[Episode] = []
    end_of_phase = scale(phase)
    if mode == "storm":
        wave_gap = end_of_phase / STORM_WAVES
        for wave in range(STORM_WAVES):
            start = wave * wave_gap + scale(GAP[0])
            for target in targets:
                counter = draws.counter  # an episode is named by its first draw, as in chaos
                kind = draws.weighted(kinds)
                down, end = EPISODES[kind][0]
                dur = min(span(OUTAGE), 0.8 * wave_gap) if down else 0.0
                episodes.append(Episode(counter, kind, target, start, dur, down, end, wave))
        return episodes, notes
    free_at = dict.fromkeys(targets, 0.0)
    t = scale(GAP[0])
    while t < end_of_phase:
        counter = draws.counter
        target = draws.choice(targets)
        kind = draws.weighted(kinds)
        down, end = EPISODES[kind][0]
        dur = span(OUTAGE) if down else 0.0
        if free_at[target] > t:
            notes.append(
                {
                    "counter": counter,
                    "action": "skip",
                    "target": target,
                    "kind": kind,
                    "reason": "the link is still in an earlier episode",
                }
            )
        else:
            episodes.append(Episode(counter, kind, target, t, dur, down, end))
            # A link gets a breath after an episode, to reconnect and post again.
            free_at[target] = t + dur + scale(GAP[0])
        t += span(GAP)
    # The control must be able to lose: a schedule without one long-enough lossy outage
    # would let it pass, and a passing control says nothing about the main case.
    long_enough = 3 * scale(POST_INTERVAL)
    if episodes and not any(e.kind in LOSSY and e.duration >= long_enough for e in episodes):
        first = episodes[0]
        dur = max(first.duration, long_enough)
        episodes[0] = Episode(
            first.counter, "freeze-sever", first.target, first.start, dur, "freeze", "sever"
        )
        notes.append(
            {
                "counter": first.counter,
                "action": "force",
                "target": first.target,
                "kind": "freeze-sever",
                "reason": "no lossy outage of 3 post intervals was drawn; the control needs one",
            }
        )
    return episodes, notes


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
    faults: JsonlWriter
    ready: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(0))
    starting: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(STARTING_AT_ONCE))
    go: trio.Event = field(default_factory=trio.Event)
    stop_posting: trio.Event = field(default_factory=trio.Event)
    finish: trio.Event = field(default_factory=trio.Event)
    roll_call: trio.Event = field(default_factory=trio.Event)
    rolled: int = 0  # bots done with their roll call


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _log_fault(fleet: Fleet, counter: int, action: str, target: str, **detail: Any) -> None:
    wall = time.time()
    fleet.faults.write(
        "fault",
        ts=_iso(wall),
        seed=fleet.ctx.seed,
        counter=counter,
        action=action,
        target=target,
        detail=detail,
        dry=False,
        outcome=detail.pop("outcome", "applied"),
    )


async def _run_episode(fleet: Fleet, ep: Episode, t0: float) -> None:
    proxy = next(s for s in fleet.specs if s.label == ep.target).proxy
    await trio.sleep_until(t0 + ep.start)

    async def act(action: str, only: list[int] | None, **detail: Any) -> list[int]:
        # "began" is when the call started (effects are looked for from there; for an
        # ending, the outage lasted until then); the record itself is written once the
        # call has returned, when the fault is total.
        before = sorted(c.id for c in proxy.connections())
        began = time.monotonic()
        n = await proxy.apply(action, only=only)
        taken = only if only is not None else before
        if action in ("freeze", "blackhole"):
            taken = sorted(set(before) & {c.id for c in proxy.connections()})
        _log_fault(
            fleet,
            ep.counter,
            action,
            ep.target,
            episode=ep.kind,
            conns=taken,
            acted_on=n,
            began=began,
            **detail,
        )
        return taken

    if ep.down is None:
        await act(ep.end, None)
        return
    taken = await act(ep.down, None, planned_duration_s=round(ep.duration, 4))
    await trio.sleep(ep.duration)
    if taken:
        await act(ep.end, taken, ends=ep.down)
    else:
        _log_fault(
            fleet,
            ep.counter,
            ep.end,
            ep.target,
            episode=ep.kind,
            conns=[],
            outcome="skipped",
            reason="the outage took down no connection",
        )


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
    """The runner's one attempt (called by :func:`harness._runner.run_attempt`)."""
    args, s = ctx.args, ctx.scale
    r = ctx.result
    labels = [f"w{i:02d}" for i in range(1, args.bots + 1)]
    chaos_plan = None
    if args.planner == "chaos":
        chaos_plan = _chaos_plan(ctx, labels)
        episodes, notes = [], []
        plan_json = [
            {
                "counter": sl.counter,
                "fault": sl.fault,
                "target": sl.target,
                "at_units": sl.at,
                "duration_units": sl.duration,
                "skip": sl.skip,
            }
            for sl in chaos_plan.slots
        ]
    else:
        episodes, notes = plan_faults(ctx.seed, labels, args.mode, s, args.fault_phase)
        plan_json = [e.to_json() for e in episodes]
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
    with JsonlWriter(ctx.run_dir / "faults.jsonl") as faults:
        for note in notes:
            faults.write(
                "fault",
                ts=_iso(time.time()),
                seed=ctx.seed,
                dry=False,
                outcome="skipped" if note["action"] == "skip" else "planned",
                detail={"kind": note["kind"], "reason": note["reason"]},
                **{k: note[k] for k in ("counter", "action", "target")},
            )
        async with ctx.leader(), contextlib.AsyncExitStack() as owners:
            specs = await _spawn_fleet(ctx, owners, labels)
            fleet = Fleet(ctx, specs, faults)
            ctx.phase(f"{len(specs)} bots starting, each through its own proxy")
            async with trio.open_nursery() as nursery:
                for spec in specs:
                    nursery.start_soon(_worker, fleet, spec)
                with trio.fail_after(s.bound(60, floor=60 + 3 * len(specs))):
                    for _ in specs:
                        await fleet.ready.acquire()
                ctx.phase(
                    f"posting; {len(plan_json)} {args.planner} faults over "
                    f"{s(args.fault_phase):.3g} s"
                )
                t0 = trio.current_time()
                fault_start = time.monotonic()
                fleet.go.set()
                if chaos_plan is not None:
                    await _run_chaos(ctx, chaos_plan, specs)
                else:
                    async with trio.open_nursery() as chaos:
                        for ep in episodes:
                            chaos.start_soon(_run_episode, fleet, ep, t0)
                fault_end = time.monotonic()
                ctx.phase("every fault has ended; posting on until the bots are back")
                await ctx.countdown(
                    min(args.liveness_bound, s(POST_INTERVAL) * 3), "recovery", quiet=True
                )
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
    manifest["timing"].update(fault_phase_mono=[fault_start, fault_end])
    manifest["status"] = "complete"
    # observer.jsonl is written when the leader leaves, above: the manifest comes last.
    _write_manifest(ctx.run_dir, manifest)
    # The run's own controls: the workload ran. Whether it held is the verifier's call.
    applied = sum(
        1
        for rec in read_jsonl(ctx.run_dir / "faults.jsonl").records
        # chaos's join log says "fault"/"undo" for what it did; this planner says outcome
        if rec.get("outcome", "applied" if rec["event"] in ("fault", "undo") else "") == "applied"
    )
    posted = {sp.label: len(read_jsonl(ctx.run_dir / sp.files()["posts"]).records) for sp in specs}
    idle = sorted(label for label, n in posted.items() if n < 2)
    r.check("every bot posted", not idle, f"posts per bot {posted}", role="control")
    r.check("faults were applied", applied > 0, f"{applied} fault actions applied", role="control")
    r.headline.update(
        {
            "bots": len(specs),
            "episodes": len(episodes),
            "fault actions applied": applied,
            "posts": sum(posted.values()),
        }
    )


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


#: The fleet's links are what chaos may touch; these are the faults a link has.
CHAOS_LINK_FAULTS = ("freeze", "blackhole", "sever", "reset")


def _chaos_plan(ctx: Context, labels: list[str]) -> Any:
    """faultnet chaos's plan for the fleet's links: its planner and draws, its catalogue
    (``--chaos-plan FILE`` tunes it; by default only the link faults, with the outage
    lengths above), time units of one second at time scale 1.0."""
    from faultnet.chaos import catalogue, load_config, make_plan

    path = ctx.args.chaos_plan
    if path is None:
        outage = {"duration": list(OUTAGE)}
        faults = {
            name: ({"weight": 0} if name not in CHAOS_LINK_FAULTS else {})
            | (outage if name in ("freeze", "blackhole") else {})
            for name in catalogue()
        }
        path = ctx.run_dir / "chaos-plan.json"
        path.write_text(json.dumps({"faults": faults}, indent=2))
    config = load_config(path, proxies=labels, duration=ctx.args.fault_phase, gap=GAP)
    return make_plan(config, ctx.seed)


async def _run_chaos(ctx: Context, plan: Any, specs: list[BotSpec]) -> None:
    """Run *plan* with faultnet chaos's runner on the fleet's proxies; its join log is
    the run's faults.jsonl. Armed on purpose: the run directory holds the marker."""
    from faultnet.chaos import JoinLog, Runner

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
        description=DESCRIPTION,
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
        "chaos (faultnet chaos's planner and runner on the links)",
    )
    p.add_argument(
        "--chaos-plan", type=Path, metavar="FILE", help="with --planner chaos: a chaos plan file"
    )
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="where the run keeps its records")
    p.add_argument("--verify", action="store_true", help="run harness.fleet_verify after")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON line on stdout (the run; with --verify, the verdict); progress to stderr",
    )
    return p


async def amain(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        bot_argv = resolve_bot_argv(args.bot_bin)
        scale = time_scale_from(args.time_scale)
        if args.bots < 1:
            raise UsageError("--bots must be at least 1")
        if not (args.fault_phase > 0):
            raise UsageError("--fault-phase must be positive")
    except (CommandError, ValueError) as exc:
        return fail(PROG, exc)
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
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    run_dir = args.run_dir or default_run_dir("fleet")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ".probe").touch()
        (run_dir / ".probe").unlink()
    except OSError as exc:
        return fail(PROG, EnvironmentProblem(f"cannot write the run directory {run_dir}: {exc}"))
    out = sys.stderr if args.json else sys.stdout
    module = sys.modules[__name__]
    res = await run_attempt(
        module,
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
        code = EXIT_OK
        if args.verify:
            # The verdict is also kept in the run directory (verdict.json) for the report.
            cmd = [sys.executable, "-m", "harness.fleet_verify", str(run_dir)]
            cmd += ["--out", str(run_dir / "verdict.json")] + (["--json"] if args.json else [])
            code = (await trio.run_process(cmd, check=False)).returncode
        await _build_report(run_dir, out)
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


async def _build_report(run_dir: Path, out: Any) -> None:
    """Hook for harness.report: draw the run's timeline and report.html when it exists."""
    import importlib.util

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
    if done.returncode != 0:
        tail = (done.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
        print(f"report: {shlex.join(cmd)} exited {done.returncode}: {tail}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    return trio.run(cancel_on_signals, amain, argv)


if __name__ == "__main__":
    sys.exit(main())
