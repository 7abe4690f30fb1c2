"""``enclave-server`` / ``python -m harness.enclave``: run the server, or manage its registry.

    python -m harness.enclave --host 127.0.0.1 --port 0 --state DIR \\
        [--ping-interval S] [--ping-timeout S] [--flood-rate N] [--flood-burst N]
        [--excess-flood S] [--port-file PATH]
    python -m harness.enclave mint-leader --state DIR --nick NICK [--json]
    python -m harness.enclave bots --state DIR [--json]

Exit codes: 0 ok, 1 refused (e.g. mint-leader: nick taken), 2 usage or environment
error (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import trio

from faultnet.addresses import is_loopback
from harness.enclave._flood import FloodLimits
from harness.enclave._registry import Registry, RegistryError
from harness.enclave._server import EnclaveServer, ServerConfig

__all__ = ["main"]

PROG = "enclave-server"


def _number(text: str, *, zero_ok: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise argparse.ArgumentTypeError(f"must be {'>=' if zero_ok else '>'} 0: {text!r}")
    return value


def _positive(text: str) -> float:
    return _number(text)


def _rate(text: str) -> float:
    return _number(text, zero_ok=True)


def _count(text: str) -> int:
    value = _number(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


def _port(text: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 to 65535: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage dump (the front-door rule).
        self.exit(2, f"{self.prog}: error: {message} (try --help)\n")


def _serve_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Run the enclave IRC server on loopback (subcommands: mint-leader, bots; "
        "see `%(prog)s mint-leader --help`).",
    )
    p.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=0, help="TCP port; 0 picks a free one (default)")
    p.add_argument("--state", required=True, type=Path, help="state directory (registry)")
    p.add_argument(
        "--ping-interval",
        type=_positive,
        default=90.0,
        help="seconds of client silence before the server PINGs it (default 90)",
    )
    p.add_argument(
        "--ping-timeout",
        type=_positive,
        default=60.0,
        help="seconds to wait after that PING before dropping the client (default 60)",
    )
    p.add_argument(
        "--close-grace",
        type=_positive,
        default=2.0,
        help="seconds a closing client gets to take its final bytes (default 2)",
    )
    p.add_argument(
        "--flood-rate",
        type=_rate,
        default=100.0,
        help="lines per second a client may send once its burst is spent; more wait "
        "unread (0: no flood control; default 100)",
    )
    p.add_argument(
        "--flood-burst",
        type=_count,
        default=500,
        help="lines a client may send at once before the rate applies (default 500)",
    )
    p.add_argument(
        "--excess-flood",
        type=_positive,
        default=10.0,
        metavar="S",
        help="drop a client ('Excess Flood') whose lines have all waited for S seconds "
        "running (default 10)",
    )
    p.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write the bound port here (atomically) once listening",
    )
    return p


def _admin_parser(command: str) -> argparse.ArgumentParser:
    if command == "mint-leader":
        p = _Parser(
            prog=f"{PROG} mint-leader",
            description="Create an owner and its leader bot NICK; print the new token "
            "(64 hex). Exit 1 if the nick is taken.",
        )
        p.add_argument("--nick", required=True)
    else:
        p = _Parser(prog=f"{PROG} bots", description="List every bot in the registry.")
    p.add_argument("--state", required=True, type=Path, help="state directory (registry)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _admin(command: str, argv: Sequence[str]) -> int:
    args = _admin_parser(command).parse_args(argv)
    try:
        registry = Registry(args.state)
    except (OSError, sqlite3.Error) as exc:
        print(f"{PROG}: error: cannot open registry in {args.state}: {exc}", file=sys.stderr)
        return 2
    try:
        if command == "mint-leader":
            try:
                token = registry.mint_leader(args.nick)
            except RegistryError as exc:
                if args.json:
                    print(json.dumps({"ok": False, "code": exc.code, "error": exc.text}))
                print(f"{PROG}: {exc.code}: {exc.text}", file=sys.stderr)
                return 1 if exc.code == "NAME_TAKEN" else 2
            if args.json:
                print(json.dumps({"ok": True, "nick": args.nick, "token": token}))
            else:
                print(token)
            return 0
        bots = registry.bots()
        if args.json:
            print(json.dumps([b.__dict__ for b in bots]))
        else:
            for b in bots:
                state = "revoked" if b.revoked_at is not None else "registered"
                print(f"{b.nick}\t{b.role}\towner={b.owner}\texpires={b.expires_at}\t{state}")
        return 0
    finally:
        registry.close()


async def _run(config: ServerConfig) -> None:
    server = EnclaveServer(config)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(server.serve)
        # The plain line the contract promises (the JSON "listening" record precedes it).
        os.write(2, f"LISTENING {host} {port}\n".encode())
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                server.emit("signal", signum=int(signum), name=signal.Signals(signum).name)
                await server.close_all("Server shutting down")
                nursery.cancel_scope.cancel()
                break


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("mint-leader", "bots"):
        return _admin(argv[0], argv[1:])
    args = _serve_parser().parse_args(argv)
    # The flags named after ServerConfig fields carry over as they are.
    same = ("host", "port", "ping_interval", "ping_timeout", "close_grace", "port_file")
    config = ServerConfig(
        state_dir=args.state,
        flood=FloodLimits(args.flood_rate, args.flood_burst, args.excess_flood),
        **{name: getattr(args, name) for name in same},
    )
    if not is_loopback(args.host):
        print(
            f"{PROG}: error: refusing to listen on non-loopback host {args.host!r}", file=sys.stderr
        )
        return 2
    try:
        args.state.mkdir(parents=True, exist_ok=True)
        trio.run(_run, config)
    except (OSError, ValueError, sqlite3.Error) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:
        # Startup errors (bind failed, ...) arrive wrapped by the nursery: report the
        # first expected one as one line; anything else is a bug and keeps its traceback.
        expected = group.subgroup(lambda e: isinstance(e, OSError | ValueError | sqlite3.Error))
        if expected is None:
            raise
        first: BaseException = expected
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        print(f"{PROG}: error: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
