"""``python -m harness.fleet_verify RUN_DIR``: judge a fleet soak from its records alone.

It shares nothing with :mod:`harness.fleet` but the run directory (and the bot
contract's reader, :mod:`harness._contract`, as every consumer of a bot's output does):
``manifest.json`` names every file, and every verdict comes from what the bots' own records and the
observer's transcript say, never from what a bot claimed. A post's reply is the claim
under test; the observer's transcript is what happened.

Checks (each a PASS/FAIL line with its evidence):

1. **no silent loss**: every post whose reply claimed delivery ("Broadcast to", no
   UNCONFIRMED) is in the observer's transcript (its whole unique text);
2. **outage posts unconfirmed**: every post made during an outage on its own link -- sent
   after the fault was in force and answered before the link was back (the fault's
   ending, or the bot's own reconnect, whichever came first) -- was reported
   UNCONFIRMED; there must be at least one such post, else the check proves nothing;
3. **liveness**: after the last fault ended, every bot was connected again (its own
   ``connected`` events) and had a roll-call post confirmed and received, within the
   manifest's liveness bound;
4. **descriptors flat**: each bot's descriptor count at the end is within the manifest's
   tolerance of its baseline (taken before the first fault);
5. **every call recorded**: every post has its drivers.mcp call record;
6. **every fault joined**: each applied fault is joined to its effects on its bot (own
   detection ``pong_timeout``, ``disconnected`` with the reason, unconfirmed or claimed
   posts in the outage, ``reconnected``), each with its time after the fault; a fault
   with no effect must have a reason (no live connection was taken down; an outage
   shorter than the detection window that no post entered). An unexplained non-effect
   fails the check.

Modes (from the manifest): ``main`` and ``storm`` pass when every check passes. The
``control`` run's bots confirm nothing, so it MUST lose posts: the verifier exits 0 when
the control lost posts ("as it must") and 1 when it lost nothing -- a control that loses
nothing means the workload never put a post at risk, and then no passing main run means
anything.

Exit codes: 0 the run is judged as its mode requires, 1 it is not, 2 the run directory
is unusable (no manifest, a run that did not complete, unreadable records).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultnet.eventlog import CorruptLogError, read_jsonl
from harness._contract import claims_delivery, parse_botevents

__all__ = ["Verdict", "main", "verify"]

PROG = "python -m harness.fleet_verify"
MANIFEST_FORMAT = "faultnet-fleet/1"
DOWN_ACTIONS = ("freeze", "blackhole")
#: The faults whose effect on the bot's live link the verifier can demand. Anything else
#: a chaos plan file enables (drop_syn, refuse, toxics) is joined to what followed, and
#: to a reason when nothing did, but never required to have an effect.
LINK_ACTIONS = (*DOWN_ACTIONS, "sever", "reset", "thaw")


class Unusable(Exception):
    """The run directory cannot be judged (exit 2)."""


@dataclass
class Verdict:
    """The judgement of one run; its JSON (``--json``, ``verdict.json``) is these fields,
    in this order."""

    mode: str
    ok: bool = False
    message: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    joins: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, passed: bool, detail: str, evidence: Any = None) -> bool:
        self.checks.append(
            {"name": name, "passed": bool(passed), "detail": detail, "evidence": evidence}
        )
        return passed

    def failed(self, name_part: str) -> bool:
        return any(name_part in c["name"] and not c["passed"] for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- reading


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path).records
    except FileNotFoundError:
        raise Unusable(f"{path} is missing") from None
    except (OSError, CorruptLogError) as exc:
        raise Unusable(f"cannot read {path}: {exc}") from None


def _botevents(path: Path) -> list[dict[str, Any]]:
    try:
        return parse_botevents(path.read_text(errors="replace"))
    except OSError as exc:
        raise Unusable(f"cannot read {path}: {exc}") from None


def _call_texts(directory: Path) -> set[str]:
    """The text argument of every recorded send-channel request that got an answer."""
    texts: set[str] = set()
    for path in sorted(directory.glob("*.jsonl")):
        for rec in _records(path):
            if rec.get("event") == "request" and rec.get("tool") == "send-channel":
                if rec.get("outcome") in ("ok", "is_error"):
                    try:
                        texts.add(json.loads(rec.get("arguments") or "{}").get("text", ""))
                    except ValueError:
                        continue
    return texts


@dataclass
class Bot:
    label: str
    posts: list[dict[str, Any]]
    fds: list[dict[str, Any]]
    events: list[dict[str, Any]]
    call_texts: set[str]

    def connected_at(self, t: float) -> bool:
        """Was the bot's latest link event at or before *t* a ``connected``?"""
        state = False
        for e in self.events:
            if float(e.get("mono", 0)) > t:
                break
            if e.get("event") == "connected":
                state = True
            elif e.get("event") in ("disconnected", "pong_timeout"):
                state = False
        return state

    def first(self, name: str, after: float, before: float = float("inf")) -> float | None:
        for e in self.events:
            m = float(e.get("mono", 0))
            if e.get("event") == name and after < m <= before:
                return m
        return None


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Bot], list[dict], list[str]]:
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except FileNotFoundError:
        raise Unusable(f"no manifest.json in {run_dir}: not a fleet run directory") from None
    except (OSError, ValueError) as exc:
        raise Unusable(f"cannot read {run_dir / 'manifest.json'}: {exc}") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise Unusable(f"manifest format {manifest.get('format')!r}, not {MANIFEST_FORMAT}")
    if manifest.get("status") != "complete":
        raise Unusable(f"the run did not complete (status {manifest.get('status')!r})")
    bots: dict[str, Bot] = {}
    for b in manifest["bots"]:
        events = sorted(_botevents(run_dir / b["stderr"]), key=lambda e: float(e.get("mono", 0)))
        bots[b["label"]] = Bot(
            b["label"],
            _records(run_dir / b["posts"]),
            _records(run_dir / b["fds"]),
            events,
            _call_texts(run_dir / b["calls"]),
        )
    faults = [
        r
        for r in _records(run_dir / manifest["files"]["faults"])
        if r.get("event") in ("fault", "undo")
    ]
    observed = [
        str(r.get("text") or "")
        for r in _records(run_dir / manifest["files"]["observer"])
        if r.get("event") == "message"
    ]
    return manifest, bots, faults, observed


