"""Run one experiment as a matched pair: the same workload against two arms, side by side.

    python -m harness.pair silent_loss --a 'python -m harness.bot --defect no-confirm' \\
        --b 'python -m harness.bot' --names pre,post --time-scale 0.05 [-- EXPERIMENT ARGS]

Each arm runs on a fresh private environment (``--env auto``) with the SAME seed, so the
two runs differ only in the program under test. The result prints every check and every
headline number of both arms in columns, and the internal control's drift between them.

A pair is refused (exit 2) when its two arms resolve to the same program and arguments
(the program is resolved through PATH and symlinks first): two identical arms produce
numbers that look like a result and measure nothing.

Exit 0 only if arm b passed every check AND the pair is comparable (every internal
control within its tolerance, every control check passing in both arms); 1 otherwise, with
a summary saying which arm failed which check; 2 for usage or environment.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from faultnet.cliargs import examples, plain
from faultnet.errors import CommandError, UsageError, fail
from harness import runner
from harness.experiment import (
    EXIT_ENV,
    EXIT_FAILED,
    EXIT_OK,
    Drift,
    Result,
    TimeScale,
    control_drift,
    render_side_by_side,
    resolve_bot_argv,
    resolved_program,
    time_scale_from,
)
from harness.report import publish_pair, replay_command

__all__ = [
    "EXPERIMENTS",
    "PairOutcome",
    "judge",
    "load_experiment",
    "main",
    "refuse_identical",
    "run_pair",
]

EXPERIMENTS = ("confirm_latency", "silent_loss", "chatty_vs_silent", "fd_flatness")


class PairRefused(UsageError):
    """The two arms would measure nothing (they are the same program and arguments)."""


def load_experiment(name: str) -> ModuleType:
    """``silent_loss``, ``silent-loss`` or ``exp_silent_loss`` -> harness.exp_silent_loss."""
    key = name.strip().replace("-", "_").removeprefix("harness.").removeprefix("exp_")
    if key not in EXPERIMENTS:
        raise UsageError(f"unknown experiment {name!r} (one of {', '.join(EXPERIMENTS)})")
    return importlib.import_module(f"harness.exp_{key}")


def refuse_identical(a: Sequence[str], b: Sequence[str]) -> None:
    """Raise PairRefused if argv *a* and *b* resolve to the same program and arguments."""
    ra, rb = resolved_program(a), resolved_program(b)
    if ra == rb:
        raise PairRefused(
            "refusing the pair: both arms resolve to the same program and arguments "
            f"({shlex.join(ra)}); a pair of identical arms looks like a result and measures "
            "nothing"
        )


@dataclass
class PairOutcome:
    """Two arms' results, judged."""

    a: Result
    b: Result
    drifts: list[Drift] = field(default_factory=list)
    #: Every internal control within tolerance and every control check passing in both.
    steady: bool = False
    b_passed: bool = False
    summary: str = ""

    @property
    def exit_code(self) -> int:
        if EXIT_ENV in (self.a.exit_code, self.b.exit_code):
            return EXIT_ENV
        return EXIT_OK if self.b_passed and self.steady else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.a.experiment,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "drifts": [d.__dict__ for d in self.drifts],
            "steady": self.steady,
            "b_passed": self.b_passed,
            "summary": self.summary,
            "exit_code": self.exit_code,
        }


def _arm_line(label: str, r: Result) -> str:
    """What one arm did, for the pair's summary."""
    # The arms by their names (the report's words: "the no-confirm arm"), not a/b.
    name = f"the {r.arm} arm" if r.arm else f"arm {label}"
    if r.error:
        return f"{name} did not complete: {r.error}"
    if r.passed:
        return f"{name} passed every check"
    return f"{name} failed: " + "; ".join(c.name for c in r.failed_checks())


def judge(a: Result, b: Result) -> PairOutcome:
    drifts = control_drift(a, b)
    moved = [d.name for d in drifts if not d.steady]
    bad_controls = [
        (r.arm or label, c.name)
        for label, r in (("a", a), ("b", b))
        for c in r.by_role("control")
        if not c.passed
    ]
    incomplete = [(r.arm or label) for label, r in (("a", a), ("b", b)) if r.error]
    steady = not moved and not bad_controls and not incomplete
    parts = [_arm_line(label, r) for label, r in (("a", a), ("b", b))]
    if moved:
        parts.append(
            "internal control MOVED: " + ", ".join(moved) + " (the arms are not comparable)"
        )
    elif bad_controls:
        parts.append(
            "a control failed: "
            + ", ".join(f"{n}: {c}" for n, c in bad_controls)
            + " (the arms are not comparable)"
        )
    elif not incomplete:
        parts.append("internal control steady")
    return PairOutcome(a, b, drifts, steady, b.passed, " | ".join(parts))


