"""drivers.mcp: drive any MCP server over stdio, with a per-call record.

::

    async with open_mcp(["mcp-server-time", "--local-timezone", "UTC"]) as drv:
        tools = await drv.list_tools()
        result = await drv.call("get_current_time", timezone="UTC")
        print(result.text, result.is_error)

See :func:`open_mcp` for start/handshake/close semantics, :class:`MCPDriver` for
requests, timeouts and the notification inbox, and ``python -m drivers.mcp --help``
for the command line.
"""

from . import _errors
from ._client import (
    HANDSHAKE_TIMEOUT_S,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MCPDriver,
    Notification,
    RequestOptions,
    StdoutProblem,
    ToolResult,
    open_mcp,
)
from ._errors import *  # noqa: F403 (every error class: _errors.__all__ lists them)
from ._framing import DEFAULT_MAX_LINE_BYTES, LineFramer, Oversize
from ._inbox import DEFAULT_MAX_NOTIFICATIONS
from ._process import CloseReport, CloseTimeouts, ServerProcess, StderrLine
from ._record import CALL_LOG_ENV, OUTCOMES, CallRecord

__all__ = [
    "CALL_LOG_ENV",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_NOTIFICATIONS",
    "HANDSHAKE_TIMEOUT_S",
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "OUTCOMES",
    "CallRecord",
    "CloseReport",
    "CloseTimeouts",
    "LineFramer",
    "MCPDriver",
    "Notification",
    "Oversize",
    "RequestOptions",
    "ServerProcess",
    "StderrLine",
    "StdoutProblem",
    "ToolResult",
    "open_mcp",
    *_errors.__all__,
]