# --------------------------------------------------------------------------- episodes


@dataclass
class Episode:
    """An applied fault as the log tells it: when it was in force, what it took down."""

    counter: int
    target: str
    kind: str
    began: float  # the call that applied it began here: effects count from here
    start: float  # in force from here (the record is written after the call returned)
    ended: float | None  # its ending action began here (None: instant, or not ended)
    conns: list[int]
    records: list[dict[str, Any]]

    @property
    def down(self) -> str:
        return self.records[0]["action"]


#: faultnet chaos stamps a decision once its call returned and records no start; its
#: effects are looked for from this long before the stamp, and an outage it ended is
#: taken to have ended this long before the undo's stamp (a narrower window: never a
#: false finding). An in-process fault call takes well under a millisecond.
CHAOS_STAMP_SLACK_S = 0.1


def applied(rec: dict[str, Any]) -> dict[str, Any] | None:
    """*rec* as an applied fault action, in one shape for both planners (None if it is a
    skip, a refusal or a note): ``counter``, ``target`` (a bot label), ``action``,
    ``mono`` (written after the call returned), ``began`` (the call began), ``conns``
    (the connection ids it took, or as many ``-1`` as chaos says it acted on)."""
    if "outcome" in rec:  # the fleet's own planner
        if rec["outcome"] != "applied":
            return None
        d = rec.get("detail") or {}
        return {
            "counter": int(rec["counter"]),
            "target": rec["target"],
            "action": rec["action"],
            "mono": float(rec["mono"]),
            "began": float(d.get("began", rec["mono"])),
            "conns": list(d.get("conns") or []),
            "episode": d.get("episode"),
        }
    if rec.get("event") not in ("fault", "undo"):  # chaos: seed, plan, skip, refuse, end...
        return None
    n = (rec.get("result") or {}).get("connections")
    return {
        "counter": int(rec["counter"]),
        "target": str(rec["target"]).split("@", 1)[0],
        "action": rec["action"],
        "mono": float(rec["mono"]),
        "began": float(rec["mono"]) - CHAOS_STAMP_SLACK_S,
        "conns": [-1] * int(n) if isinstance(n, int) and rec["action"] in LINK_ACTIONS else [],
        "episode": None,
    }


def episodes(faults: list[dict[str, Any]]) -> list[Episode]:
    by_counter: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rec in faults:
        a = applied(rec)
        if a is not None:
            by_counter.setdefault((a["counter"], a["target"]), []).append(a)
    out = []
    for (counter, target), recs in by_counter.items():
        recs.sort(key=lambda r: r["mono"])
        first = recs[0]
        ended = None
        if first["action"] in DOWN_ACTIONS and len(recs) > 1:
            ended = recs[1]["began"]
        kind = first["episode"] or "/".join(r["action"] for r in recs)
        out.append(
            Episode(
                counter, target, kind, first["began"], first["mono"], ended, first["conns"], recs
            )
        )
    return sorted(out, key=lambda e: e.began)


