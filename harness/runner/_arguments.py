"""The runner's arguments and environment: the flags every experiment takes, an
experiment's parser, and the environment an attempt runs in (a running one named by
``--state``, or with ``--env auto`` a private one brought down by its exact PID)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import trio

from faultnet.cliargs import examples
from faultnet.errors import EnvironmentProblem, UsageError
from faultnet.procs import stop_exact
from harness import env as envmod
from harness.experiment import TimeScale

__all__ = [
    "OneLineParser",
    "add_common_arguments",
    "build_parser",
    "check_environment",
    "environment",
]


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes raise :class:`UsageError` (the command prints it
    as one line and exits 2) instead of printing the usage dump and exiting itself:
    nothing is made (no run directory) before the arguments are known to be right."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (try --help)")


# --------------------------------------------------------------------------- arguments


def add_common_arguments(p: argparse.ArgumentParser, *, pair: bool = False) -> None:
    """The flags every experiment (and, with pair=True, the pair runner) takes."""
    if not pair:
        p.add_argument(
            "--bot-bin",
            metavar="CMD",
            help="command line of the bot under test (shlex-split); default: $BOT_BIN, "
            "or $APIARY_BIN (a stale alias of BOT_BIN, still accepted). Required: there is "
            "no default.",
        )
        envg = p.add_mutually_exclusive_group()
        envg.add_argument(
            "--state",
            metavar="DIR",
            type=Path,
            help="use the environment env-up wrote to DIR (state.env)",
        )
        envg.add_argument(
            "--env",
            choices=["auto"],
            help="bring up a private environment for each attempt and tear it down after",
        )
    p.add_argument(
        "--time-scale",
        metavar="F",
        help="scale every wait and every bot timing by F (default $HARNESS_TIME_SCALE or 1.0)",
    )
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run N attempts")
    p.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="seed of the first attempt (replays it); later attempts use S+1, S+2, ...",
    )
    p.add_argument("--out", type=Path, metavar="PATH", help="write the JSON result here")
    p.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help="the JSONL attempt report (default RUN_DIR/report.jsonl)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where attempts keep their evidence (default: a new directory under $TMPDIR)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the run directory of passing attempts too"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the JSON result on stdout (progress goes to stderr)",
    )


def build_parser(exp: ModuleType) -> argparse.ArgumentParser:
    """The command line of experiment *exp*: the common flags, then its own."""
    p = OneLineParser(
        prog=f"python -m harness.exp_{exp.NAME}",
        description=exp.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 every check passed, 1 a check failed, 2 usage or environment.\n\n"
        + examples(
            f"BOT_BIN='python -m harness.bot' python -m harness.exp_{exp.NAME} --env auto "
            "--time-scale 0.05"
        ),
    )
    add_common_arguments(p)
    exp.add_arguments(p)
    return p


# --------------------------------------------------------------------------- environment


def check_environment(args: argparse.Namespace) -> None:
    """EnvironmentProblem unless ``--env auto`` or the environment named (``--state``,
    else $ENCLAVE_STATE_DIR) has a running server. Called before any run directory is
    made: a run that cannot start must not leave one behind (it left the directory and
    a report of a run that never ran)."""
    if args.env != "auto":
        _running_env(args.state)


def _running_env(state: Path | None) -> envmod.EnvState:
    if state is None and os.environ.get("ENCLAVE_STATE_DIR"):
        state = Path(os.environ["ENCLAVE_STATE_DIR"])
    if state is None:
        raise EnvironmentProblem(
            "no environment: pass --state DIR (written by scripts/env-up.sh or "
            "python -m harness.env up; or set ENCLAVE_STATE_DIR), or --env auto"
        )
    try:
        st = envmod.read_state(state)
    except Exception as exc:
        raise EnvironmentProblem(
            f"no usable environment in {state}: {exc}; run scripts/env-up.sh (or "
            "python -m harness.env up) first, or pass --env auto"
        ) from None
    if not st.identity.is_alive():
        raise EnvironmentProblem(
            f"the environment's server (pid {st.pid}) is not running; run env-up again "
            "or pass --env auto"
        )
    return st


@contextlib.asynccontextmanager
async def environment(
    mode: str | None,
    state: Path | None,
    run_dir: Path,
    scale: TimeScale,
    say: Callable[[str], None],
) -> AsyncIterator[envmod.EnvState]:
    """Yield an EnvState: the one in *state* (or env's default), or, for mode "auto", a
    private one brought up under *run_dir* and brought down by its exact PID after."""
    if mode != "auto":
        yield await trio.to_thread.run_sync(_running_env, state)
        return
    env_dir = run_dir / "env"
    kwargs: dict[str, Any] = {}
    if scale.factor != 1.0:
        kwargs = {
            "ping_interval": scale.real("server_ping_interval"),
            "ping_timeout": scale.real("server_ping_timeout"),
        }
    try:
        st = await trio.to_thread.run_sync(lambda: envmod.up(env_dir, **kwargs))
    except Exception as exc:
        raise EnvironmentProblem(f"env up failed: {type(exc).__name__}: {exc}") from exc
    say(f"-- environment up: server pid {st.pid} on {st.host}:{st.port} (state {env_dir})")
    try:
        yield st
    finally:
        with trio.CancelScope(shield=True):
            try:
                rep = await trio.to_thread.run_sync(envmod.down, env_dir)
                say(f"-- environment down: {rep.message}")
                done = rep.outcome in ("stopped", "killed", "gone")
            except Exception as exc:
                say(f"-- environment down FAILED: {type(exc).__name__}: {exc}")
                done = False
            if not done:
                # Backstop: this run started the server, and its PID and start time (read
                # once at spawn) pin that one process, which is all stop_exact needs.
                stopped = await trio.to_thread.run_sync(stop_exact, st.identity)
                say(
                    f"-- environment down (backstop): server pid {st.pid} by its recorded "
                    f"PID and start time: {stopped.outcome}"
                )
