"""The runner's attempts: one attempt of an experiment against one arm, the repeat
loop with logged seeds, the run directory, the result document and exit codes, and the
command (``amain``/``main``) an experiment module gets from :func:`commands`.

An experiment module (see :mod:`harness.experiment` for the API it is written against)
provides::

    NAME = "silent_loss"
    DESCRIPTION = "..."
    MAX_REAL_S = 400.0            # its longest scenario at time scale 1.0
    def add_arguments(parser): ...
    async def run(ctx: Context) -> None: ...   # fills ctx.result

and gets ``main(argv)`` (a console entry point) and ``amain(argv)`` (the same, awaitable
from a running trio loop, which the tests use to save interpreter start-ups) from here,
in one line: ``amain, main = runner.commands(__name__)``. Its arguments and environment
are :mod:`._arguments`'.

Exit codes: 0 every check of every attempt passed; 1 a check failed (or the bot under test
could not do its job); 2 usage or environment (no BOT_BIN, no environment, the bot is not
an MCP server, the harness's own machinery failed).
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, TypeVar

import trio

from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail
from faultnet.eventlog import JsonlWriter, flatten
from faultnet.interrupts import cancel_on_signals
from harness.experiment import (
    EXIT_ENV,
    EXIT_FAILED,
    EXIT_OK,
    Context,
    Result,
    RunProblem,
    TimeScale,
    attempt_seeds,
    render_result,
    resolve_bot_argv,
    time_scale_from,
)
from harness.report import publish_run
from harness.runner._arguments import build_parser, check_environment, environment
from harness.runner._supervisor import supervised

__all__ = [
    "CLEANED",
    "amain",
    "commands",
    "conclude",
    "default_run_dir",
    "main",
    "open_run",
    "repeat_attempts",
    "run_attempt",
    "run_cancellable",
    "writable_dir",
    "writable_file",
]

T = TypeVar("T")


# --------------------------------------------------------------------------- attempts


async def run_attempt(
    exp: ModuleType,
    args: argparse.Namespace,
    *,
    bot_argv: list[str],
    scale: TimeScale,
    seed: int,
    run_dir: Path,
    arm: str = "",
    out: TextIO | None = None,
) -> Result:
    """Run *exp* once against one arm; never raises for a failure of the bot or the
    environment (they become ``result.error``). Writes ``run_dir/result.json``.

    The environment is the one *args* names: ``args.env`` ("auto": a private one for
    this attempt) or ``args.state`` (the directory env-up wrote)."""
    out = out if out is not None else sys.stdout
    _mkdir(run_dir)
    result = Result(
        experiment=exp.NAME,
        arm=arm,
        bot_argv=list(bot_argv),
        seed=seed,
        time_scale=scale.factor,
        run_dir=str(run_dir),
    )
    prefix = f"[{arm}] " if arm else ""

    def say(msg: str) -> None:
        print(f"{prefix}{msg}", file=out, flush=True)

    t0 = time.monotonic()
    say(
        f"== {exp.NAME}: bot {shlex.join(bot_argv)} | time scale {scale.factor:g} | "
        f"seed {seed} | run dir {run_dir}"
    )
    ctx: Context | None = None
    try:
        # Everything the experiment waits for is bounded on its own; this is the
        # backstop so no attempt can hang a CI job.
        # Bots' starts extend it (Context.bot): they take the machine's time, not the
        # scenario's, and under load four bots one after another took 80 s.
        with trio.fail_after(
            scale.bound(getattr(exp, "MAX_REAL_S", 600.0), floor=60) + 60
        ) as backstop:
            async with environment(args.env, args.state, run_dir, scale, say) as env:
                ctx = Context(args, scale, bot_argv, env, run_dir, seed, result, out, prefix)
                ctx.backstop = backstop
                ctx.log.write("attempt", experiment=exp.NAME, arm=arm, bot_argv=bot_argv)
                await exp.run(ctx)
    except Exception as raw:
        exc = _leaf(raw)
        if isinstance(exc, EnvironmentProblem):
            result.error, result.error_kind = str(exc), "environment"
        elif isinstance(exc, RunProblem):
            result.error, result.error_kind = str(exc), "run"
        elif isinstance(exc, trio.TooSlowError):
            result.error = "the attempt exceeded its overall time bound"
            result.error_kind = "run"
        else:
            tb = "".join(traceback.format_exception(raw))
            (run_dir / "traceback.txt").write_text(tb)
            result.error = f"{type(exc).__name__}: {exc} (traceback in {run_dir / 'traceback.txt'})"
            result.error_kind = "run"
    finally:
        if ctx is not None:
            ctx.close()
    result.duration_s = round(time.monotonic() - t0, 3)
    if result.error:
        say(f"!! {result.error}")
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
    return result


def _leaf(exc: BaseException) -> BaseException:
    """The exception that matters inside nested exception groups (trio's nurseries wrap
    what a body raises): a harness verdict first, else the first leaf."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(exc)
    for kind in (EnvironmentProblem, RunProblem, trio.TooSlowError):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0] if leaves else exc


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def overall_exit(results: Sequence[Result]) -> int:
    """2 if any attempt could not measure (environment), else 1 if any failed, else 0."""
    if any(r.exit_code == EXIT_ENV for r in results):
        return EXIT_ENV
    if any(r.exit_code != EXIT_OK for r in results):
        return EXIT_FAILED
    return EXIT_OK if results else EXIT_ENV


