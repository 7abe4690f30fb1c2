"""The verifier's checks: a table of named checks, each a small function of the facts.

Each check takes the :class:`~harness.fleet._records.Facts` of one run and returns a
:class:`Finding`: passed or not, one line of detail, its evidence, and the counts it
contributes to the verdict's summary. :data:`CHECKS` is the table, in the order the
verdict lists them; adding a check is one function and one row, and one test.

Joins (every applied fault joined to its effects on its own bot, or to a reason for
having none) are facts in their own right, rendered beside the checks: :func:`joins`
builds them and :func:`faults_joined` judges them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.experiment import claims_delivery
from harness.fleet._records import DOWN_ACTIONS, LINK_ACTIONS, Bot, Episode, Facts

__all__ = [
    "CHECKS",
    "Finding",
    "calls_recorded",
    "descriptors_flat",
    "faults_joined",
    "joins",
    "liveness",
    "no_silent_loss",
    "outage_posts_unconfirmed",
]

#: Effects of a fault the bot logs itself (its BOTEVENT lines).
OWN_EFFECTS = ("pong_timeout", "disconnected", "reconnected")


@dataclass
class Finding:
    """One check's result; ``counts`` go into the verdict's summary."""

    name: str
    passed: bool
    detail: str
    evidence: Any = None
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": bool(self.passed),
            "detail": self.detail,
            "evidence": self.evidence,
        }


def no_silent_loss(f: Facts) -> Finding:
    """Every post whose reply claimed delivery is in the observer's transcript."""
    claimed = 0
    losses = []
    for bot in f.bots.values():
        for p in bot.posts:
            if claims_delivery(p["reply"]):
                claimed += 1
                if not f.received(p["text"]):
                    losses.append({"bot": bot.label, "i": p["i"], "text": p["text"]})
    return Finding(
        "no silent loss: every post claimed as delivered was received",
        not losses,
        f"{len(losses)} of {claimed} claimed posts never reached the observer "
        f"({f.posts} posts in all)",
        losses,
        {"claimed": claimed, "lost": len(losses)},
    )


def _in_window(p: dict[str, Any], w: tuple[float, float], horizon: float = float("inf")) -> bool:
    return p["sent"] >= w[0] and p["done"] <= min(w[1], horizon)


def outage_posts_unconfirmed(f: Facts) -> Finding:
    """Every post made during an outage on its own link was reported UNCONFIRMED (and
    there was at least one such post, else the check proves nothing)."""
    in_outage = 0
    wrong = []
    for i, ep in enumerate(f.eps):
        w = f.windows.get(i)
        bot = f.bots.get(ep.target)
        if w is None or bot is None:
            continue
        for p in bot.posts:
            if not _in_window(p, w):
                continue
            in_outage += 1
            if claims_delivery(p["reply"]):
                wrong.append(
                    {"bot": bot.label, "i": p["i"], "fault": ep.counter, "reply": p["reply"][:120]}
                )
    none = "" if in_outage else "; no post was made during an outage: the check proves nothing"
    return Finding(
        "every post made during an outage on its link was reported UNCONFIRMED",
        in_outage > 0 and not wrong,
        f"{len(wrong)} of {in_outage} posts made during an outage claimed delivery{none}",
        wrong,
        {"posts during outages": in_outage},
    )


def _late(f: Facts, bot: Bot, last_end: float, bound: float) -> dict[str, Any] | None:
    """How late *bot* was back after the last fault (None: within the bound)."""
    back = last_end if bot.connected_at(last_end) else bot.first("connected", last_end)
    rolls = [p for p in bot.posts if p.get("kind") == "roll_call"]
    good = [p for p in rolls if claims_delivery(p["reply"]) and f.received(p["text"])]
    proof = good[0]["done"] if good else None
    if back is not None and proof is not None and proof - last_end <= bound:
        return None
    return {
        "connected_after_s": None if back is None else round(back - last_end, 3),
        "roll_call_confirmed_after_s": None if proof is None else round(proof - last_end, 3),
    }


def liveness(f: Facts) -> Finding:
    """After the last fault, every bot connected again and had a roll-call post
    confirmed and received, within the manifest's liveness bound."""
    name = "liveness: every bot connected again after the last fault"
    last_end = f.last_end
    if last_end is None:
        return Finding(name, False, "no fault was applied", {})
    bound = float(f.timing["liveness_bound_s"])
    late = {}
    for bot in f.bots.values():
        how = _late(f, bot, last_end, bound)
        if how is not None:
            late[bot.label] = how
    detail = f"bound {bound:g} s after the last fault ended; late or never back: {late or 'none'}"
    return Finding(name, not late, detail, late)


def descriptors_flat(f: Facts) -> Finding:
    """Each bot's final descriptor count is within tolerance of its baseline."""
    tol = int(f.timing["fd_tolerance"])
    drift = {}
    for bot in f.bots.values():
        base = next((x["fds"] for x in bot.fds if x.get("stage") == "baseline"), None)
        final = next((x["fds"] for x in reversed(bot.fds) if x.get("stage") == "final"), None)
        if base is None or final is None or abs(final - base) > tol:
            drift[bot.label] = {"baseline": base, "final": final}
    return Finding(
        "descriptors flat per bot across the run",
        not drift,
        f"tolerance {tol}; drifted or unmeasured: {drift or 'none'}",
        drift,
    )