def outage_window(ep: Episode, bot: Bot) -> tuple[float, float] | None:
    """When *bot* had no working link because of *ep*: from the fault in force to the
    earlier of its ending and the bot's own next ``connected``. None if it took down no
    connection."""
    if not ep.conns:
        return None
    back = bot.first("connected", ep.start)
    end = min(x for x in (ep.ended, back, float("inf")) if x is not None)
    return (ep.start, end)


# --------------------------------------------------------------------------- checks


def verify(run_dir: Path) -> Verdict:
    manifest, bots, faults, observed = load(run_dir)
    timing = manifest["timing"]
    mode = manifest["mode"]
    v = Verdict(mode)
    eps = episodes(faults)
    blob = "\n".join(observed)

    def received(text: str) -> bool:
        return text in blob

    # 1. no silent loss
    claimed = lost = 0
    losses = []
    for bot in bots.values():
        for p in bot.posts:
            if claims_delivery(p["reply"]):
                claimed += 1
                if not received(p["text"]):
                    lost += 1
                    losses.append({"bot": bot.label, "i": p["i"], "text": p["text"]})
    total = sum(len(b.posts) for b in bots.values())
    v.check(
        "no silent loss: every post claimed as delivered was received",
        lost == 0,
        f"{lost} of {claimed} claimed posts never reached the observer ({total} posts in all)",
        losses,
    )

    # 2. posts during an outage on their own link were UNCONFIRMED
    in_outage = bad = 0
    wrong = []
    windows: dict[int, tuple[float, float] | None] = {}
    for ep in eps:
        bot = bots.get(ep.target)
        if bot is None:
            continue
        w = windows[id(ep)] = outage_window(ep, bot)
        if w is None:
            continue
        for p in bot.posts:
            if p["sent"] >= w[0] and p["done"] <= w[1]:
                in_outage += 1
                if claims_delivery(p["reply"]):
                    bad += 1
                    wrong.append(
                        {
                            "bot": bot.label,
                            "i": p["i"],
                            "fault": ep.counter,
                            "reply": p["reply"][:120],
                        }
                    )
    v.check(
        "every post made during an outage on its link was reported UNCONFIRMED",
        in_outage > 0 and bad == 0,
        f"{bad} of {in_outage} posts made during an outage claimed delivery"
        + ("" if in_outage else "; no post was made during an outage: the check proves nothing"),
        wrong,
    )

    # 3. liveness
    last_end = max((a["mono"] for a in map(applied, faults) if a is not None), default=None)
    bound = float(timing["liveness_bound_s"])
    late = {}
    for bot in bots.values():
        if last_end is None:
            break
        back = last_end if bot.connected_at(last_end) else bot.first("connected", last_end)
        rolls = [p for p in bot.posts if p.get("kind") == "roll_call"]
        good = [p for p in rolls if claims_delivery(p["reply"]) and received(p["text"])]
        proof = good[0]["done"] if good else None
        if back is None or proof is None or proof - last_end > bound:
            late[bot.label] = {
                "connected_after_s": None if back is None else round(back - last_end, 3),
                "roll_call_confirmed_after_s": None
                if proof is None
                else round(proof - last_end, 3),
            }
    v.check(
        "liveness: every bot connected again after the last fault",
        last_end is not None and not late,
        f"bound {bound:g} s after the last fault ended; late or never back: {late or 'none'}"
        if last_end is not None
        else "no fault was applied",
        late,
    )

    # 4. descriptors flat
    tol = int(timing["fd_tolerance"])
    drift = {}
    for bot in bots.values():
        base = next((f["fds"] for f in bot.fds if f.get("stage") == "baseline"), None)
        final = next((f["fds"] for f in reversed(bot.fds) if f.get("stage") == "final"), None)
        if base is None or final is None or abs(final - base) > tol:
            drift[bot.label] = {"baseline": base, "final": final}
    v.check(
        "descriptors flat per bot across the run",
        not drift,
        f"tolerance {tol}; drifted or unmeasured: {drift or 'none'}",
        drift,
    )

    # 5. every call recorded
    unrecorded = [
        {"bot": b.label, "i": p["i"]}
        for b in bots.values()
        for p in b.posts
        if p["text"] not in b.call_texts
    ]
    v.check(
        "every post has its drivers.mcp call record",
        total > 0 and not unrecorded,
        f"{len(unrecorded)} of {total} posts without a call record",
        unrecorded,
    )

    # 6. every fault joined to its effects or to a reason
    window_s = float(timing["detection_window_s"])
    unexplained = 0
    for i, ep in enumerate(eps):
        bot = bots.get(ep.target)
        if bot is None:
            continue
        nxt = next((e.began for e in eps[i + 1 :] if e.target == ep.target), float("inf"))
        horizon = min((ep.ended or ep.start) + bound, nxt)
        effects = []
        for e in bot.events:
            m = float(e.get("mono", 0))
            if ep.began <= m <= horizon and e.get("event") in (
                "pong_timeout",
                "disconnected",
                "reconnected",
            ):
                effects.append(
                    {
                        "effect": e["event"],
                        "reason": e.get("reason"),
                        "after_s": round(m - ep.began, 3),
                    }
                )
        w = windows.get(id(ep))
        if w is not None:
            for p in bot.posts:
                if p["sent"] >= w[0] and p["done"] <= min(w[1], horizon):
                    kind = "claimed_post" if claims_delivery(p["reply"]) else "unconfirmed_post"
                    effects.append(
                        {"effect": kind, "post": p["i"], "after_s": round(p["done"] - ep.began, 3)}
                    )
        reason = None
        if not effects:
            duration = (ep.ended - ep.start) if ep.ended is not None else 0.0
            if ep.down not in LINK_ACTIONS:
                reason = f"{ep.down} does not act on a live link: no effect is required"
            elif not ep.conns:
                reason = "no live connection on the link when it was applied (bot between links)"
            elif ep.down in DOWN_ACTIONS and duration < 1.2 * window_s + 0.5:
                reason = (
                    f"an outage of {duration:.3g} s, within the detection window "
                    f"({window_s:.3g} s), that no post entered: nothing to detect"
                )
            else:
                reason = "UNEXPLAINED: the fault took a connection down and nothing followed"
                unexplained += 1
        v.joins.append(
            {
                "counter": ep.counter,
                "target": ep.target,
                "episode": ep.kind,
                "actions": [r["action"] for r in ep.records],
                "conns": ep.conns,
                "effects": effects,
                "detected_by_own_keepalive": any(x["effect"] == "pong_timeout" for x in effects),
                "non_effect_reason": reason,
            }
        )
    v.check(
        "every fault is joined to its effects, every non-effect to its reason",
        bool(eps) and unexplained == 0,
        f"{len(eps)} faults applied; {unexplained} without an effect or a reason",
        [
            j
            for j in v.joins
            if j["non_effect_reason"] and j["non_effect_reason"].startswith("UNEX")
        ],
    )

    v.summary = {
        "bots": len(bots),
        "posts": total,
        "claimed": claimed,
        "lost": lost,
        "posts during outages": in_outage,
        "faults applied": len(eps),
        "detected by own keepalive": sum(j["detected_by_own_keepalive"] for j in v.joins),
    }
    if mode == "control":
        v.ok = lost > 0
        v.message = (
            f"control lost {lost} of {claimed} claimed posts, as it must: the workload puts "
            "posts at risk, so a clean main run is a result rather than an accident"
            if v.ok
            else "CONTROL LOST NOTHING: the harness stopped being a test (the workload never "
            "put a post at risk, or the bots were not the no-confirm control); no passing "
            "main run means anything until this fails again"
        )
    else:
        v.ok = all(c["passed"] for c in v.checks)
        v.message = f"{mode}: " + (
            "every check passed"
            if v.ok
            else "FAILED: "
            + ", ".join(c["name"].split(":")[0] for c in v.checks if not c["passed"])
        )
    return v


