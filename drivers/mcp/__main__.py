"""``python -m drivers.mcp``: start an MCP server, handshake, list its tools or call one.

Exit codes: 0 ok; 1 the tool answered ``isError`` or the server answered a JSON-RPC
error; 2 usage error, or the server could not be started, refused the handshake, exited,
or answered nothing in time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import trio

from faultnet.cliargs import positive_number
from faultnet.errors import EnvironmentProblem, UsageError, fail

from ._client import (
    HANDSHAKE_TIMEOUT_S,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MCPDriver,
    open_mcp,
)
from ._errors import MCPDriverError, RPCError
from ._record import CALL_LOG_ENV, resolve_dir

__all__ = ["build_parser", "main"]

PROG = "python -m drivers.mcp"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--list | --tool NAME [--arg KEY=VALUE ...]] [options] -- COMMAND [ARGS...]",
        description=(
            "Start the MCP server COMMAND on stdio, run the initialize handshake, then list "
            "its tools (--list), call one (--tool), or with neither print what the server "
            "said about itself; then close it (stdin EOF, SIGTERM, SIGKILL, exact PID only)."
        ),
        epilog=(
            "Exit status: 0 ok; 1 the tool answered isError or a JSON-RPC error; 2 usage "
            "error, or the server could not be started, exited, refused the handshake or "
            f"answered nothing in time. The call record goes to --call-log or ${CALL_LOG_ENV}."
        ),
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the server's tools")
    what.add_argument("--tool", metavar="NAME", help="call the tool NAME")
    parser.add_argument(
        "--arg",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a tool argument, as a string; KEY:=JSON passes a JSON value (number, "
        "true, object...). Repeatable.",
    )
    for flag, default, text in (
        ("--timeout", 10.0, "per-request timeout in seconds (default 10)"),
        (
            "--handshake-timeout",
            HANDSHAKE_TIMEOUT_S,
            f"timeout for the initialize answer (default {HANDSHAKE_TIMEOUT_S:g}: a"
            " server's start is its imports, seconds for an SDK server, more on a loaded"
            " machine)",
        ),
    ):
        parser.add_argument(flag, type=positive_number, default=default, metavar="S", help=text)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--call-log", metavar="DIR", help="write the call record in DIR")
    parser.add_argument(
        "--protocol-version",
        default=LATEST_HANDSHAKE_VERSION,
        choices=HANDSHAKE_VERSIONS,
        help=f"protocol version to offer (default {LATEST_HANDSHAKE_VERSION})",
    )
    parser.add_argument(
        "--show-stderr", action="store_true", help="copy the server's stderr to ours at the end"
    )
    return parser


def parse_tool_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` (a string) or ``KEY:=JSON`` (any JSON value) into a dict."""
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--arg {pair!r}: expected KEY=VALUE or KEY:=JSON")
        if key.endswith(":"):
            key = key[:-1]
            try:
                args[key] = json.loads(value)
            except ValueError as exc:
                raise UsageError(f"--arg {key}:= is not valid JSON: {exc}") from None
        else:
            args[key] = value
        if not key:
            raise UsageError(f"--arg {pair!r}: empty key")
    return args


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" not in argv:
        if any(a in ("-h", "--help") for a in argv):
            return argv, []
        raise UsageError("no server command: put it after --, e.g. -- mcp-server-time")
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def _first_line(text: object) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(payload, ensure_ascii=False, default=str))
    elif text:
        print(text)


async def _run(args: argparse.Namespace, command: list[str], tool_args: dict[str, Any]) -> int:
    drv: MCPDriver | None = None
    try:
        async with open_mcp(
            command,
            call_log_dir=args.call_log,
            timeout=args.timeout,
            handshake_timeout=args.handshake_timeout,
            protocol_version=args.protocol_version,
        ) as drv:
            base = {
                "server": drv.server_info,
                "protocolVersion": drv.protocol_version,
                "pid": drv.pid,
            }
            if args.list:
                tools = await drv.list_tools()
                lines = [f"{t.get('name')}\t{_first_line(t.get('description'))}" for t in tools]
                _emit(args, {"ok": True, **base, "tools": tools}, "\n".join(lines))
                return 0
            if args.tool:
                result = await drv.call_tool(args.tool, tool_args)
                _emit(
                    args,
                    {
                        "ok": not result.is_error,
                        **base,
                        "tool": args.tool,
                        "is_error": result.is_error,
                        "text": result.text,
                        "result": result.raw,
                        "seconds": round(result.seconds, 6),
                    },
                    result.text,
                )
                if result.is_error:
                    print(f"{PROG}: tool {args.tool} answered isError", file=sys.stderr)
                    return 1
                return 0
            info = drv.initialize_result
            _emit(
                args,
                {"ok": True, **base, "initialize": info},
                f"{drv.server_info.get('name', '?')} {drv.server_info.get('version', '')}".strip()
                + f"\nprotocol {drv.protocol_version}",
            )
            return 0
    except RPCError as exc:
        # An error answer to initialize means the server could not be started: 2.
        return _fail(args, exc, 1 if drv is not None else 2, exc.kind, code=exc.code)
    except MCPDriverError as exc:  # started, refused, exited, answered nothing in time...
        return _fail(args, exc, 2, exc.kind)
    finally:
        if args.show_stderr and drv is not None:
            sys.stderr.write(drv.stderr_text())
        if drv is not None and drv.notifications_dropped:
            print(
                f"{PROG}: note: the inbox dropped the oldest {drv.notifications_dropped} of "
                f"{drv.notification_count} notifications",
                file=sys.stderr,
            )


def _fail(args: argparse.Namespace, exc: Exception, status: int, kind: str, **extra: Any) -> int:
    message = " ".join(str(exc).split())  # one line, whatever the server wrote
    fail(PROG, exc)
    if args.json:
        print(json.dumps({"ok": False, "error": kind, "message": message, **extra}))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        opts, command = _split_command(argv)
        args = parser.parse_args(opts)
        if not command:
            raise UsageError("empty server command after --")
        if args.arg and not args.tool:
            raise UsageError("--arg needs --tool")
        tool_args = parse_tool_args(args.arg)
    except UsageError as exc:
        return fail(PROG, exc)
    directory = resolve_dir(args.call_log)
    if directory is not None:
        try:  # made before the server starts (open_mcp would raise the same OSError)
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            problem = EnvironmentProblem(
                f"cannot make the call log directory {directory}: {reason}"
            )
            return _fail(args, problem, 2, "call_log_error")
    try:
        return trio.run(_run, args, command, tool_args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
