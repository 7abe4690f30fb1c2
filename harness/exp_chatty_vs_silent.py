"""chatty_vs_silent: does a bot that keeps posting still detect that its link died?

A write succeeds into the local kernel whatever the peer is doing, so a bot whose
keepalive idle clock is refreshed by its own OUTBOUND traffic, and which posts more often
than its idle threshold, never PINGs and never notices a dead link: the busier, the
blinder.

Matched pair inside one run: two workers behind the SAME proxy, their idle clocks synced
by one observer line both must hear, frozen at the SAME instant, differing only in
whether they post:

  chatty  posts every 20 s (scaled; below the 60 s idle threshold)
  silent  says nothing -- the INTERNAL CONTROL: it must detect on its own keepalive at
          about idle + PONG timeout, and that time must not move between arms

Detection is the bot's OWN ``pong_timeout`` BOTEVENT. Reconnects are reported separately
and are never counted as detection: faultnet's freeze holds the server's FIN, so a
reconnect here should only ever follow the bot's own PONG timeout, and a control checks
exactly that. This experiment sits at the quota: leader + 2 workers.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio

from faultnet.cliargs import plain
from faultnet.errors import EnvironmentProblem
from harness import runner
from harness.experiment import (
    BotHandle,
    Context,
    RunProblem,
    claims_delivery,
    first_after,
    freeze_held,
    freeze_links,
    sync_inbound,
)

NAME = "chatty_vs_silent"
DESCRIPTION = plain(__doc__)
#: Watch window (200 s) + start-up and teardown, at time scale 1.0.
MAX_REAL_S = 300.0
WATCH_REAL_S = 200.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch",
        type=float,
        default=WATCH_REAL_S,
        metavar="S",
        help=f"how long to watch for detection, in real seconds before scaling ({WATCH_REAL_S:g})",
    )


def check_arguments(args: argparse.Namespace) -> None:
    if args.watch <= 0:
        raise ValueError("--watch must be positive")


async def run(ctx: Context) -> None:
    r = ctx.result
    s = ctx.scale
    window = s.detection_window
    # Watch at least twice the detection window so a worker that detects late, but does
    # detect, is told apart from one that never does.
    watch = max(s.scenario(ctx.args.watch), 2 * window)
    chat_every = s.real("chat_interval")
    call_bound = s.bound(30, floor=15)
    async with ctx.leader() as obs, ctx.proxy() as proxy:
        made: dict[str, tuple[str, str]] = {}
        for role in ("chatty", "silent"):
            made[role] = await ctx.spawn(obs, f"cv{role[0]}")
        ctx.phase(
            f"workers starting through the proxy: chatty={made['chatty'][0]} "
            f"silent={made['silent'][0]}"
        )
        bots: dict[str, BotHandle] = {}
        async with (
            ctx.bot(*made["chatty"], "chatty", via=proxy) as chatty,
            ctx.bot(*made["silent"], "silent", via=proxy) as silent,
        ):
            bots = {"chatty": chatty, "silent": silent}
            for b in bots.values():
                await ctx.connected(b)
            await ctx.countdown(s.real("settle"), "the workers settle")
            if await sync_inbound(ctx, obs, [chatty, silent]) is None:
                raise RunProblem("a worker never reported the observer's sync line")

            ctx.phase("freezing BOTH workers' links at the same instant")
            rec = await freeze_links(ctx, proxy)
            if rec.count < 2:
                raise EnvironmentProblem(f"expected 2 live links to freeze, found {rec.count}")
            t0 = rec.mono
            posts: list[dict] = []
            detect: dict[str, float | None] = {"chatty": None, "silent": None}

            async def chatter() -> None:
                while True:
                    i = len(posts) + 1
                    at = time.monotonic() - t0
                    res, wall = await chatty.send(
                        ctx.payload(f"chatty milestone {i:02d}"), call_bound
                    )
                    posts.append(
                        {"i": i, "at": round(at, 3), "claimed": claims_delivery(res), "result": res}
                    )
                    ctx.log.write("chatty_post", i=i, at=at, result=res)
                    await trio.sleep(chat_every)

            def both_detected() -> bool:
                for role, b in bots.items():
                    if detect[role] is None:
                        ev = first_after(b.events("pong_timeout"), t0)
                        if ev is not None:
                            detect[role] = ev - t0
                            ctx.say(f"   {role}: its own PONG timeout at t+{detect[role]:.2f} s")
                return all(v is not None for v in detect.values())

            ctx.phase(
                f"chatty posts every {chat_every:.3g} s; watching up to {watch:.3g} s for each "
                "worker's OWN detection"
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(chatter)
                await ctx.countdown(watch, "own detection (pong_timeout)", until=both_detected)
                nursery.cancel_scope.cancel()
            both_detected()
            held, held_detail = freeze_held(proxy, rec)

            ctx.phase("reconnects (reported separately: NOT the same claim as detection)")
            rescue: dict[str, float | None] = {}
            for role, b in bots.items():
                if detect[role] is not None:
                    # A bot that detected reconnects right after; give it a bounded moment.
                    await b.wait_event("reconnected", s.bound(5, floor=3), after_mono=t0)
                rc = first_after(b.events("reconnected"), t0)
                rescue[role] = None if rc is None else rc - t0
                ctx.say(
                    f"   {role}: reconnected " + ("no" if rc is None else f"at t+{rc - t0:.2f} s")
                )
            rescued = rescued_without_detection(detect, rescue)
            await proxy.thaw("both")

    r.headline.update(
        {
            "detection window (idle + PONG timeout) s": round(window, 3),
            "watched s": round(watch, 3),
            "chat interval s": round(chat_every, 3),
            "chatty posts made": len(posts),
            "chatty: own detection t+ s": _r(detect["chatty"]),
            "silent: own detection t+ s": _r(detect["silent"]),
            "chatty: reconnected t+ s": _r(rescue["chatty"]),
            "silent: reconnected t+ s": _r(rescue["silent"]),
        }
    )
    r.details["chatty_posts"] = posts
    # Measured, not assumed: the largest gap between the starts of consecutive posts
    # (each includes the post's own confirmation wait) until detection or the end.
    until = detect["chatty"] if detect["chatty"] is not None else watch
    max_gap = max_post_gap(posts, until)
    idle = s.real("keepalive_idle")
    controls = (
        (
            "both links frozen at the same instant",
            rec.count == 2 and len(rec.conns) == 2,
            f"{rec.count} link(s) frozen by one call",
        ),
        ("the freeze held (no byte crossed a frozen link)", held, held_detail),
        (
            "the silent worker (the internal control) detected on its own keepalive",
            detect["silent"] is not None,
            f"t+{detect['silent']:.2f} s (window {window:.3g} s)"
            if detect["silent"] is not None
            else f"never in {watch:.3g} s -- the run is not comparable",
        ),
        (
            "the chatty worker posted more often than its idle threshold",
            max_gap is not None and max_gap < idle,
            f"{len(posts)} posts, largest gap {_r(max_gap)} s (idle threshold {idle:.3g} s)",
        ),
        (
            "no reconnect without the bot's own detection first",
            not rescued,
            "a reconnect with no PONG timeout before it means a close leaked through the "
            "freeze: " + (", ".join(rescued) or "none"),
        ),
    )
    for name, ok, detail in controls:
        r.check(name, ok, detail, role="control")
    r.check(
        "the CHATTY worker detected on its own keepalive",
        detect["chatty"] is not None,
        f"t+{detect['chatty']:.2f} s after {len(posts)} posts"
        if detect["chatty"] is not None
        else f"NEVER in {watch:.3g} s despite {len(posts)} posts -- posting suppressed "
        "its own detection",
        role="target",
    )
    # The silent worker's detection time must not move between arms. Its spread comes
    # from the sync line's delivery and the keepalive's sleep: a fifth of the window
    # (18 s at scale 1) plus 0.1 s of scheduling is generous for both.
    r.control(
        "silent worker's own detection",
        _r(detect["silent"]),
        "s",
        tolerance=round(0.2 * window + 0.1, 3),
    )


def max_post_gap(posts: list[dict[str, Any]], until: float) -> float | None:
    """The largest gap (s) between the starts (``at``) of consecutive posts made up to
    *until*; None with fewer than two."""
    starts = sorted(p["at"] for p in posts if p["at"] <= until)
    return max((b - a for a, b in zip(starts, starts[1:], strict=False)), default=None)


def rescued_without_detection(
    detect: dict[str, float | None], reconnect: dict[str, float | None]
) -> list[str]:
    """Roles that reconnected with no own detection (pong_timeout) at or before it."""
    out = []
    for role, rc in reconnect.items():
        own = detect.get(role)
        if rc is not None and (own is None or own > rc):
            out.append(role)
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


amain, main = runner.commands(__name__)


if __name__ == "__main__":
    sys.exit(main())