def render(v: Verdict) -> str:
    lines = [f"fleet verify ({v.mode})"]
    for c in v.checks:
        lines.append(f"  {'PASS' if c['passed'] else 'FAIL'}  {c['name']}")
        lines.append(f"        {c['detail']}")
    lines.append("  faults:")
    for j in v.joins:
        eff = ", ".join(
            f"{x['effect']}{'(' + x['reason'] + ')' if x.get('reason') else ''} +{x['after_s']}s"
            for x in j["effects"][:4]
        )
        more = f" (+{len(j['effects']) - 4} more)" if len(j["effects"]) > 4 else ""
        lines.append(
            f"    #{j['counter']:<4} {j['target']:<4} {'/'.join(j['actions']):<16} "
            f"{eff + more if eff else 'no effect: ' + str(j['non_effect_reason'])}"
        )
    lines.append("  " + ", ".join(f"{k}: {val}" for k, val in v.summary.items()))
    lines.append(v.message)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a harness.fleet run directory")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON line")
    p.add_argument("--out", type=Path, metavar="PATH", help="also write the verdict JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        v = verify(args.run_dir)
    except Unusable as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    doc = v.to_json()
    if args.out:
        try:
            args.out.write_text(json.dumps(doc, indent=2))
        except OSError as exc:
            print(f"{PROG}: error: cannot write {args.out}: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(doc, separators=(",", ":")) if args.json else render(v))
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main())
