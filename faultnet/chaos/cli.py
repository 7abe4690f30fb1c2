"""``faultnet chaos``: plan a seeded run of faults, print it, or run it.

``faultnet chaos plan`` prints the plan (pure: nothing is read but the plan file);
``faultnet chaos [run] --dry-run`` walks the plan through every rail it can check
without touching anything and writes the join log; ``faultnet chaos [run] --armed``
with the marker file present runs it for real; ``faultnet chaos undo --log FILE`` undoes
what a killed run left in force (:mod:`faultnet.chaos._recover`); ``faultnet chaos
sample`` prints the sample plan file, which documents the format key by key.
See :mod:`faultnet.chaos`.

Everything a command line can get wrong is refused before anything runs (one line,
exit 2): a plan file that does not parse, a number that is not finite, a proxy target
"in this process" (which a CLI run never has: ``--api`` or ``NAME@URL``); for a run
(dry or real; ``plan`` reads no allowlist and asks no server) a process target without
``--pids``, a ``--pids`` file that is missing, malformed or does not list a process the
plan names, and a proxy its server does not have.

Exit codes: 0 done (steps a rail skipped included: they are decisions, logged); 1 a step
failed or a fault could not be undone; 2 a usage or environment error, or a real run
refused as unarmed; 128+N when signal N ended the run (every fault undone).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from faultnet.cliargs import examples

__all__ = ["SAMPLE_PLAN", "register"]

#: The sample plan file: the format, every key commented (``faultnet chaos sample``).
SAMPLE_PLAN = Path(__file__).with_name("sample-plan.toml")


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


def _config(args: argparse.Namespace, *, run: bool = True) -> Any:
    """The plan's config from the command line; a run's (*run*) allowlist checked too."""
    from faultnet.chaos._catalogue import PlanError
    from faultnet.chaos._plan import LOCAL, load_config, split_proxy_key
    from faultnet.errors import UsageError

    if not math.isfinite(args.time_unit) or args.time_unit <= 0:
        raise UsageError(f"--time-unit must be > 0 seconds, not {args.time_unit}")
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
    local = [split_proxy_key(k)[0] for k in config.proxies if split_proxy_key(k)[1] == LOCAL]
    if local:
        raise UsageError(
            f"proxy {local[0]} has no server: give --api URL (or {local[0]}@URL); "
            "a proxy in this process is for the Python API only"
        )
    if run:
        _check_pids(args, config.processes)
    return config


def _check_pids(args: argparse.Namespace, processes: Any) -> None:
    """The allowlist as a run would read it, refused now rather than skipped later."""
    from faultnet.chaos._allowlist import parse_lines
    from faultnet.errors import UsageError

    if args.pid_cwd is not None and not Path(args.pid_cwd).is_dir():
        raise UsageError(f"--pid-cwd {args.pid_cwd} is not a directory")
    if args.pids is None:
        if processes:
            raise UsageError(f"process {processes[0]} needs --pids FILE (the PID allowlist)")
        return
    path = Path(args.pids)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise UsageError(f"--pids {path}: {exc.strerror or exc}") from None
    lines, bad = parse_lines(text)
    if bad:
        raise UsageError(f"--pids {path} line {bad[0].line}: {bad[0].reason}")
    listed = {ln.name for ln in lines}
    missing = [p for p in processes if p not in listed]
    if missing:
        raise UsageError(f"process {missing[0]} is not in the allowlist {path}")


def _check_targets(args: argparse.Namespace, config: Any, marker: Path) -> list[str]:
    """Every proxy a run targets on a server must be there: a mistyped ``--target`` is
    refused now (one line naming the server's proxies) rather than skipped as absent at
    every step. Servers beyond loopback (without ``--allow-non-loopback``) are not
    asked, as the loopback rail skips their steps; nor is a server when a real run is
    refused as unarmed (nothing is touched; that refusal is said). A dry run that cannot
    reach a server goes on (a plan may be walked offline): the notes saying so are
    returned, to be printed once the run has its join log; a real run cannot."""
    from faultnet.chaos import _rails
    from faultnet.chaos._plan import LOCAL, split_proxy_key
    from faultnet.errors import EnvironmentProblem, UsageError
    from faultnet.server.client import ApiClient, ApiFailure, ApiUnavailable

    if not args.dry_run and _rails.check_armed(args.armed, marker) is not None:
        return []
    notes: list[str] = []
    wanted: dict[str, list[str]] = {}
    for key in config.proxies:
        name, where = split_proxy_key(key)
        if where == LOCAL:
            continue
        if _rails.check_loopback([_rails.url_host(where)], args.allow_non_loopback) is None:
            wanted.setdefault(where, []).append(name)
    for url, names in wanted.items():
        try:
            known = ApiClient(url, timeout=10.0).request("GET", "/proxies")
        except ApiUnavailable as exc:
            if not args.dry_run:
                raise EnvironmentProblem(f"cannot reach the faultnet server {url}: {exc}") from None
            notes.append(
                f"faultnet: note: {url} did not answer ({exc}): its targets are not checked"
            )
            continue
        except ApiFailure as exc:
            raise EnvironmentProblem(f"{url}/proxies: {exc.message} (HTTP {exc.status})") from None
        missing = [n for n in names if n not in known]
        if missing:
            there = ", ".join(sorted(known)) or "none"
            raise UsageError(f"no proxy {missing[0]} on {url} (its proxies: {there})")
    return notes


def _capped_note(plan: Any) -> None:
    from faultnet.chaos._plan import MAX_SLOTS

    if plan.capped:
        last = plan.slots[-1].at if plan.slots else 0
        print(
            f"faultnet: note: the plan stops at {MAX_SLOTS:,} slots (at {last:g} of "
            f"{plan.config.duration:g} units): widen the gap or shorten the duration",
            file=sys.stderr,
        )


def _seed(args: argparse.Namespace) -> tuple[int, bool]:
    from faultnet.chaos._draws import choose_seed

    return (args.seed, False) if args.seed is not None else (choose_seed(), True)


def _plan_command(args: argparse.Namespace) -> int:
    from faultnet.chaos._plan import make_plan

    seed, chosen = _seed(args)
    plan = make_plan(_config(args, run=False), seed, seed_chosen=chosen)
    _capped_note(plan)
    if args.json:
        doc = {
            "seed": plan.seed,
            "seed_chosen": plan.seed_chosen,
            "capped": plan.capped,
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
    config = _config(args)
    log_path = Path(args.log)
    marker = Path(args.marker) if args.marker else log_path.parent / MARKER_NAME
    notes = _check_targets(args, config, marker)
    plan = make_plan(config, seed, seed_chosen=chosen)
    _capped_note(plan)
    try:
        log = JoinLog(log_path, seed=seed, dry=args.dry_run)
    except OSError as exc:  # nothing is touched without the log of it
        reason = exc.strerror or str(exc)
        raise EnvironmentProblem(f"cannot open the join log {log_path}: {reason}") from None
    for note in notes:
        print(note, file=sys.stderr)
    log.on_record = _printer(args.json)
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
        pid_cwd=args.pid_cwd,
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


def _printer(as_json: bool) -> Any:
    """Print each record but the write-ahead ``intent`` lines (in the log only: a person
    reads each step once, as its ``fault`` line); once stdout is closed (``| head``),
    print nothing more and run on: the join log is the record, and a run stopped
    half-way would leave faults."""
    closed = False

    def show(record: dict[str, Any]) -> None:
        nonlocal closed
        if closed or record.get("event") == "intent":
            return
        try:
            print(_fmt_record(record, as_json), flush=True)
        except BrokenPipeError:
            closed = True
            _quiet_stdout()

    return show


def _quiet_stdout() -> None:
    # Python flushes stdout again at exit and would report the broken pipe then.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _undo_command(args: argparse.Namespace) -> int:
    import trio

    from faultnet.chaos._recover import recover

    undone, failed = trio.run(
        functools.partial(recover, Path(args.log), on_record=_printer(args.json))
    )
    print(f"faultnet: {undone} undone, {failed} could not be (see {args.log})", file=sys.stderr)
    return 1 if failed else 0


def _sample_command(args: argparse.Namespace) -> int:
    sys.stdout.write(SAMPLE_PLAN.read_text())
    return 0


def _chaos(args: argparse.Namespace) -> int:
    verbs = {"plan": _plan_command, "undo": _undo_command, "sample": _sample_command}
    return verbs.get(args.verb, _run_command)(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "chaos",
        help="plan and run seeded faults on proxies and processes, with rails and a join log",
        description="Plan a seeded sequence of faults (every fault mode, every toxic, "
        "SIGKILL and SIGSTOP of allowlisted processes) and print it (plan), walk it "
        "through the rails without touching anything (--dry-run), or run it (--armed, with "
        "the marker file present). Every decision is one line of the join log. Exit 0 "
        "done, 1 a step failed or a fault was not undone, 2 usage error or unarmed run.",
        epilog="Plan file format: `faultnet chaos sample` prints a sample plan with every "
        f"key explained ({SAMPLE_PLAN}). After a SIGKILL of chaos, `faultnet chaos undo "
        "--log FILE` undoes what the join log says it left in force.\n\n"
        + examples(
            "faultnet chaos sample > plan.toml",
            "faultnet chaos plan --seed 7 --plan plan.toml --api http://127.0.0.1:8474 --target db",
            "faultnet chaos --dry-run --seed 7 --plan plan.toml --api http://127.0.0.1:8474 "
            "--target db --log run/chaos-log.jsonl",
            "faultnet chaos undo --log run/chaos-log.jsonl",
        ),
    )
    p.add_argument(
        "verb",
        nargs="?",
        choices=("run", "plan", "undo", "sample"),
        default="run",
        help="run (default), plan (print it), undo (what a killed run left, from --log), "
        "sample (print the sample plan file)",
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
    p.add_argument(
        "--pids",
        metavar="FILE",
        help="PID allowlist: lines of pid<TAB>name[<TAB>start_time<TAB>cmdline], each "
        "pinned before the first fault",
    )
    p.add_argument(
        "--pid-cwd",
        metavar="DIR",
        help="refuse to signal a listed process whose working directory is not under DIR",
    )
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