def default_run_dir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"faultnet-{name}-"))


def finish_attempt_dir(
    run_dir: Path, passed: bool, keep: bool, say: Callable[[str], None]
) -> str | None:
    """Keep a failing attempt's directory (and say where); remove a passing one unless
    asked to keep it. Returns the kept path or None."""
    if passed and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        # Said: the attempt's first line printed this path, and a reader goes looking.
        say(f"attempt passed: its run directory {run_dir} is removed (--keep keeps it)")
        return None
    if not passed:
        say(f"!! attempt failed: evidence kept in {run_dir}")
    return str(run_dir)


async def amain(exp: ModuleType, argv: Sequence[str] | None = None) -> int:
    """The experiment command, awaitable: parse *argv*, run the attempts, print, exit code."""
    parser = build_parser(exp)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help, --version
        return int(exc.code or 0)
    except UsageError as exc:
        return fail(parser.prog, exc)
    out = sys.stderr if args.json else sys.stdout
    prog = parser.prog
    try:
        bot_argv = resolve_bot_argv(args.bot_bin)
        scale = time_scale_from(args.time_scale)
        if args.repeat < 1:
            raise UsageError("--repeat must be at least 1")
        check_args = getattr(exp, "check_arguments", None)
        if check_args is not None:
            check_args(args)
        check_environment(args)
        base, report = open_run(args, exp.NAME, experiment=exp.NAME)
    except (CommandError, ValueError) as exc:
        return fail(prog, exc)

    def attempt_end(res: Result, kept: str | None, seed: int) -> dict[str, Any]:
        res.run_dir = kept
        publish_run(kept, f"harness.exp_{exp.NAME}", argv, seed, out)
        return {
            "passed": res.passed,
            "exit_code": res.exit_code,
            "failed": [c.name for c in res.failed_checks()],
            "error": res.error,
        }

    results = await repeat_attempts(
        args,
        base,
        report,
        out,
        {"bot_argv": bot_argv, "time_scale": scale.factor},
        functools.partial(run_attempt, exp, args, bot_argv=bot_argv, scale=scale, out=out),
        render_result,
        lambda res: res.passed,
        attempt_end,
    )
    return conclude(
        exp.NAME,
        args,
        base,
        report,
        out,
        overall_exit(results),
        sum(r.passed for r in results),
        {"experiment": exp.NAME},
        [r.to_json() for r in results],
    )


def open_run(args: argparse.Namespace, name: str, **fields: Any) -> tuple[Path, JsonlWriter]:
    """The run's base directory (``--run-dir``, else a new one under $TMPDIR) and its JSONL
    report (``--report``, else RUN_DIR/report.jsonl), opened with *fields* in each record.

    ``--out``, the run directory and the report are all checked before any attempt runs:
    one that cannot be written is an EnvironmentProblem now, not an error after a run
    that passed."""
    if args.out is not None:
        writable_file(args.out, "--out")
    if args.run_dir is not None:
        writable_dir(args.run_dir, "--run-dir")
    base = args.run_dir or default_run_dir(name)
    path = args.report or base / "report.jsonl"
    try:
        return base, JsonlWriter(path, **fields)
    except OSError as exc:
        if args.run_dir is None:
            shutil.rmtree(base, ignore_errors=True)
        raise EnvironmentProblem(
            f"--report {path}: cannot write it: {exc.strerror or exc}"
        ) from None


def writable_dir(path: Path, flag: str) -> None:
    """Make directory *path* (and its parents) and prove a file can be created in it;
    EnvironmentProblem naming *flag* if not."""
    try:
        _probe_dir(path)
    except OSError as exc:
        raise EnvironmentProblem(
            f"{flag} {path}: cannot write there: {exc.strerror or exc}"
        ) from None


def writable_file(path: Path, flag: str) -> None:
    """Prove file *path* can be written later (its directory made, a file creatable there,
    *path* itself not a directory) without creating it; EnvironmentProblem if not."""
    try:
        _probe_dir(path.parent)
    except OSError as exc:
        raise EnvironmentProblem(f"{flag} {path}: cannot write it: {exc.strerror or exc}") from None
    if path.is_dir():
        raise EnvironmentProblem(f"{flag} {path}: is a directory")


