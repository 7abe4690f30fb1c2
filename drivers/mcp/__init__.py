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

from ._client import (
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MCPDriver,
    Notification,
    StdoutProblem,
    ToolResult,
    open_mcp,
)
from ._errors import (
    CallTimeout,
    MCPDriverError,
    ProcessExited,
    ProtocolError,
    ProtocolVersionError,
    RPCError,
    StartError,
)
from ._framing import DEFAULT_MAX_LINE_BYTES, LineFramer, Oversize
from ._process import CloseReport, CloseTimeouts, ServerProcess, StderrLine
from ._record import CALL_LOG_ENV, OUTCOMES, CallRecord

__all__ = [
    "CALL_LOG_ENV",
    "DEFAULT_MAX_LINE_BYTES",
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "OUTCOMES",
    "CallRecord",
    "CallTimeout",
    "CloseReport",
    "CloseTimeouts",
    "LineFramer",
    "MCPDriver",
    "MCPDriverError",
    "Notification",
    "Oversize",
    "ProcessExited",
    "ProtocolError",
    "ProtocolVersionError",
    "RPCError",
    "ServerProcess",
    "StartError",
    "StderrLine",
    "StdoutProblem",
    "ToolResult",
    "open_mcp",
]
