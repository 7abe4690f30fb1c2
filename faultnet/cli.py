"""The ``faultnet`` command: one argparse tree, each command group registered by the
module that implements it.

Exit codes, for every command: 0 ok, 1 a check failed, 2 usage or environment error.
A command handler returns its exit code; a :class:`UsageError` raised anywhere below a
handler is printed as one line on stderr and exits 2 (never a traceback for a user
mistake).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from faultnet._version import __version__

__all__ = ["UsageError", "main"]

#: Modules that contribute commands. Each has ``register(subparsers)`` which adds its
#: parsers and sets ``func`` (args -> exit code) on each.
COMMAND_MODULES = (
    "faultnet.cli_proxy",  # proxy control-test, probe
    "faultnet.server.cli",  # server and its client commands
    "faultnet.cli_demo",  # demo (composes harness)
)


class UsageError(Exception):
    """A user mistake: printed as one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultnet",
        description="Inject the network failures real networks have, and prove they are in force.",
    )
    parser.add_argument("--version", action="version", version=f"faultnet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except UsageError as exc:
        print(f"faultnet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
