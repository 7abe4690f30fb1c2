"""``python -m harness.fleet.verify RUN_DIR``: judge a fleet soak from its records alone.

(``python -m harness.fleet_verify`` is the same command.) It reads the run directory
through :mod:`harness.fleet._records` and judges it with the table of checks in
:mod:`harness.fleet._checks`; it shares nothing with the runner but the run directory (and the bot
contract's reader, :mod:`harness.experiment`, as every consumer of a bot's output does):
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

from harness.fleet._checks import CHECKS, joins
from harness.fleet._records import Unusable, facts

__all__ = ["Unusable", "Verdict", "main", "verify"]

PROG = "python -m harness.fleet.verify"


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

    def failed(self, name_part: str) -> bool:
        return any(name_part in c["name"] and not c["passed"] for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: The summary's keys, in order; each check contributes the counts it measured.
SUMMARY = (
    "bots",
    "posts",
    "claimed",
    "lost",
    "posts during outages",
    "faults applied",
    "detected by own keepalive",
)


def _message(v: Verdict, lost: int, claimed: int) -> tuple[bool, str]:
    """Whether the run is judged as its mode requires, and the verdict's one line."""
    if v.mode == "control":
        if lost > 0:
            return True, (
                f"control lost {lost} of {claimed} claimed posts, as it must: the workload "
                "puts posts at risk, so a clean main run is a result rather than an accident"
            )
        return False, (
            "CONTROL LOST NOTHING: the harness stopped being a test (the workload never "
            "put a post at risk, or the bots were not the no-confirm control); no passing "
            "main run means anything until this fails again"
        )
    failed = [c["name"].split(":")[0] for c in v.checks if not c["passed"]]
    return not failed, f"{v.mode}: " + (
        "every check passed" if not failed else "FAILED: " + ", ".join(failed)
    )


def verify(run_dir: Path) -> Verdict:
    """Judge the run in *run_dir* (:class:`Unusable` if it cannot be judged)."""
    f = facts(run_dir)
    v = Verdict(f.mode)
    counts: dict[str, int] = {"bots": len(f.bots), "posts": f.posts}
    for check in CHECKS:
        finding = check(f)
        v.checks.append(finding.to_json())
        counts.update(finding.counts)
    v.joins = joins(f)
    v.summary = {k: counts[k] for k in SUMMARY}
    v.ok, v.message = _message(v, counts["lost"], counts["claimed"])
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
