"""``enclave-bot`` / ``python -m harness.bot``: run the reference bot on stdio.

Exit status: 0 when the MCP client closes stdin, 2 for a usage or configuration error
(one line on stderr), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from harness.bot._config import DEFECTS, ENV_DOC, ConfigError, config_from_env

__all__ = ["build_parser", "main"]

PROG = "enclave-bot"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage dump: the caller is usually a harness log.
        self.exit(2, f"{PROG}: error: {message} (try --help)\n")


def build_parser() -> argparse.ArgumentParser:
    def shown(default: str | None) -> str:
        return (
            "(required)" if default is None else f"default {default!r}" if default else "(optional)"
        )

    env = "\n".join(f"  {name:<24}{shown(default):<20}{text}" for name, default, text in ENV_DOC)
    defects = "\n".join(f"  {name:<24}{text}" for name, text in DEFECTS.items())
    parser = _Parser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The faultnet reference bot: an MCP server on stdio that joins the enclave "
            "IRC server\n(or any standard IRC server) and offers the tools status, "
            "send-channel, spawn-worker\nand revoke-worker. Nothing but MCP is written to "
            "stdout; transport events go to\nstderr as 'BOTEVENT {json}'.\n\n"
            "Logging in (BOT_AUTH): as real bots do, SASL PLAIN when the server's CAP LS "
            "offers it,\nelse PASS <token> before NICK/USER (e.g. Debian's ngircd with a "
            "server password), and\nno credentials when ENCLAVE_TOKEN is empty. "
            "BOT_AUTH=sasl|pass|none forces one."
        ),
        epilog=f"environment (times in seconds, floats allowed):\n{env}\n\n"
        f"defects (each off unless given):\n{defects}\n\n"
        "exit status: 0 when stdin closes, 2 on a usage or configuration error.",
    )
    parser.add_argument(
        "--defect",
        action="append",
        default=[],
        metavar="NAME",
        choices=sorted(DEFECTS),
        help="switch one defect on (repeatable): " + ", ".join(DEFECTS),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_env(os.environ, args.defect)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    # The SDK logs through `logging`; keep it on stderr and off the BOTEVENT lines' format.
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"{PROG}: %(levelname)s %(name)s: %(message)s",
    )
    # Imported only now: the SDK costs ~1 s, which --help and a bad config need not pay.
    import anyio

    from harness.bot._server import serve

    try:
        anyio.run(serve, config, backend="trio")
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