def _probe_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
        pass


async def repeat_attempts(
    args: argparse.Namespace,
    base: Path,
    report: JsonlWriter,
    out: TextIO,
    start: dict[str, Any],
    attempt: Callable[..., Awaitable[T]],
    render: Callable[[T], str],
    passed: Callable[[T], bool],
    end: Callable[[T, str | None, int], dict[str, Any]],
) -> list[T]:
    """Run ``--repeat`` attempts, one seed each (see :func:`attempt_seeds`), each in its
    own directory under *base*: ``await attempt(seed=SEED, run_dir=DIR)``. Log
    ``attempt_start`` (with *start*) before each; after it, print what *render* makes of
    its outcome to *out* and log ``attempt_end`` (with what *end* makes of the outcome,
    its kept directory and its seed).
    The report is closed at the end, whatever happened."""
    outcomes: list[T] = []
    try:
        for i, seed in enumerate(attempt_seeds(args.repeat, args.seed), 1):
            # The seed is on disk before the attempt runs: a killed run still says how
            # to replay every attempt it started.
            report.write("attempt_start", attempt=i, seed=seed, **start)
            run_dir = base / f"attempt-{i:03d}-seed-{seed}"
            outcome = await attempt(seed=seed, run_dir=run_dir)
            print(render(outcome), file=out, flush=True)
            kept = finish_attempt_dir(
                run_dir, passed(outcome), args.keep, lambda m: print(m, file=out, flush=True)
            )
            report.write(
                "attempt_end",
                attempt=i,
                seed=seed,
                **end(outcome, kept, seed),
                run_dir=kept,
                replay=f"--seed {seed}",
            )
            outcomes.append(outcome)
    finally:
        report.close()
    return outcomes


def conclude(
    label: str,
    args: argparse.Namespace,
    base: Path,
    report: JsonlWriter,
    out: TextIO,
    code: int,
    npass: int,
    head: dict[str, Any],
    attempts: list[dict[str, Any]],
) -> int:
    """Say how many attempts passed (with ``--repeat``), write the result document, and
    return *code*.

    A run directory this run made for itself (no ``--run-dir``) is removed when every
    attempt passed, unless ``--keep``: passing runs leave nothing behind in $TMPDIR. The
    document's ``report`` is then null, unless ``--report`` put it elsewhere."""
    report_path: Path | None = report.path
    if args.run_dir is None and code == EXIT_OK and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
        if report_path is not None and not report_path.exists():
            report_path = None
    if args.repeat > 1:
        where = f"report {report_path}" if report_path else "passing: run directory removed"
        print(f"{label}: {npass}/{len(attempts)} attempts passed ({where})", file=out, flush=True)
    doc = {
        **head,
        "passed": code == EXIT_OK,
        "exit_code": code,
        "report": str(report_path) if report_path else None,
        "attempts": attempts,
    }
    write_result(doc, args)
    return code


def write_result(doc: dict[str, Any], args: argparse.Namespace) -> None:
    """Write the result document to ``--out`` (pretty) and, with ``--json``, to stdout
    (one line)."""
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str))
    if args.json:
        print(flatten(doc))


#: What an interrupted run says it did before exiting 128 + the signal number.
CLEANED = "cleaned up (processes stopped by PID)"


def run_cancellable(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """``trio.run(fn, *args)`` (an exit code), where SIGINT, SIGTERM or SIGHUP cancel the
    run cleanly (bots closed, workers revoked, a private environment brought down by its
    PID, none of which a default SIGTERM would do) and it exits 128 + the signal number
    (:func:`faultnet.interrupts.cancel_on_signals`)."""
    return trio.run(functools.partial(cancel_on_signals, cleaned=CLEANED), fn, *args)


def main(exp: ModuleType, argv: Sequence[str] | None = None) -> int:
    """The experiment command: :func:`amain` under a supervisor, so that nothing it
    starts outlives it, even killed with SIGKILL (:func:`supervised`)."""
    return supervised(functools.partial(run_cancellable, amain, exp, argv))


def commands(
    module_name: str,
) -> tuple[Callable[[Sequence[str] | None], Awaitable[int]], Callable[[Sequence[str] | None], int]]:
    """The experiment module *module_name*'s ``amain`` and ``main``; in the module::

        amain, main = _runner.commands(__name__)

    The module is looked up when a command runs, so this works under ``python -m`` too
    (where the module is ``__main__``).
    """

    async def exp_amain(argv: Sequence[str] | None = None) -> int:
        return await amain(sys.modules[module_name], argv)

    def exp_main(argv: Sequence[str] | None = None) -> int:
        return main(sys.modules[module_name], argv)

    return exp_amain, exp_main
