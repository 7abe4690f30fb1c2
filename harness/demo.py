"""``faultnet demo``: the whole idea in under two minutes.

Runs the silent_loss experiment as a matched pair against the reference bot, both arms
``python -m harness.bot`` with this interpreter: the no-confirm arm with its
``no-confirm`` defect (a post claims delivery as soon as it is written), the fixed arm as
shipped (a post waits for the server's confirmation). Each arm gets a fresh environment
(the enclave server, brought up and torn down by its exact PID), a faultnet proxy in
front of the worker, and a leader on a direct link that scores what it RECEIVED. The two
arms print side by side.

Exit 0 when the pair shows what it should: the no-confirm arm fails the targeted check
(it claimed deliveries that never arrived) while its controls pass, the fixed arm passes
every check, and the internal control holds between them. Exit 1 otherwise; 2 for usage
or environment.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from faultnet.cliargs import doc_command, examples
from faultnet.errors import UsageError
from harness.experiment import TimeScale, attempt_seeds

__all__ = ["demo_verdict", "register"]

DEFAULT_SCALE = 0.05
TARGET = "no post claimed a delivery it did not achieve"
EXAMPLE = examples(
    "faultnet demo",
    "faultnet demo --seed 7 --run-dir demo-run    # replay a seed, evidence kept there",
)
#: The command's line in `faultnet --help`.
HELP = "run the silent-loss pair: the reference bot with and without its defect"


def register(sub: Any) -> None:
    p = doc_command(sub, "demo", __doc__, HELP, EXAMPLE)
    p.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_SCALE,
        metavar="F",
        help=f"scale every wait and bot timing (default {DEFAULT_SCALE}; 1.0 is real time, "
        "about 3.5 minutes per arm: one silent_loss arm took 197 s here)",
    )
    p.add_argument("--seed", type=int, metavar="S", help="replay this seed")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="keep the evidence here")
    p.add_argument(
        "--keep",
        action="store_true",
        help="accepted for old scripts: the run directory and its report are always kept",
    )
    p.add_argument("--json", action="store_true", help="print the pair's JSON result on stdout")
    p.set_defaults(func=_run)


def demo_verdict(outcome: Any) -> tuple[bool, str]:
    """Did the pair show what the demo promises? (ok, one-line reason)."""
    a, b = outcome.a, outcome.b
    if a.error or b.error:
        return False, f"an arm did not complete: {a.error or b.error}"
    target_a = a.find(TARGET)
    if target_a is None or target_a.passed:
        return (
            False,
            "the no-confirm arm did NOT fail the silent-loss check: the demo showed nothing",
        )
    bad_a = [c.name for c in a.by_role("control") if not c.passed]
    if bad_a:
        return (
            False,
            f"the no-confirm arm's controls failed ({', '.join(bad_a)}): its failure means nothing",
        )
    if not b.passed:
        return False, "the fixed arm failed: " + "; ".join(c.name for c in b.failed_checks())
    if not outcome.steady:
        return False, "the internal control moved between arms: not comparable"
    return True, (
        "the no-confirm arm claimed deliveries that never arrived (its failing is the point: "
        "that is the defect); the fixed arm said UNCONFIRMED instead; both arms' controls passed"
    )


def _replay(seed: int, scale: TimeScale) -> str:
    return shlex.join(
        [
            sys.executable,
            "-m",
            "faultnet",
            "demo",
            "--seed",
            str(seed),
            "--time-scale",
            f"{scale.factor:g}",
        ]
    )


def _run(args: argparse.Namespace) -> int:
    # Here, not at the top: `register` runs on every `faultnet` call, and these import
    # trio, the proxy and the environment (0.2 s, measured with -X importtime).
    from harness import pair, report, runner

    try:
        scale = TimeScale(args.time_scale)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = sys.stderr if args.json else sys.stdout
    exp = pair.load_experiment("silent_loss")
    exp_args = runner.build_parser(exp).parse_args(["--env", "auto"])
    argv_a = [sys.executable, "-m", "harness.bot", "--defect", "no-confirm"]
    argv_b = [sys.executable, "-m", "harness.bot"]
    seed = args.seed if args.seed is not None else attempt_seeds(1, None)[0]
    if args.run_dir is not None:
        runner.writable_dir(args.run_dir, "--run-dir")  # before the run, not after it
    base = args.run_dir or runner.default_run_dir("demo")
    print(
        "faultnet demo: does a post made during an outage claim a delivery it never achieved?\n"
        f"  the no-confirm arm: {' '.join(argv_a)}\n"
        f"  the fixed arm:      {' '.join(argv_b)}\n"
        f"  time scale {scale.factor:g}, seed {seed}, evidence in {base}",
        file=out,
        flush=True,
    )
    done: list[Any] = []

    async def both_arms() -> int:
        done.append(
            await pair.run_pair(
                exp,
                exp_args,
                argv_a=argv_a,
                argv_b=argv_b,
                names=("no-confirm", "fixed"),
                scale=scale,
                seed=seed,
                run_dir=base,
                out=out,
            )
        )
        return 0

    # A signal cancels the pair cleanly: bots closed, environments down by PID. Under a
    # supervisor, as every runner: even a SIGKILL of this process leaves none of them.
    # The runner (the supervisor's child) returns here with the outcome and goes on to
    # report it; the supervisor returns with none, once the runner has exited, and exits
    # with its status.
    code = runner.supervised(functools.partial(runner.run_cancellable, both_arms))
    if not done:
        return code
    outcome = done[0]
    print("", file=out)
    print(pair.render_pair(outcome), file=out, flush=True)
    ok, why = demo_verdict(outcome)
    env_problem = 2 in (outcome.a.exit_code, outcome.b.exit_code)
    print(f"\n{'DEMO OK' if ok else 'DEMO FAILED'}: {why}", file=out, flush=True)
    # Kept whatever the verdict: the report drawn from it is the demo's last word.
    report.publish_pair(base, outcome, _replay(seed, scale), out, verdict=(ok, why))
    if args.json:
        doc = outcome.to_json()
        doc["demo_ok"], doc["demo_reason"] = ok, why
        print(json.dumps(doc, default=str))
    if env_problem:
        return 2
    return 0 if ok else 1
