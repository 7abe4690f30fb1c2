"""confirm_latency: how long does delivery confirmation take, and does it fit its budget?

A confirmation budget picked by intuition is a bad budget: too tight and a healthy but
slow link produces UNCONFIRMED, and the first person who sees a spurious one learns to
ignore the warning, which destroys the signal. So measure it: N posts over a healthy link
(through the faultnet proxy, passing), and two independent signals:

  the bot's own log    BOTEVENT post_confirm elapsed_ms
  the tool-call clock  the wall time of each send-channel call, taken here

They must agree (the log's figure sits inside the call's, by at most the MCP round trip).
Also settled cheaply: that the bot's event loop keeps reading the socket while a post
waits for confirmation. If it did not, nothing could ever satisfy the wait, every post
would burn the whole budget and come back UNCONFIRMED; confirmations in a small fraction
of the budget are that assumption's proof.

The observer (direct link) also times each post's arrival: a third clock, and the
internal control -- delivery does not depend on the bot's confirmation, so it must not
move between arms.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from drivers.irc import Message, Observer
from faultnet.cliargs import plain
from faultnet.toxics import Latency
from harness import runner
from harness.experiment import BotHandle, Context, claims_delivery, pct

NAME = "confirm_latency"
DESCRIPTION = plain(__doc__)
#: 40 posts, one a second, each up to the 3 s budget, at time scale 1.0.
MAX_REAL_S = 300.0
#: The MCP round trip (JSON-RPC over pipes, the SDK's dispatch) the tool-call clock may
#: add to the bot's own figure, at the median. Measured ~2-5 ms idle; 100 ms allows for
#: a loaded 2-core CI box without letting a bot that logs nonsense through.
MAX_OVERHEAD_MS = 100.0
#: Confirmations must arrive within this fraction of the budget for the event-loop check.
LOOP_FRACTION = 0.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("n", nargs="?", type=int, default=40, metavar="N", help="posts (40)")
    p.add_argument(
        "--link-latency-ms",
        type=int,
        default=0,
        metavar="MS",
        help="delay the server-to-worker direction of the worker's link by MS (a faultnet "
        "latency toxic; not scaled: it is a property of the link, not of the scenario)",
    )


def check_arguments(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise ValueError("N must be at least 1")
    if not 0 <= args.link_latency_ms <= 60_000:
        raise ValueError("--link-latency-ms must be between 0 and 60000")


async def run(ctx: Context) -> None:
    r = ctx.result
    s = ctx.scale
    n = ctx.args.n
    call_bound = s.bound(30, floor=15)
    async with ctx.leader() as obs, ctx.proxy() as proxy:
        nick, token = await ctx.spawn(obs, "cl")
        latency = ctx.args.link_latency_ms
        if latency:
            # Downstream only: it delays the server's PONG (what confirmation waits for),
            # not the post's way to the server, so the observer's clock is unaffected.
            proxy.add_toxic(Latency(name="link_latency", stream="downstream", latency=latency))
        ctx.phase(
            f"worker {nick} starting, through the proxy at {proxy.address[1]} "
            + (f"(server-to-worker latency {latency} ms)" if latency else "(passing)")
        )
        async with ctx.bot(nick, token, "worker", via=proxy) as w:
            await ctx.connected(w)
            budget, budget_src = await _effective_budget(ctx, w)
            await ctx.countdown(s.real("settle"), "the worker settles")

            ctx.phase(f"{n} healthy posts, one every {s.real('latency_post_interval'):.3g} s")
            before = len(w.events("post_confirm"))
            posts: list[dict] = []
            for i in range(1, n + 1):
                text = ctx.payload(f"latency probe {i:03d}")
                t_call = time.monotonic()
                res, wall = await w.send(text, call_bound)
                posts.append({"i": i, "text": text, "t_call": t_call, "wall_ms": wall * 1000})
                posts[-1]["result"] = res
                if i % 10 == 0 or i == n:
                    ctx.say(f"   {i}/{n} posted")
                if i < n:
                    await ctx.countdown(s.real("latency_post_interval"), "next", quiet=True)
            # Every post was on the wire before its call returned: allow the observer a
            # bounded moment for the last ones.
            last = posts[-1]["text"]
            await obs.wait_for(last, s.bound(5, floor=2))
            logged = w.events("post_confirm")[before:]

    delivered = _observer_arrivals(obs, nick, posts)
    unconfirmed_calls = sum(1 for p in posts if not claims_delivery(p["result"]))
    log_ms = [float(e.get("elapsed_ms", 0.0)) for e in logged]
    log_confirmed = [float(e["elapsed_ms"]) for e in logged if e.get("result") == "confirmed"]
    walls = [p["wall_ms"] for p in posts]
    agree, inside, p50_over = clocks_agree(walls, log_ms)

    def stats(xs: list[float]) -> str:
        if not xs:
            return "no samples"
        return f"p50 {pct(xs, 50):.1f}  p95 {pct(xs, 95):.1f}  max {max(xs):.1f}"

    r.headline.update(
        {
            "posts": n,
            "link latency ms (server to worker)": ctx.args.link_latency_ms,
            "confirmation budget s": budget,
            "budget from": budget_src,
            **_triple("bot log (confirmed) ms", log_confirmed),
            "bot log (every post) p50 ms": _r(pct(log_ms, 50)),
            **_triple("tool-call wall ms", walls),
            **_triple("observer arrival ms", delivered),
            "UNCONFIRMED": f"{unconfirmed_calls}/{n}",
            "MCP overhead p50 ms": _r(p50_over),
        }
    )
    r.details.update(
        log_ms=log_ms,
        wall_ms=walls,
        observer_ms=[p["observer_ms"] for p in posts],
        results=[p["result"] for p in posts],
    )
    ctx.say(f"   bot's own log   {stats(log_confirmed)} ms ({len(log_confirmed)} confirmed)")
    ctx.say(f"   tool-call wall  {stats(walls)} ms")
    ctx.say(f"   observer        {stats(delivered)} ms")
    r.check(
        "the observer received every post",
        len(delivered) == n,
        f"{len(delivered)}/{n}: delivery does not depend on confirmation",
        role="control",
    )
    r.check(
        "the bot's log and the tool-call wall clock agree",
        len(logged) == n and agree,
        f"{len(logged)}/{n} posts logged; every logged figure inside its call: {inside}; "
        f"median call minus log {_r(p50_over)} ms (<= {MAX_OVERHEAD_MS:g})",
        role="control",
    )
    r.check(
        "every healthy post CONFIRMED within the budget",
        unconfirmed_calls == 0 and len(log_confirmed) == n,
        f"{unconfirmed_calls}/{n} came back without a delivery claim; "
        f"{len(log_confirmed)}/{n} logged confirmed (budget {budget:g} s)",
        role="target",
    )
    loop_ok = bool(log_confirmed) and max(log_confirmed) < LOOP_FRACTION * budget * 1000
    r.check(
        "the event loop runs during the confirmation wait",
        loop_ok,
        (
            f"max confirmation {max(log_confirmed):.1f} ms against {LOOP_FRACTION:g} x budget "
            f"= {LOOP_FRACTION * budget * 1000:.1f} ms"
            if log_confirmed
            else "no post confirmed: a stalled loop would look like this"
        ),
    )
    r.control("posts the observer received", float(len(delivered)), "posts", 0.0)
    # Delivery time through the same proxy and server: machine noise only. 50 ms covers a
    # loaded CI box; a slower link in one arm than the other would exceed it.
    r.control("observer arrival p50", _r(pct(delivered, 50)), "ms", 50.0)


def _observer_arrivals(obs: Observer, nick: str, posts: list[dict[str, Any]]) -> list[float]:
    """Set each post's ``observer_ms`` (call to arrival at the observer, None if it never
    arrived from *nick*); return the arrivals that happened, in post order."""
    by_text: dict[str, Message] = {}
    for m in list(obs.messages):
        if m.sender.lower() == nick.lower():
            by_text.setdefault(m.text, m)
    delivered: list[float] = []
    for p in posts:
        m = next((m for t, m in by_text.items() if p["text"] in t), None)
        p["observer_ms"] = None if m is None else (m.mono - p["t_call"]) * 1000
        if m is not None:
            delivered.append(p["observer_ms"])
    return delivered


async def _effective_budget(ctx: Context, w: BotHandle) -> tuple[float, str]:
    """The confirmation budget the bot is actually using: from its ``status`` tool when it
    reports one (an arm may override BOT_CONFIRM_BUDGET_S), else the one handed to it."""
    handed = ctx.scale.real("confirm_budget")
    try:
        res = await w.drv.call_tool("status", {}, timeout=ctx.scale.bound(10, floor=5))
    except Exception:
        return handed, "handed to the bot"
    m = re.search(r"confirm_budget_s\W+([0-9.]+(?:e-?\d+)?)", res.text)
    if m:
        return float(m.group(1)), "the bot's status"
    return handed, "handed to the bot"


def clocks_agree(walls_ms: list[float], log_ms: list[float]) -> tuple[bool, bool, float | None]:
    """Do the tool-call clock and the bot's log agree? Pairs the i-th call with the i-th
    logged post (the calls are sequential). Returns (agree, every logged figure inside
    its call, median of call minus log in ms). Agree: same count, every logged figure
    inside its call (1 ms slack for rounding across two clocks), median difference at
    most MAX_OVERHEAD_MS."""
    if not walls_ms or len(walls_ms) != len(log_ms):
        return False, False, None
    overhead = [w - lg for w, lg in zip(walls_ms, log_ms, strict=True)]
    inside = all(o >= -1.0 for o in overhead)
    p50 = pct(overhead, 50)
    return inside and p50 is not None and p50 <= MAX_OVERHEAD_MS, inside, p50


def _triple(name: str, xs: list[float]) -> dict[str, float | None]:
    """p50, p95 and max of *xs* as three headline entries."""
    return {
        name.replace(" ms", " p50 ms"): _r(pct(xs, 50)),
        name.replace(" ms", " p95 ms"): _r(pct(xs, 95)),
        name.replace(" ms", " max ms"): _r(max(xs)) if xs else None,
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


amain, main = runner.commands(__name__)


if __name__ == "__main__":
    sys.exit(main())
