"""The driver's exceptions: one class per way a request can end other than with a result.

A tool that answers ``isError: true`` is *not* an exception: it is a result
(:class:`~drivers.mcp.ToolResult` with ``is_error``), because the tool did answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faultnet.procs import ProcessIdentity

__all__ = [
    "CallTimeout",
    "MCPDriverError",
    "ProcessExited",
    "ProtocolError",
    "ProtocolVersionError",
    "RPCError",
    "StartError",
]


class MCPDriverError(Exception):
    """Base class of every error the MCP driver raises."""

    #: The ``error`` field ``python -m drivers.mcp --json`` reports for this class.
    kind = "error"


class StartError(MCPDriverError):
    """The server command could not be executed (not found, not executable...)."""

    kind = "start_error"


class RPCError(MCPDriverError):
    """The server answered the request with a JSON-RPC error object."""

    kind = "rpc_error"

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: JSON-RPC error {code}: {message}")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class ProtocolError(MCPDriverError):
    """The server's answer is not a well-formed JSON-RPC response or MCP result."""

    kind = "protocol_error"


class ProtocolVersionError(MCPDriverError):
    """The server answered initialize with a protocol version this driver refuses."""

    kind = "protocol_version"

    def __init__(self, requested: str, offered: object, accepted: Sequence[str]) -> None:
        super().__init__(
            f"server counter-offered protocol version {offered!r} to our {requested!r}; "
            f"this driver speaks only the initialize-handshake versions {', '.join(accepted)}"
        )
        self.requested = requested
        self.offered = offered


class CallTimeout(MCPDriverError, TimeoutError):
    """No answer within the request's timeout.

    The driver has already sent ``notifications/cancelled`` for the request (except for
    ``initialize``, which the protocol forbids cancelling) and forgotten it: a late
    answer is recorded as such and otherwise ignored. The driver stays usable. The
    message says what the server was doing when the wait ran out (see
    :func:`server_words`); ``server_pid`` is its PID.
    """

    kind = "timeout"

    def __init__(
        self, method: str, timeout: float, request_id: int, server_pid: int, note: str = ""
    ) -> None:
        super().__init__(
            f"{method}: no answer within {timeout:g} s (request id {request_id}); "
            f"cancellation sent{note}"
            if method != "initialize"
            else f"initialize: no answer within {timeout:g} s{note}"
        )
        self.method = method
        self.timeout = timeout
        self.request_id = request_id
        self.server_pid = server_pid


def stderr_words(stderr_tail: Sequence[str]) -> str:
    """``; last stderr: a | b`` (or ``; no stderr``), the end of a message about a server."""
    tail = " | ".join(stderr_tail)
    return f"; last stderr: {tail}" if tail else "; no stderr"


def server_words(server: ProcessIdentity, stderr_tail: Sequence[str]) -> str:
    """What a server that has not answered was doing, for the end of a message:
    ``; the server (pid N) is sleeping in do_epoll_wait, 1.52 s of CPU in its 21.3 s;
    last stderr: ...``. The state tells a server waiting on something from one on (or
    queued for) a CPU and from a stopped one; the CPU it has used over its age tells a
    busy server from a starved one."""
    activity = server.activity()
    state = "gone" if activity is None else str(activity)
    return f"; the server (pid {server.pid}) is {state}{stderr_words(stderr_tail)}"


class ProcessExited(MCPDriverError):
    """The server process ended (or closed its stdout) before answering.

    Every request pending at that moment fails with this at once, and every later
    request fails with it immediately. ``returncode`` is None if the process closed its
    stdout but had not exited within the grace period; negative means killed by that
    signal.
    """

    kind = "process_exited"

    def __init__(self, pid: int, returncode: int | None, stderr_tail: Sequence[str]) -> None:
        status = (
            "closed its stdout but is still running"
            if returncode is None
            else f"exited with code {returncode}"
        )
        super().__init__(f"server (pid {pid}) {status}{stderr_words(stderr_tail)}")
        self.pid = pid
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)
