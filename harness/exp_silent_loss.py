"""silent_loss: does a post made during an outage claim a delivery it never achieved?

The worker under test reaches the server through a faultnet proxy; the leader (an IRC
observer on a direct link) scores delivery by what it RECEIVED, never by what the worker
reported, because the worker's report is the thing under test.

Phases:

1. CONTROL A: one post on the healthy link. The observer must receive it and the worker
   must claim it. Without this, "nothing arrived" would equally fit a broken observer.
2. The worker's idle clock is synced (the observer posts; the worker must hear it), then
   its link is frozen both ways: no byte, no FIN, no RST crosses.
3. POSTS posts, one every 10 s (scaled), into the dead link. Each result is kept.
4. A 30 s (scaled) wait for any late delivery, link still frozen; then scoring: a post
   whose result claimed delivery ("Broadcast to", no UNCONFIRMED) that the observer never
   received is a SILENT LOSS.
5. Thaw; wait for the worker to be back (its reconnect, if it made one).
6. CONTROL B: one post after recovery must again be claimed and received. A bot that
   reported failure for everything would pass phase 4 perfectly; this catches it.

Also controls: the freeze held (not one byte crossed a frozen link while scoring) and at
least one post entered the dead link before the worker reconnected (else phase 4 would
pass vacuously). The worker's own detection (BOTEVENT pong_timeout) and its reconnects are
reported separately: faultnet's freeze holds the server's FIN, so no close leaks through
to rescue it, but the two are still different claims.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from faultnet.cliargs import plain
from harness import runner
from harness.experiment import (
    Context,
    claims_delivery,
    clip,
    first_after,
    freeze_held,
    freeze_worker,
    link_works,
    observed,
    observer_texts,
    rel,
)

NAME = "silent_loss"
DESCRIPTION = plain(__doc__)
#: Longest scenario at time scale 1.0: 14 posts x (10 s + a 3 s confirm) + 30 s late
#: wait + detection (90 s) + reconnect backoff (16 s) + controls.
MAX_REAL_S = 500.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--posts", type=int, default=14, metavar="N", help="posts into the frozen link (14)"
    )


def check_arguments(args: argparse.Namespace) -> None:
    if args.posts < 1:
        raise ValueError("--posts must be at least 1")


async def run(ctx: Context) -> None:
    r = ctx.result
    s = ctx.scale
    interval = s.real("outage_post_interval")
    call_bound = s.bound(30, floor=15)
    # A post the bot says was confirmed has been relayed before the PONG came back:
    # seconds are plenty for it to reach the observer.
    seen_bound = s.bound(10, floor=3)
    async with ctx.leader() as obs, ctx.proxy() as proxy:
        async with ctx.worker(obs, proxy, "sl") as w:
            nick = w.nick

            async def control_post(phase: str, words: str) -> tuple[str, bool]:
                """Post *words*; return what the worker was told and whether the observer
                received it."""
                ctx.phase(phase)
                text = ctx.payload(words)
                res, _ = await w.send(text, call_bound)
                got = await observed(obs, text, seen_bound)
                ctx.say(f"   worker was told: {clip(res, 120)!r}")
                ctx.say(f"   observer received it: {got}")
                return res, got

            res_a, got_a = await control_post(
                "CONTROL A: a post before the freeze", "silent loss control before freeze"
            )
            # Recorded now, so a run that stops early still shows this control.
            r.check(
                "control A: the observer sees a post made before the freeze",
                got_a and claims_delivery(res_a),
                f"claimed={claims_delivery(res_a)} received={got_a}; if this fails nothing "
                "below means anything",
                role="control",
            )

            rec = await freeze_worker(
                ctx, obs, w, proxy, "freezing the worker's link both ways (no byte, no FIN, no RST)"
            )
            rows: list[dict] = []
            for i in range(1, ctx.args.posts + 1):
                at = time.monotonic() - rec.mono
                tag = f"loss probe {i:03d}"
                text = ctx.payload(tag, f"at t plus {at:.1f}s")
                res, wall = await w.send(text, call_bound)
                claimed = claims_delivery(res)
                rows.append(
                    {"i": i, "at": round(at, 3), "text": text, "result": res, "claimed": claimed}
                )
                ctx.say(
                    f"   t+{at:6.2f}s post {i:2d}/{ctx.args.posts}: "
                    f"{'claims delivery' if claimed else 'no claim'} ({wall * 1000:.0f} ms) "
                    f"{clip(res, 60)!r}"
                )
                ctx.log.write("outage_post", i=i, at=at, claimed=claimed, result=res)
                if i < ctx.args.posts:
                    await ctx.countdown(interval, "next post", quiet=True)

            ctx.phase("waiting for any late delivery (link still frozen)")
            await ctx.countdown(s.real("late_delivery_wait"), "late delivery")
            held, held_detail = freeze_held(proxy, rec)

            # Score by what the observer received, matched on the whole unique text.
            first_reconnect = first_after(w.events("reconnected"), rec.mono)
            own = first_after(w.events("pong_timeout"), rec.mono)
            score = score_outage(rows, observer_texts(obs, nick), first_reconnect, rec.mono)
            silent, into_dead = score.silent, score.into_dead
            _print_rows(ctx, rows)

            ctx.phase("thawing; waiting for the worker to be back")
            await proxy.thaw("both")
            t_thaw = time.monotonic()
            # Back = it hears the observer again: at once if it already reconnected or
            # the thawed link resumed; after its reconnect if the thaw released a FIN.
            back_bound = s.bound(s.detection_window + s.real("reconnect_max") + 30, floor=10)
            back = await link_works(ctx, obs, w, back_bound)
            ctx.say(
                "   the worker hears the observer again"
                if back is not None
                else f"   the worker did not hear the observer within {back_bound:.3g} s"
            )
            await ctx.countdown(s.real("settle"), "the worker settles")

            res_b, got_b = await control_post(
                "CONTROL B: a post after recovery", "silent loss control after recovery"
            )
            got = observer_texts(obs, nick)
            late_after_thaw = sum(
                1 for row in rows if not row["received"] and any(row["text"] in t for t in got)
            )

    n = len(rows)
    claimed_n = sum(row["claimed"] for row in rows)
    delivered_n = sum(row["received"] for row in rows)
    r.headline.update(
        {
            "posts into the outage": n,
            "posts into the dead link (before any reconnect)": into_dead,
            "claimed delivery": claimed_n,
            "observer received (scored before thaw)": delivered_n,
            "SILENT LOSSES": f"{silent}/{n}",
            "own detection (pong_timeout) t+ s": rel(own, rec.mono),
            "first reconnect t+ s": rel(first_reconnect, rec.mono),
            "outage posts arriving after the thaw (not scored)": late_after_thaw,
        }
    )
    r.details["posts"] = rows
    r.details["thaw_mono"] = t_thaw
    r.check("the freeze held while scoring", held, held_detail, role="control")
    r.check(
        "posts entered the dead link",
        into_dead >= 1,
        f"{into_dead} of {n} posts were made before the worker's first reconnect",
        role="control",
    )
    r.check(
        "no post claimed a delivery it did not achieve",
        silent == 0,
        f"{silent}/{n} claimed delivery and never reached the observer",
        role="target",
    )
    r.check(
        "control B: a post after recovery is claimed and delivered",
        got_b and claims_delivery(res_b),
        f"claimed={claims_delivery(res_b)} received={got_b}; a bot that reports failure "
        "for everything would pass the check above",
        role="control",
    )
    r.control("control A delivered", float(got_a and claims_delivery(res_a)))
    r.control("control B delivered", float(got_b and claims_delivery(res_b)))
    r.control("frozen link held", float(held))
    # The worker's own detection after the synced freeze is idle + PONG timeout whatever
    # it does with its posts (outbound traffic does not touch the idle clock in either
    # arm), so it must not move between arms; a fifth of the window + 0.1 s of slack.
    r.control(
        "own detection (pong_timeout) after the freeze",
        rel(own, rec.mono),
        "s",
        tolerance=round(0.2 * s.detection_window + 0.1, 3),
    )


@dataclass
class OutageScore:
    silent: int
    into_dead: int


def score_outage(
    rows: list[dict[str, Any]],
    received: list[str],
    first_reconnect: float | None,
    freeze_mono: float,
) -> OutageScore:
    """Mark each outage post (``at`` seconds after the freeze, ``text``, ``claimed``)
    with ``received`` (its exact text is in one the observer received),
    ``into_dead_link`` (made before the worker's first reconnect) and ``silent_loss``
    (claimed and not received); return the totals."""
    silent = into_dead = 0
    for row in rows:
        row["received"] = any(row["text"] in t for t in received)
        row["into_dead_link"] = first_reconnect is None or (
            freeze_mono + row["at"] < first_reconnect
        )
        row["silent_loss"] = bool(row["claimed"]) and not row["received"]
        into_dead += row["into_dead_link"]
        silent += row["silent_loss"]
    return OutageScore(silent, into_dead)


def _print_rows(ctx: Context, rows: list[dict]) -> None:
    ctx.say("    t+ s   post              claimed  observer got it")
    for row in rows:
        flag = "  <-- SILENT LOSS" if row["silent_loss"] else ""
        ctx.say(
            f"   {row['at']:6.2f}  loss probe {row['i']:03d}    "
            f"{'YES' if row['claimed'] else 'no':<8} {'YES' if row['received'] else 'no'}{flag}"
        )


amain, main = runner.commands(__name__)


if __name__ == "__main__":
    sys.exit(main())
