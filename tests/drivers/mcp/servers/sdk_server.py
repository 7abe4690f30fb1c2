"""A small MCP server for the driver's tests, built on the official SDK (2.x) and run
under trio.

Tools: echo, fail, hang, progress, say, junk, ask, stderr, crash. Options:
``--ignore-eof`` keeps the process alive after its stdin closes (the server loop ends,
the process does not); ``--ignore-term`` also ignores SIGTERM, so only SIGKILL ends it.

Lines it prints on stderr (``hang start TAG``, ``hang cancelled TAG``, ``eof ignored``,
``ready``...) are what the tests wait for: each is a fact the server observed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

import anyio
import trio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# Logging and sampling are deprecated in the 2026 revision; this server speaks the
# handshake era on purpose, so the warnings are noise on the stderr the tests read.
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*deprecated.*")

# The SDK points fd 1 at stderr while it serves (stray prints miss the wire); keep a
# duplicate of the real stdout so the junk tool can write onto the wire on purpose.
WIRE_FD = os.dup(1)

# log_level ERROR: the SDK logs each failing tool (with a rich traceback) at INFO.
server = MCPServer("faultnet-test-server", log_level="ERROR")


def log(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@server.tool()
def echo(text: str) -> str:
    """Return TEXT unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Raise a tool error with MESSAGE: the call answers isError with that text."""
    raise ToolError(message)


@server.tool()
async def hang(seconds: float = 3600.0, tag: str = "") -> str:
    """Sleep SECONDS; says on stderr when it starts and when it is cancelled."""
    log(f"hang start {tag}")
    try:
        await trio.sleep(seconds)
    except BaseException:
        log(f"hang cancelled {tag}")
        raise
    return f"slept {seconds}"


@server.tool()
async def progress(steps: int, ctx: Context) -> str:
    """Report STEPS progress notifications, then answer."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
    return f"done {steps}"


@server.tool()
async def say(text: str, ctx: Context, as_dict: bool = False) -> str:
    """Send TEXT as a notifications/message (data a string, or {"text": TEXT})."""
    data: object = {"text": text, "channel": "#test"} if as_dict else text
    await ctx.info(data, logger_name="test")
    return "said"


@server.tool()
def junk(text: str = "this is not json") -> str:
    """Write TEXT as a raw line onto the stdout wire, then answer normally."""
    os.write(WIRE_FD, text.encode() + b"\n")
    return "junked"


@server.tool()
async def ask(kind: str, ctx: Context) -> str:
    """Send a server-to-client request (ping, roots, sampling, elicitation); report the answer."""
    from mcp_types import SamplingMessage, TextContent
    from pydantic import BaseModel

    class Answer(BaseModel):
        answer: str

    session = ctx.session
    try:
        if kind == "ping":
            result = await session.send_ping()
        elif kind == "roots":
            result = await session.list_roots()
        elif kind == "sampling":
            result = await session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
                max_tokens=5,
            )
        elif kind == "elicitation":
            result = await ctx.elicit("question?", Answer)
        else:
            return f"unknown kind {kind}"
    except Exception as exc:
        return f"{kind} error: {type(exc).__name__}: {exc}"
    return f"{kind} ok: {result!r}"


@server.tool()
def stderr(text: str) -> str:
    """Print TEXT on stderr."""
    log(text)
    return "printed"


@server.tool()
def crash(code: int = 3) -> str:
    """Exit the whole process at once with CODE, mid-call."""
    log(f"crashing with code {code}")
    os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ignore-eof", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    async def run() -> None:
        log("ready")
        await server.run_stdio_async()
        log("stdin closed")
        if args.ignore_eof:
            log("eof ignored")
            await trio.sleep_forever()

    anyio.run(run, backend="trio")


if __name__ == "__main__":
    main()
