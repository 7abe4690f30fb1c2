"""``faultnet chaos``: plan a seeded run of faults, print it, or run it.

``faultnet chaos plan`` prints the plan (pure: nothing is read but the plan file);
``faultnet chaos [run] --dry-run`` walks the plan through every rail it can check
without touching anything and writes the join log; ``faultnet chaos [run] --armed``
with the marker file present runs it for real. See :mod:`faultnet.chaos`.

Exit codes: 0 done (steps a rail skipped included: they are decisions, logged); 1 a step
failed or a fault could not be undone; 2 a usage or environment error, or a real run
refused as unarmed; 128+N when signal N ended the run (every fault undone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _fmt_record(record: dict[str, Any], as_json: bool) -> str:
    from faultnet.chaos._joinlog import PRINTED_KEYS

    shown = {k: record[k] for k in PRINTED_KEYS if record.get(k) not in (None, {}, "")}
    if as_json:
        return json.dumps(shown, sort_keys=True)
    at = f"{record['at']:>9.3f}" if record.get("at") is not None else " " * 9
    counter = f"#{record['counter']}" if record.get("counter") is not None else ""
    # The plan's config is in the log and in --json; a person reads the plan's size.
    items = sorted(record.get("detail", {}).items())
    detail = " ".join(f"{k}={json.dumps(v)}" for k, v in items if k != "config")
    why = ""
    if record.get("rail"):
        why += f"  rail={record['rail']}"
    if record.get("reason"):
        why += f"  ({record['reason']})"
    if record.get("result"):
        why += f"  -> {json.dumps(record['result'], sort_keys=True)}"
    return f"{at} {counter:>6} {record['event']:<11} {record['action']:<16} {record.get('target', '')}  {detail}{why}".rstrip()


def _config(args: argparse.Namespace) -> Any:
    from faultnet.chaos._plan import load_config
    from faultnet.errors import UsageError

    if args.time_unit <= 0:
        raise UsageError(f"--time-unit must be > 0 seconds, not {args.time_unit}")
    from faultnet.chaos._catalogue import PlanError

    try:
        config = load_config(
            args.plan,
            proxies=args.target or (),
            processes=args.process or (),
            servers=args.api or (),
            duration=args.duration,
            gap=tuple(args.gap) if args.gap else None,
        )
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if not config.proxies and not config.processes:
        raise UsageError(
            "no targets: name proxies (--target NAME or NAME@URL, or targets.proxies in the "
            "plan file) or processes (--process NAME)"
        )
    return config


def _seed(args: argparse.Namespace) -> tuple[int, bool]:
    from faultnet.chaos._draws import choose_seed

    return (args.seed, False) if args.seed is not None else (choose_seed(), True)


def _plan_command(args: argparse.Namespace) -> int:
    from faultnet.chaos._plan import make_plan

    seed, chosen = _seed(args)
    plan = make_plan(_config(args), seed, seed_chosen=chosen)
    if args.json:
        doc = {
            "seed": plan.seed,
            "seed_chosen": plan.seed_chosen,
            "config": plan.config.to_json(),
            "slots": [
                {
                    "index": s.index,
                    "counter": s.counter,
                    "at": s.at,
                    "fault": s.fault,
                    "target": s.target,
                    "duration": s.duration,
                    "detail": dict(s.detail),
                    **({"skip": s.skip} if s.skip else {}),
                }
                for s in plan.slots
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"seed {plan.seed} ({'chosen' if chosen else 'given'}), {len(plan.slots)} slots")
    for s in plan.slots:
        detail = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(s.detail.items()))
        what = f"skip ({s.skip})" if s.skip else f"{s.fault:<16} {s.target}"
        print(f"{s.at:>9.3f} #{s.counter:<5} {what}  for={s.duration} {detail}".rstrip())
    return 0


def _run_command(args: argparse.Namespace) -> int:
    import trio

    from faultnet.chaos._joinlog import JoinLog
    from faultnet.chaos._plan import make_plan
    from faultnet.chaos._rails import MARKER_NAME
    from faultnet.chaos._run import Runner, run_with_signals
    from faultnet.errors import EnvironmentProblem

    seed, chosen = _seed(args)
    plan = make_plan(_config(args), seed, seed_chosen=chosen)
    log_path = Path(args.log)
    marker = Path(args.marker) if args.marker else log_path.parent / MARKER_NAME
    try:
        log = JoinLog(log_path, seed=seed, dry=args.dry_run)
    except OSError as exc:  # nothing is touched without the log of it
        reason = exc.strerror or str(exc)
        raise EnvironmentProblem(f"cannot open the join log {log_path}: {reason}") from None
    log.on_record = lambda r: print(_fmt_record(r, args.json), flush=True)
    runner = Runner(
        plan,
        log,
        servers=args.api or (),
        allowlist=args.pids,
        dry=args.dry_run,
        armed=args.armed,
        marker=marker,
        time_unit=args.time_unit,
        allow_non_loopback=args.allow_non_loopback,
    )
    try:
        result = trio.run(run_with_signals, runner)
    finally:
        log.close()
    if result.refused:
        print(
            "faultnet: error: refused: the run is not armed "
            f"({next(r['reason'] for r in log.records if r['event'] == 'refuse' and r.get('rail') == 'unarmed')})",
            file=sys.stderr,
        )
    elif result.not_undone:
        print(
            f"faultnet: error: could not undo: {'; '.join(result.not_undone)} (see {log_path})",
            file=sys.stderr,
        )
    return result.exit_code


def _chaos(args: argparse.Namespace) -> int:
    return _plan_command(args) if args.verb == "plan" else _run_command(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "chaos",
        help="plan and run seeded faults on proxies and processes, with rails and a join log",
        description="Plan a seeded sequence of faults (every fault mode, every toxic, "
        "SIGKILL and SIGSTOP of allowlisted processes) and print it (plan), walk it "
        "through the rails without touching anything (--dry-run), or run it (--armed, with "
        "the marker file present). Every decision is one line of the join log. Exit 0 "
        "done, 1 a step failed or a fault was not undone, 2 usage error or unarmed run.",
    )
    p.add_argument(
        "verb", nargs="?", choices=("run", "plan"), default="run", help="run (default) or plan"
    )
    p.add_argument("--plan", metavar="FILE", help="plan file: TOML, or JSON if it ends in .json")
    p.add_argument("--seed", type=int, help="seed (chosen and logged when absent)")
    p.add_argument(
        "--target",
        action="append",
        metavar="PROXY",
        help="a proxy: NAME@URL, or NAME (on each --api server); repeatable",
    )
    p.add_argument(
        "--process",
        action="append",
        metavar="NAME",
        help="a process by its name in the --pids allowlist; repeatable",
    )
    p.add_argument(
        "--api",
        action="append",
        metavar="URL",
        help="a faultnet server (repeatable); each must be named by a target",
    )
    p.add_argument("--pids", metavar="FILE", help="PID allowlist: lines of pid<TAB>name")
    p.add_argument("--duration", type=float, metavar="UNITS", help="slots start before this")
    p.add_argument(
        "--gap", type=float, nargs=2, metavar=("MIN", "MAX"), help="units between slot starts"
    )
    p.add_argument(
        "--time-unit",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds per unit of every duration and gap (default 1; tests use 0.02)",
    )
    p.add_argument(
        "--log", default="chaos-log.jsonl", help="the join log (default ./chaos-log.jsonl)"
    )
    p.add_argument("--dry-run", action="store_true", help="touch nothing; log the attempts")
    p.add_argument("--armed", action="store_true", help="one of the two arming acts")
    p.add_argument(
        "--marker",
        metavar="FILE",
        help="the other arming act: this file must exist (default: .faultnet-chaos-armed beside the log)",
    )
    p.add_argument(
        "--allow-non-loopback", action="store_true", help="allow targets beyond loopback"
    )
    p.add_argument("--json", action="store_true", help="print records as JSON lines")
    p.set_defaults(func=_chaos)