async def run_pair(
    exp: ModuleType,
    exp_args: argparse.Namespace,
    *,
    argv_a: list[str],
    argv_b: list[str],
    names: tuple[str, str],
    scale: TimeScale,
    seed: int,
    run_dir: Path,
    out: TextIO,
) -> PairOutcome:
    """Run *exp* against arm a, then arm b, each on a fresh environment, same seed.

    *exp_args* must say ``--env auto`` (both callers parse it so): that is what gives
    each arm its own environment."""
    results = []
    for argv, name in ((argv_a, names[0]), (argv_b, names[1])):
        res = await runner.run_attempt(
            exp,
            exp_args,
            bot_argv=argv,
            scale=scale,
            seed=seed,
            run_dir=run_dir / name,
            arm=name,
            out=out,
        )
        results.append(res)
    return judge(results[0], results[1])


def render_pair(p: PairOutcome) -> str:
    verdict = "PASS" if p.exit_code == EXIT_OK else "FAIL"
    return "\n".join([render_side_by_side(p.a, p.b, p.drifts), "", f"{verdict}: {p.summary}"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.pair",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=examples(
            "python -m harness.pair silent_loss --a 'python -m harness.bot --defect no-confirm' "
            "--b 'python -m harness.bot' --names no-confirm,fixed --time-scale 0.05",
        ),
    )
    p.add_argument("experiment", help=f"one of {', '.join(EXPERIMENTS)}")
    p.add_argument("--a", required=True, metavar="CMD", help="arm a: the bot command line")
    p.add_argument("--b", required=True, metavar="CMD", help="arm b: the bot command line")
    p.add_argument(
        "--names", default="a,b", metavar="A,B", help="the arms' names, e.g. pre,post (a,b)"
    )
    runner.add_common_arguments(p, pair=True)
    return p


def _split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _arm_names(text: str) -> tuple[str, str]:
    """The two arms' names of ``--names`` (UsageError unless two different ones)."""
    names = tuple(n.strip() for n in text.split(","))
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise UsageError("--names takes two different names, e.g. pre,post")
    return names[0], names[1]


def _check_pair_arguments(args: argparse.Namespace, rest: list[str]) -> None:
    """UsageError for a ``--repeat`` below 1, or an experiment argument (in *rest*)
    that the pair runner sets itself."""
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    for bad in ("--bot-bin", "--state", "--env"):
        if any(a == bad or a.startswith(bad + "=") for a in rest):
            raise UsageError(
                f"{bad} cannot be passed to the experiment: the pair runner sets the bot "
                "per arm and gives each arm a fresh environment"
            )


async def amain(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    own, rest = _split_passthrough(raw)
    parser = build_parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exc:
        return int(exc.code or 0)
    out = sys.stderr if args.json else sys.stdout
    try:
        exp = load_experiment(args.experiment)
        argv_a = resolve_bot_argv(args.a, environ={}, flag="--a")
        argv_b = resolve_bot_argv(args.b, environ={}, flag="--b")
        refuse_identical(argv_a, argv_b)
        names = _arm_names(args.names)
        scale = time_scale_from(args.time_scale)
        _check_pair_arguments(args, rest)
        exp_parser = runner.build_parser(exp)
        try:
            exp_args = exp_parser.parse_args([*rest, "--env", "auto"])
        except SystemExit as exc:
            return int(exc.code or EXIT_ENV)
        check = getattr(exp, "check_arguments", None)
        if check is not None:
            check(exp_args)
        base, report = runner.open_run(args, f"pair-{exp.NAME}", experiment=exp.NAME, pair=True)
    except (CommandError, ValueError) as exc:
        return fail("harness.pair", exc)

    def attempt_end(po: PairOutcome, kept: str | None, seed: int) -> dict[str, Any]:
        po.a.run_dir = po.b.run_dir = None
        if kept:
            po.a.run_dir, po.b.run_dir = f"{kept}/{names[0]}", f"{kept}/{names[1]}"
        publish_pair(kept, po, replay_command("harness.pair", raw, seed), out)
        return {
            "exit_code": po.exit_code,
            "steady": po.steady,
            "b_passed": po.b_passed,
            "failed": {
                names[0]: [c.name for c in po.a.failed_checks()],
                names[1]: [c.name for c in po.b.failed_checks()],
            },
            "summary": po.summary,
        }

    outcomes = await runner.repeat_attempts(
        args,
        base,
        report,
        out,
        {"arms": {names[0]: argv_a, names[1]: argv_b}, "time_scale": scale.factor},
        functools.partial(
            run_pair,
            exp,
            exp_args,
            argv_a=argv_a,
            argv_b=argv_b,
            names=names,
            scale=scale,
            out=out,
        ),
        render_pair,
        lambda po: po.exit_code == EXIT_OK,
        attempt_end,
    )
    codes = [o.exit_code for o in outcomes]
    code = EXIT_ENV if EXIT_ENV in codes else (EXIT_FAILED if EXIT_FAILED in codes else EXIT_OK)
    return runner.conclude(
        f"pair {exp.NAME}",
        args,
        base,
        report,
        out,
        code,
        codes.count(EXIT_OK),
        {"experiment": exp.NAME, "names": list(names)},
        [o.to_json() for o in outcomes],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The pair command under a supervisor, as every experiment runner: nothing it starts
    (servers, bots) outlives it, even killed with SIGKILL (:func:`runner.supervised`)."""
    return runner.supervised(functools.partial(runner.run_cancellable, amain, argv))


if __name__ == "__main__":
    sys.exit(main())