def calls_recorded(f: Facts) -> Finding:
    """Every post has its drivers.mcp call record."""
    unrecorded = [
        {"bot": b.label, "i": p["i"]}
        for b in f.bots.values()
        for p in b.posts
        if p["text"] not in b.call_texts
    ]
    return Finding(
        "every post has its drivers.mcp call record",
        f.posts > 0 and not unrecorded,
        f"{len(unrecorded)} of {f.posts} posts without a call record",
        unrecorded,
    )


# --------------------------------------------------------------------------- joins


def _effects(
    f: Facts, i: int, ep: Episode, bot: Bot, horizon: float, bound: float
) -> list[dict[str, Any]]:
    """What followed *ep* on its bot until *horizon*: its own events, then its posts in
    the outage (claimed or unconfirmed), each with its time after the fault began.

    The end of the session the fault took down is its effect whenever it came (within
    *bound* of the fault): under load (stress-ng on both CPUs) a bot read a sever's EOF
    395 ms after it, past the next fault on its link (340 ms after, a freeze that
    found no connection), and the sever was left with no effect."""
    taken = bot.session_at(ep.began) if ep.conns else None
    effects = [
        {
            "effect": e["event"],
            "reason": e.get("reason"),
            "after_s": round(float(e.get("mono", 0)) - ep.began, 3),
        }
        for e in bot.events
        if e.get("event") in OWN_EFFECTS
        and ep.began <= float(e.get("mono", 0))
        and (
            float(e.get("mono", 0)) <= horizon
            or (
                taken is not None
                and e.get("session") == taken
                and float(e.get("mono", 0)) <= (ep.ended or ep.start) + bound
            )
        )
    ]
    w = f.windows.get(i)
    if w is not None:
        for p in bot.posts:
            if _in_window(p, w, horizon):
                kind = "claimed_post" if claims_delivery(p["reply"]) else "unconfirmed_post"
                effects.append(
                    {"effect": kind, "post": p["i"], "after_s": round(p["done"] - ep.began, 3)}
                )
    return effects


def _non_effect_reason(ep: Episode, window_s: float) -> str:
    """Why a fault with no effect had none, or UNEXPLAINED."""
    duration = (ep.ended - ep.start) if ep.ended is not None else 0.0
    if ep.down not in LINK_ACTIONS:
        return f"{ep.down} does not act on a live link: no effect is required"
    if not ep.conns:
        return "no live connection on the link when it was applied (bot between links)"
    if ep.down in DOWN_ACTIONS and duration < 1.2 * window_s + 0.5:
        return (
            f"an outage of {duration:.3g} s, within the detection window "
            f"({window_s:.3g} s), that no post entered: nothing to detect"
        )
    return "UNEXPLAINED: the fault took a connection down and nothing followed"


def joins(f: Facts) -> list[dict[str, Any]]:
    """Each applied fault joined to its effects on its own bot (until the next fault on
    that link, or the liveness bound after it ended), or to the reason it had none."""
    bound = float(f.timing["liveness_bound_s"])
    window_s = float(f.timing["detection_window_s"])
    out = []
    for i, ep in enumerate(f.eps):
        bot = f.bots.get(ep.target)
        if bot is None:
            continue
        nxt = next((e.began for e in f.eps[i + 1 :] if e.target == ep.target), float("inf"))
        effects = _effects(f, i, ep, bot, min((ep.ended or ep.start) + bound, nxt), bound)
        out.append(
            {
                "counter": ep.counter,
                "target": ep.target,
                "episode": ep.kind,
                "actions": [r["action"] for r in ep.records],
                "conns": ep.conns,
                "effects": effects,
                "detected_by_own_keepalive": any(x["effect"] == "pong_timeout" for x in effects),
                "non_effect_reason": None if effects else _non_effect_reason(ep, window_s),
            }
        )
    return out


def faults_joined(f: Facts) -> Finding:
    """Every fault is joined to its effects, every non-effect to a reason."""
    joined = joins(f)
    unexplained = [j for j in joined if (j["non_effect_reason"] or "").startswith("UNEX")]
    return Finding(
        "every fault is joined to its effects, every non-effect to its reason",
        bool(f.eps) and not unexplained,
        f"{len(f.eps)} faults applied; {len(unexplained)} without an effect or a reason",
        unexplained,
        {
            "faults applied": len(f.eps),
            "detected by own keepalive": sum(j["detected_by_own_keepalive"] for j in joined),
        },
    )


#: The checks, in the order the verdict lists them.
CHECKS: tuple[Callable[[Facts], Finding], ...] = (
    no_silent_loss,
    outage_posts_unconfirmed,
    liveness,
    descriptors_flat,
    calls_recorded,
    faults_joined,
)
