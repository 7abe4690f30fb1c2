"""Scenario steps more than one experiment uses: syncing the bots' idle clocks, freezing
with a record of what was frozen, checking that a freeze held, and matching what the
observer received.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faultnet.errors import EnvironmentProblem
from faultnet.eventlog import flatten
from harness.experiment._helpers import RunProblem

if TYPE_CHECKING:  # for the annotations only: see the package's docstring
    from drivers.irc import Observer
    from faultnet import Proxy
    from harness.experiment._context import BotHandle, Context

__all__ = [
    "FreezeRecord",
    "first_after",
    "link_works",
    "freeze_held",
    "freeze_links",
    "observed",
    "observer_texts",
    "rel",
    "sender_nick",
    "sync_inbound",
    "wait_notified",
]


def sender_nick(sender: str | None) -> str:
    """The nick of an IRC prefix (``nick!user@host`` or a bare nick)."""
    return (sender or "").split("!", 1)[0]


def observer_texts(obs: Observer, nick: str | None = None) -> list[str]:
    """Every channel text the observer has received (from *nick* only, if given)."""
    return [
        m.text
        for m in list(obs.messages)
        if nick is None or sender_nick(getattr(m, "sender", "")).lower() == nick.lower()
    ]


async def observed(obs: Observer, text: str, timeout: float) -> bool:
    """True once the observer has received *text* (exact substring), within *timeout*."""
    if any(text in t for t in observer_texts(obs)):
        return True
    msg = await obs.wait_for(text, timeout)
    return msg is not None


async def wait_notified(bot: BotHandle, text: str, timeout: float) -> bool:
    """True once *bot* has pushed a channel notification containing *text*."""
    note = await bot.drv.wait_notification(
        lambda n: n.method == "notifications/message" and text in flatten(n.params), timeout
    )
    return note is not None


async def sync_inbound(ctx: Context, obs: Observer, bots: list[BotHandle]) -> float | None:
    """Reset every bot's keepalive idle clock at (nearly) the same instant: the observer
    posts a channel line and each bot must receive it (inbound traffic).

    Without this, a bot's detection time after a freeze depends on when it last heard
    from the server (anywhere in [PONG timeout, idle + PONG timeout]), and two arms or two
    workers would not be comparable. Returns the seconds it took for all bots to report
    the line, or None if one never did (the caller decides what that means).
    """
    text = ctx.payload("idle clock sync line")
    t0 = time.monotonic()
    await obs.privmsg(ctx.env.channel, text)
    bound = ctx.scale.bound(10, floor=5)
    ok = True
    for b in bots:
        ok &= await wait_notified(b, text, bound)
    took = time.monotonic() - t0
    ctx.log.write("sync_inbound", text=text, ok=ok, took_s=round(took, 4))
    return took if ok else None


async def link_works(ctx: Context, obs: Observer, bot: BotHandle, bound: float) -> float | None:
    """Wait until *bot* hears the observer again: post a fresh line every half second
    (a bot that is still reconnecting misses lines sent before it rejoined) until one is
    reported. Returns the seconds it took, or None if none was heard within *bound*."""
    t0 = time.monotonic()
    deadline = t0 + bound
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        text = ctx.payload(f"link check {attempt}")
        await obs.privmsg(ctx.env.channel, text)
        if await wait_notified(bot, text, min(0.5, max(0.05, deadline - time.monotonic()))):
            took = time.monotonic() - t0
            ctx.log.write("link_works", attempts=attempt, took_s=round(took, 4))
            return took
    ctx.log.write("link_works", attempts=attempt, took_s=None)
    return None


@dataclass
class FreezeRecord:
    """What a freeze acted on: the instant, how many links, and each one's byte counts."""

    mono: float
    count: int
    conns: dict[int, tuple[int, int]] = field(default_factory=dict)


async def freeze_links(ctx: Context, proxy: Proxy) -> FreezeRecord:
    """Freeze every live link through *proxy*, both directions, and record them."""
    n = await proxy.freeze("both")
    mono = time.monotonic()
    conns = {
        c.id: (c.bytes_upstream, c.bytes_downstream)
        for c in proxy.connections()
        if c.state == "frozen"
    }
    ctx.log.write("freeze", links=n, conns={str(k): v for k, v in conns.items()})
    return FreezeRecord(mono, n, conns)


async def freeze_worker(
    ctx: Context, obs: Observer, worker: BotHandle, proxy: Proxy, phase: str
) -> FreezeRecord:
    """Sync *worker* with the observer (RunProblem if it never hears the sync line), then
    freeze every link of *proxy* both ways (EnvironmentProblem if there is none)."""
    if await sync_inbound(ctx, obs, [worker]) is None:
        raise RunProblem("the worker never reported the observer's sync line")
    ctx.phase(phase)
    rec = await freeze_links(ctx, proxy)
    if rec.count < 1:
        raise EnvironmentProblem("the proxy had no live link to freeze")
    return rec


def freeze_held(proxy: Proxy, rec: FreezeRecord) -> tuple[bool, str]:
    """Did every frozen link stay frozen with not one more byte across it?"""
    now = {c.id: c for c in proxy.connections()}
    problems = []
    for cid, (up, down) in rec.conns.items():
        c = now.get(cid)
        if c is None:
            problems.append(f"link {cid} closed while frozen")
            continue
        if c.state != "frozen":
            problems.append(f"link {cid} is {c.state}")
        if (c.bytes_upstream, c.bytes_downstream) != (up, down):
            problems.append(
                f"link {cid} moved {c.bytes_upstream - up} B up, {c.bytes_downstream - down} B down"
            )
    if not rec.conns:
        problems.append("no link was frozen")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(rec.conns)} link(s) frozen, 0 bytes crossed"


def first_after(events: list[dict[str, Any]], mono: float) -> float | None:
    """The earliest ``mono`` stamp among BOTEVENTs *events* at or after *mono*."""
    times = [float(e["mono"]) for e in events if "mono" in e and float(e["mono"]) >= mono]
    return min(times) if times else None


def rel(t: float | None, t0: float, digits: int = 3) -> float | None:
    """*t* - *t0* rounded, or None."""
    return None if t is None else round(t - t0, digits)
