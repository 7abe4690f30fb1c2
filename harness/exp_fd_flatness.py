"""fd_flatness: do the failure paths leak file descriptors?

Counts the worker's open descriptors (``/proc/PID/fd`` of the process BOT_BIN started; a
wrapper must exec the bot) at each stage:

  connect    after it connected and settled: the baseline (the internal control)
  posts      after POSTS confirmed posts (the confirmation path)
  outage     after posts into a frozen link (45 s of them, one every 5 s, scaled)
  reconnect  after the bot's own detection and reconnect, then the link thawed
  cycles     after CYCLES reconnects in all: the rest are forced by severing the link
             (clean FIN), which exercises the same reconnect path in milliseconds

A leak of one descriptor per reconnect is within the one-descriptor tolerance after one
reconnect; over three it is not, which is why the target check is scored after all
CYCLES. Controls make sure the paths were really exercised: every healthy post confirmed,
every reconnect happened, and the first followed the bot's OWN detection (pong_timeout).
"""

from __future__ import annotations

import argparse
import sys
import time

from faultnet.cliargs import plain
from faultnet.errors import EnvironmentProblem
from harness import runner
from harness.experiment import Context, first_after, freeze_held, freeze_worker, rel

NAME = "fd_flatness"
DESCRIPTION = plain(__doc__)
#: 40 posts + 45 s outage + 90 s detection + reconnects, at time scale 1.0.
MAX_REAL_S = 400.0
#: Descriptors a stage may differ from the baseline by (lazy one-off allocations).
TOLERANCE = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--posts", type=int, default=40, metavar="N", help="healthy posts (40)")
    p.add_argument(
        "--cycles",
        type=int,
        default=3,
        metavar="K",
        help="reconnects in all: one after a freeze, K-1 after a sever (3)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    if args.posts < 1:
        raise ValueError("--posts must be at least 1")
    if args.cycles < 1:
        raise ValueError("--cycles must be at least 1")


async def run(ctx: Context) -> None:
    r = ctx.result
    s = ctx.scale
    call_bound = s.bound(30, floor=15)
    back_bound = s.bound(s.detection_window + s.real("reconnect_max") + 30, floor=8)
    counts: dict[str, int | None] = {}
    async with ctx.leader() as obs, ctx.proxy() as proxy:
        async with ctx.worker(obs, proxy, "fd") as w:

            def count(stage: str) -> int | None:
                n = w.fd_count()
                counts[stage] = n
                ctx.say(f"   fds {stage:<10} {n}")
                ctx.log.write("fd_count", stage=stage, fds=n)
                return n

            if count("connect") is None:
                raise EnvironmentProblem(f"cannot read /proc/{w.drv.pid}/fd on this host")

            ctx.phase(f"{ctx.args.posts} healthy posts (the confirmation path)")
            before = len(w.events("post_confirm"))
            for i in range(1, ctx.args.posts + 1):
                await w.send(ctx.payload(f"fd probe healthy {i:03d}"), call_bound)
            # Confirmed by the bot's own log: a "skipped" confirmation (no wait at all)
            # would not have exercised the path this stage is about.
            confirmed = sum(
                1 for e in w.events("post_confirm")[before:] if e.get("result") == "confirmed"
            )
            count("posts")

            rec = await freeze_worker(
                ctx, obs, w, proxy, "freezing the worker's link; posting into the dead link"
            )
            outage_s, every = s.scenario(45.0), s.scenario(5.0)
            outage_posts = 0
            while time.monotonic() - rec.mono < outage_s:
                outage_posts += 1
                await w.send(ctx.payload(f"fd probe outage {outage_posts:03d}"), call_bound)
                await ctx.countdown(every, "next post", quiet=True)
            count("outage")
            held, held_detail = freeze_held(proxy, rec)

            ctx.phase("waiting for the worker's own detection and reconnect")
            ev = await w.wait_event("reconnected", back_bound, after_mono=rec.mono)
            own = first_after(w.events("pong_timeout"), rec.mono)
            await proxy.thaw("both")
            reconnects = 0
            if ev is not None:
                reconnects = 1
                ctx.say(
                    f"   own detection t+{rel(own, rec.mono)} s, reconnected "
                    f"t+{rel(float(ev['mono']), rec.mono)} s"
                )
                await ctx.countdown(s.real("settle"), "the worker settles")
                count("reconnect")
                for k in range(2, ctx.args.cycles + 1):
                    ctx.phase(f"reconnect {k}/{ctx.args.cycles}: severing the link")
                    t_sever = time.monotonic()
                    await proxy.sever()
                    if await w.wait_event("reconnected", back_bound, after_mono=t_sever) is None:
                        break
                    reconnects += 1
                    await ctx.countdown(s.real("settle"), "the worker settles")
                count("cycles")
            else:
                ctx.say("   the worker never reconnected")

    base = counts.get("connect")

    def says(stage: str, what: str) -> str:
        v, d = counts.get(stage), stage_delta(counts, stage)
        if v is None or d is None:
            return f"not measured ({what} did not happen)"
        return f"{base} -> {v} (delta {d:+d}) {what}"

    r.headline.update(
        {
            "fds after connect": base,
            f"fds after {ctx.args.posts} confirmed posts": counts.get("posts"),
            f"fds after {outage_posts} posts into a dead link": counts.get("outage"),
            "fds after detect + reconnect": counts.get("reconnect"),
            f"fds after {reconnects} reconnects": counts.get("cycles"),
            "own detection t+ s": rel(own, rec.mono),
        }
    )
    r.details["fd_counts"] = counts
    r.check(
        "the confirmation path was exercised",
        confirmed == ctx.args.posts,
        f"{confirmed}/{ctx.args.posts} healthy posts confirmed",
        role="control",
    )
    r.check("the freeze held during the outage posts", held, held_detail, role="control")
    r.check(
        "the reconnect path was exercised, first by the bot's own detection",
        reconnects == ctx.args.cycles and own is not None,
        f"{reconnects}/{ctx.args.cycles} reconnects; own PONG timeout "
        + ("yes" if own is not None else "NO"),
        role="control",
    )
    r.check(
        "fd count flat across the confirmation path",
        is_flat(counts, "posts"),
        says("posts", f"over {ctx.args.posts} posts"),
    )
    r.check(
        "fd count flat across posts into a dead link",
        is_flat(counts, "outage"),
        says("outage", f"over {outage_posts} posts"),
    )
    r.check(
        "fd count flat across detection and reconnects",
        is_flat(counts, "cycles"),
        says("cycles", f"over {reconnects} reconnects (tolerance {TOLERANCE})"),
        role="target",
    )
    r.control("fds after connect", None if base is None else float(base), "fds", TOLERANCE)


def stage_delta(counts: dict[str, int | None], stage: str) -> int | None:
    """Descriptors at *stage* minus at "connect"; None if either was not measured."""
    base, v = counts.get("connect"), counts.get(stage)
    return None if v is None or base is None else v - base


def is_flat(counts: dict[str, int | None], stage: str, tolerance: int = TOLERANCE) -> bool:
    """Was *stage* measured, and within *tolerance* descriptors of the baseline?"""
    d = stage_delta(counts, stage)
    return d is not None and abs(d) <= tolerance


amain, main = runner.commands(__name__)


if __name__ == "__main__":
    sys.exit(main())
