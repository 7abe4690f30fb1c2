"""Helpers the experiment API and the runner share: the RunProblem verdict,
percentiles, BOT_BIN as an argv, fresh nicks, attempt seeds."""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence

from faultnet.errors import EnvironmentProblem, UsageError

__all__ = [
    "RunProblem",
    "attempt_seeds",
    "check_reference_bot",
    "pct",
    "resolve_bot_argv",
    "resolved_program",
    "unique_nick",
]


class RunProblem(Exception):
    """The bot under test could not do its job (exit 1): it never connected, a spawn
    it needed failed. Recorded as the run's error; every check counts as failed."""


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile *p* (0-100) of *values*; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    i = min(len(xs) - 1, max(0, round(p / 100.0 * (len(xs) - 1))))
    return xs[i]


def resolve_bot_argv(
    cli_value: str | None, environ: Mapping[str, str] | None = None, flag: str = "--bot-bin"
) -> list[str]:
    """BOT_BIN as an argv: from --bot-bin, else BOT_BIN, else APIARY_BIN (an alias).

    Raises EnvironmentProblem with the reason when it is missing, empty, unparseable, or
    its program cannot be found. There is no default on purpose: a pair whose two arms
    silently ran the same default program would look like a result.
    """
    env = os.environ if environ is None else environ
    raw, source = cli_value, flag
    if raw is None:
        for name in ("BOT_BIN", "APIARY_BIN"):
            if env.get(name):
                raw, source = env[name], name
                break
    if raw is None or not raw.strip():
        raise EnvironmentProblem(
            "BOT_BIN is required and has no default: set BOT_BIN (or APIARY_BIN) or pass "
            "--bot-bin to the command line of the bot under test, e.g. "
            f"BOT_BIN='{shlex.quote(sys.executable)} -m harness.bot'"
        )
    try:
        argv = shlex.split(raw)
    except ValueError as exc:
        raise EnvironmentProblem(f"{source}: cannot parse {raw!r}: {exc}") from None
    if not argv:
        raise EnvironmentProblem(f"{source} is empty")
    if shutil.which(argv[0]) is None:
        raise EnvironmentProblem(f"{source}: program not found or not executable: {argv[0]!r}")
    check_reference_bot(argv, source)
    return argv


def check_reference_bot(argv: Sequence[str], source: str = "--bot-bin") -> None:
    """UsageError if *argv* runs the reference bot (``enclave-bot``, ``PYTHON -m
    harness.bot``) with a defect it does not have. Such a bot exits 2 at once, but an
    experiment learned it only by waiting out the MCP handshake: a mistyped ``--defect``
    in a pair ran one arm for 15 s before its exit 2. Any other program is not checked."""
    if not argv:
        return
    if os.path.basename(argv[0]) == "enclave-bot":
        rest = list(argv[1:])
    else:
        at = next(
            (i for i in range(1, len(argv) - 1) if argv[i : i + 2] == ["-m", "harness.bot"]), None
        )
        if at is None:
            return
        rest = list(argv[at + 2 :])
    from harness.bot import DEFECTS  # the bot's own list, read only for its command lines

    names = []
    for i, arg in enumerate(rest):
        if arg == "--defect":
            names.append(rest[i + 1] if i + 1 < len(rest) else "")
        elif arg.startswith("--defect="):
            names.append(arg.split("=", 1)[1])
    for name in names:
        if name not in DEFECTS:
            raise UsageError(
                f"{source}: the reference bot has no defect {name!r} (one of {', '.join(DEFECTS)})"
            )


def resolved_program(argv: Sequence[str]) -> list[str]:
    """*argv* with its program resolved through PATH and symlinks, for comparing arms."""
    found = shutil.which(argv[0])
    prog = os.path.realpath(found) if found else argv[0]
    return [prog, *argv[1:]]


def unique_nick(prefix: str) -> str:
    """A nick never used before on any server: revoked nicks stay burned, so a nick is
    never derived from the seed (a replay would collide with its own original)."""
    return f"{prefix}{secrets.token_hex(3)}"


def attempt_seeds(n: int, seed: int | None) -> list[int]:
    """Seeds for *n* attempts: ``seed, seed+1, ...`` when one is given (so ``--seed S``
    replays attempt 1 of a run whose first seed was S), else fresh random 32-bit seeds."""
    if seed is not None:
        return [seed + i for i in range(n)]
    return [secrets.randbits(32) for _ in range(n)]
