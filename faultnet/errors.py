"""The two errors every command line of the project reports as one line and exit 2.

Every front door (``faultnet``, ``python -m drivers.mcp``, ``python -m harness.env``,
the experiments, the pair runner, ``scripts/bench``) raises these and nothing else for
a problem that is not a finding:

* :class:`UsageError`: the command line itself is wrong (a bad flag value, a missing
  argument, two options that exclude each other);
* :class:`EnvironmentProblem`: the command line is fine but the machine does not offer
  what it needs (no environment, a program not found, a port in use, a directory that
  cannot be written).

Both exit 2; a check that ran and failed exits 1 and is never one of these. Catch
:class:`CommandError` to handle both; :func:`fail` prints one the way every front
door does.
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["EXIT_USAGE", "CommandError", "EnvironmentProblem", "UsageError", "fail"]

#: The exit code of a usage or environment error, for every command.
EXIT_USAGE = 2


class CommandError(Exception):
    """A problem a command reports as one line and exit 2 (never a traceback)."""


class UsageError(CommandError):
    """A user mistake on the command line."""


class EnvironmentProblem(CommandError):
    """The machine lacks what the command needs (not a finding about what it measures)."""


def fail(prog: str, exc: BaseException, file: TextIO | None = None) -> int:
    """Print *exc* as ``PROG: error: MESSAGE`` on one line (stderr); return 2."""
    message = " ".join(str(exc).split())
    print(f"{prog}: error: {message}", file=file if file is not None else sys.stderr)
    return EXIT_USAGE
