"""The ``faultnet`` command: one argparse tree, each command group registered by the
module that implements it.

faultnet is the bottom layer, so it never imports the packages above it. Its own command
modules are listed in :data:`COMMAND_MODULES`; a package higher up (the harness's
``demo`` and ``report``) adds commands through the ``faultnet.commands`` entry-point
group, each entry naming a ``register(subparsers)`` function. A command whose package is
not installed is simply absent from ``--help``.

Exit codes, for every command: 0 ok, 1 a check failed, 2 usage or environment error.
A command handler returns its exit code; a :class:`UsageError` raised anywhere below a
handler is printed as one line on stderr and exits 2 (never a traceback for a user
mistake).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import entry_points
from typing import Any

from faultnet._version import __version__
from faultnet.cliargs import examples, keep_examples
from faultnet.errors import CommandError, UsageError, fail

__all__ = ["UsageError", "main"]  # UsageError: faultnet.errors's, re-exported

#: faultnet's own modules that contribute commands. Each has ``register(subparsers)``
#: which adds its parsers and sets ``func`` (args -> exit code) on each.
COMMAND_MODULES = (
    "faultnet.cli_proxy",  # proxy control-test, probe
    "faultnet.server.cli",  # server and its client commands
    "faultnet.chaos.cli",  # chaos: seeded fault plans, rails, join log
)
#: The entry-point group through which packages above faultnet add commands.
COMMAND_GROUP = "faultnet.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultnet",
        description="Inject the network failures real networks have, and prove they are in force.",
        epilog=examples(
            "faultnet server --detach",
            "faultnet create redis --listen 127.0.0.1:16379 --upstream 127.0.0.1:6379",
            "faultnet fault redis partition    # open connections blackholed, new ones hang",
            "faultnet fault redis thaw",
            "faultnet COMMAND --help           # each command's own examples",
        ),
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="show the version and the data plane a proxy would use here, and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _registrars():
        register(sub)
    keep_examples(parser)
    return parser


def version_line() -> str:
    """``faultnet 0.1.0 (data plane: native; built here: native, thread)``: the plane a
    proxy started now would use (``$FAULTNET_DATAPLANE`` or the fastest built)."""
    from faultnet.planes import available_planes, default_plane

    built, chosen = available_planes(), default_plane()
    if chosen not in built:  # a proxy would refuse to start: say why instead
        chosen = f"none, $FAULTNET_DATAPLANE={chosen!r} is not built here"
    return f"faultnet {__version__} (data plane: {chosen}; built here: {', '.join(built)})"


class _Version(argparse.Action):
    # argparse's own "version" action takes its text when the parser is built, for every
    # command; which planes are built is asked only when --version is given.
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_line())
        parser.exit()


def _registrars() -> Iterator[Callable[[Any], None]]:
    for name in COMMAND_MODULES:
        yield importlib.import_module(name).register
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name):
        yield ep.load()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The command line as given, for a command that starts itself again (server --detach).
    args.command_line = list(sys.argv[1:] if argv is None else argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(func(args))
        sys.stdout.flush()  # inside the try: a closed stdout shows here, not at exit
        return code
    except CommandError as exc:
        return fail("faultnet", exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed (`| head`): end quietly, as `yes | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, the shell's code for a writer whose reader left


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
