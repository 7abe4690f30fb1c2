"""The MCP stdio client: handshake, requests with bounded waits, and an inbox.

One :class:`MCPDriver` drives one server process. Two background tasks (in the nursery
:func:`open_mcp` owns) read the server's stdout and stderr for as long as it lives, so
notifications, server-to-client requests and log lines are taken in even while no call
is waiting.

Requests are built with jsonrpcclient from a per-driver id counter (1, 2, 3...); answers
are parsed with it. The server numbers its own requests independently (the official SDK
from 0 or 1), so the same number can be in flight both ways at once: a message with a
``method`` is the server's (a request if it has an ``id``, else a notification); a
message without one is an answer to us, routed by id. The two spaces never meet.

Timing semantics:

* every request has a timeout (the driver's default, or per call). When it expires the
  driver sends ``notifications/cancelled``, forgets the request and raises
  :class:`CallTimeout`; a late answer is recorded and dropped. No reply never means
  waiting forever;
* if the caller's own cancel scope cancels a request, the driver sends
  ``notifications/cancelled`` too (bounded, shielded), records ``cancelled`` and lets
  the cancellation propagate;
* when the server's stdout closes, or the server process exits (even if a grandchild
  keeps its stdout open), every pending request fails at once with
  :class:`ProcessExited`, carrying the exit code and the last stderr lines; later
  requests fail with it immediately.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, Unpack

import trio
from jsonrpcclient import Error, Ok, notification, parse
from jsonrpcclient.id_generators import decimal
from jsonrpcclient.requests import request_impure

from faultnet import __version__
from faultnet.eventlog import flatten
from faultnet.procs import ProcessIdentity

from ._errors import (
    CallTimeout,
    MCPDriverError,
    ProcessExited,
    ProtocolError,
    ProtocolVersionError,
    RPCError,
    server_words,
)
from ._framing import DEFAULT_MAX_LINE_BYTES, LineFramer, Oversize
from ._inbox import (
    DEFAULT_MAX_NOTIFICATIONS,
    Inbox,
    Notification,
    NotificationMatch,
    StdoutProblem,
)
from ._process import DEFAULT_CLOSE_TIMEOUTS, CloseReport, CloseTimeouts, ServerProcess, StderrLine
from ._record import CallRecord, resolve_dir

__all__ = [
    "HANDSHAKE_VERSIONS",
    "LATEST_HANDSHAKE_VERSION",
    "MCPDriver",
    "Notification",
    "RequestOptions",
    "StdoutProblem",
    "ToolResult",
    "open_mcp",
]

#: Protocol versions negotiated with the initialize handshake, oldest first. The next
#: revision (2026-07-28) drops the handshake; a server counter-offering it, or anything
#: not listed here, is refused.
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[-1]

#: How long a server has to answer ``initialize`` unless told otherwise. A start is the
#: server's imports (an MCP SDK server reads hundreds of files): the machine's CPU and
#: disk, not the server's logic. Measured for the reference bot (an SDK server): 1-2.5 s
#: idle; three at once beside stress-ng on both CPUs (load 5-8), 8.6-18.8 s; three fleet
#: runs side by side under the same (load 7-10), 2.8-23.2 s (p90 20.0, 45 starts). And
#: over 20 s with 0.86 s of CPU spent, the rest in an uninterruptible wait in
#: ext4_read_bh: this machine drops file pages though memory is free (a fresh venv's
#: files found uncached minutes after they were written), and the report test's
#: Chromium, started cold, reads ~13,000 blocks in ~8 s (0.03-0.29 s a read, per-second
#: means), a process starting beside it waiting behind them. The former 20 s failed
#: suite runs under load and beside that Chromium; 60 s is 2.6x the longest start
#: measured to its end, and the MCP TypeScript SDK's own default request timeout.
HANDSHAKE_TIMEOUT_S = 60.0

#: JSON-RPC "method not found": our answer to server requests we do not support.
METHOD_NOT_FOUND = -32601

#: After stdout closes, how long to wait for the exit status before failing the pending
#: requests without it. A process that died has already exited when its pipe closes
#: (measured here: pending calls fail ~10 ms after an os._exit), so this bound only
#: matters for a server that closed its stdout and lives on.
EXIT_GRACE_S = 2.0
#: After the process exits with its stdout still open (a grandchild holds it), how long
#: the reader gets to route what the server wrote last before pending requests fail.
EXIT_DRAIN_S = 0.5
#: Bound on sending notifications/cancelled (the pipe may be full if the server stopped
#: reading).
CANCEL_SEND_S = 1.0


class RequestOptions(TypedDict, total=False):
    """The keywords of one request (:meth:`MCPDriver.request`, :meth:`MCPDriver.call_tool`),
    each optional."""

    #: Seconds to wait for the answer, writing the request included (None: the driver's).
    timeout: float | None
    #: Called with each progress notification's params (MCP progress).
    on_progress: Callable[[dict[str, Any]], None] | None


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer.

    ``text`` joins the ``text`` of every text content item with newlines; ``is_error``
    is the result's ``isError``; ``raw`` is the whole result object. ``progress`` holds
    the params of every ``notifications/progress`` received for the call.
    """

    text: str
    is_error: bool
    raw: dict[str, Any]
    progress: tuple[dict[str, Any], ...] = ()
    seconds: float = 0.0


#: How much of a tool result's text the call record keeps: enough for the claim a
#: result makes ("Broadcast to #chan", "UNCONFIRMED: ..."), not a whole document.
RESULT_TEXT_MAX = 500


def _result_text(result: dict[str, Any]) -> str:
    """The ``text`` of every text content item of a tool result, joined with newlines."""
    content = result.get("content", [])
    return "\n".join(
        item["text"]
        for item in (content if isinstance(content, list) else [])
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    )


@dataclass
class _Pending:
    request_id: int
    method: str
    progress_token: str | None
    on_progress: Callable[[dict[str, Any]], None] | None
    done: trio.Event = field(default_factory=trio.Event)
    response: Ok | Error | None = None
    failure: MCPDriverError | None = None
    progress: list[dict[str, Any]] = field(default_factory=list)
    #: The first exception the caller's on_progress raised (it runs in the reader task,
    #: which must not die of it); re-raised to the caller once the request ends.
    callback_error: Exception | None = None

    def settle(
        self, response: Ok | Error | None = None, failure: MCPDriverError | None = None
    ) -> None:
        if self.done.is_set():
            return
        self.response = response
        self.failure = failure
        self.done.set()

    def result(self) -> Any:
        """The settled request's ``result``, or what ended it raised."""
        if self.failure is not None:
            raise self.failure
        if self.callback_error is not None:
            raise self.callback_error
        response = self.response
        if isinstance(response, Error):
            raise RPCError(self.method, response.code, response.message, response.data)
        assert isinstance(response, Ok)
        return response.result


@dataclass
class _CallRecord:
    """What the call log says about one request (MCP's rules: a ``tools/call`` is logged
    by its tool and arguments, its result text kept, ``isError`` its outcome): its
    fields, in their order, are the log line's."""

    method: str
    tool: str | None
    arguments: Any
    outcome: str = "ok"
    error_code: int | None = None
    error_message: str | None = None
    result_text: str | None = None

    @classmethod
    def of(cls, method: str, params: dict[str, Any]) -> _CallRecord:
        if method == "tools/call":
            return cls(method, params.get("name"), params.get("arguments", {}))
        # The progress token is the driver's, not the caller's: not logged.
        return cls(method, None, {k: v for k, v in params.items() if k != "_meta"})

    def answered(self, result: Any) -> None:
        if self.method == "tools/call" and isinstance(result, dict):
            self.result_text = _result_text(result)[:RESULT_TEXT_MAX]
            if result.get("isError"):
                self.outcome = "is_error"

    def failed(self, exc: BaseException, pending: _Pending) -> None:
        if exc is pending.callback_error:
            self.outcome, self.error_message = "error", f"on_progress raised {exc!r}"
        elif isinstance(exc, trio.Cancelled):
            self.outcome = "cancelled"
        elif isinstance(exc, CallTimeout):
            self.outcome, self.error_message = "timeout", str(exc)
        elif isinstance(exc, ProcessExited):
            self.outcome, self.error_message = "process_exited", str(exc)
            self.error_code = exc.returncode
        elif isinstance(exc, RPCError):
            self.outcome, self.error_code, self.error_message = "error", exc.code, exc.message
        elif isinstance(exc, ProtocolError):
            self.outcome, self.error_message = "error", str(exc)


class MCPDriver:
    """Drives one MCP server over stdio. Make one with :func:`open_mcp`."""

    def __init__(
        self,
        proc: ServerProcess,
        nursery: trio.Nursery,
        *,
        timeout: float,
        call_log_dir: str | os.PathLike[str] | None,
        max_line_bytes: int,
        close_timeouts: CloseTimeouts,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
    ) -> None:
        self._proc = proc
        self._nursery = nursery
        self.timeout = timeout
        self.close_timeouts = close_timeouts
        self._max_line_bytes = max_line_bytes
        self._ids = decimal(1)
        self._progress_ids = decimal(1)
        self._pending: dict[int, _Pending] = {}
        self._by_token: dict[str, _Pending] = {}
        self._abandoned: set[int] = set()
        self._send_lock = trio.Lock()
        self._inbox = Inbox(max_notifications)
        #: Set when the server's stdout has closed (nothing more will arrive).
        self.stdout_closed = self._inbox.closed
        self._exited: ProcessExited | None = None
        self._closed = False
        self.record = CallRecord(call_log_dir, proc.identity, proc.argv)
        #: The initialize result, once the handshake is done.
        self.initialize_result: dict[str, Any] = {}

    # -- identity and process state --------------------------------------------------

    @property
    def identity(self) -> ProcessIdentity:
        """The exact server process (PID + start time)."""
        return self._proc.identity

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def process(self) -> ServerProcess:
        return self._proc

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def alive(self) -> bool:
        return self._proc.alive()

    def fd_count(self) -> int | None:
        """Descriptors the server holds now (``/proc/PID/fd``); None once it is gone."""
        return self._proc.fd_count()

    @property
    def call_log_path(self) -> os.PathLike[str] | None:
        """The call-record file, or None when not recording."""
        return self.record.path

    @property
    def protocol_version(self) -> str | None:
        return self.initialize_result.get("protocolVersion")

    @property
    def server_info(self) -> dict[str, Any]:
        return dict(self.initialize_result.get("serverInfo") or {})

    @property
    def server_capabilities(self) -> dict[str, Any]:
        return dict(self.initialize_result.get("capabilities") or {})

    # -- stdout ---------------------------------------------------------------------

    async def _read_stdout(self) -> None:
        framer = LineFramer(self._max_line_bytes)
        stream = self._proc.stdout
        try:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                for item in framer.feed(data):
                    self._on_line(item)
            for item in framer.end():
                self._on_line(item)
        finally:
            self._inbox.close()
        await self._on_stdout_closed()

    async def _on_stdout_closed(self) -> None:
        with trio.move_on_after(EXIT_GRACE_S):
            await self._proc.wait()
        await self._settle_exited()

    async def _watch_exit(self) -> None:
        """Fail the pending requests when the server process exits, whether or not its
        stdout closes: a grandchild that inherited the pipe can hold it open for as long
        as it lives, and the requests would otherwise wait for their timeouts."""
        await self._proc.wait()
        # What the server wrote before it exited is in the pipe: let the reader route it.
        with trio.move_on_after(EXIT_DRAIN_S):
            await self.stdout_closed.wait()
        if not self.stdout_closed.is_set():
            self.record.event("stdout_held_open", returncode=self._proc.returncode)
            await self._settle_exited()

    async def _settle_exited(self) -> None:
        # The exit closed stderr too; give the reader a moment to take the last lines.
        with trio.move_on_after(0.5):
            await self._proc.stderr_closed.wait()
        self._exited = ProcessExited(self.pid, self._proc.returncode, self._proc.stderr_tail(5))
        for pending in list(self._pending.values()):
            pending.settle(failure=self._dead())

    def _problem(self, kind: str, detail: str, raw: bytes | str) -> None:
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        problem = StdoutProblem(time.time(), kind, detail, text[:200])
        self._inbox.add_problem(problem)
        self.record.event("stdout_problem", kind=kind, detail=detail, excerpt=problem.excerpt)

    def _on_line(self, item: bytes | Oversize) -> None:
        if isinstance(item, Oversize):
            self._problem(
                "oversize_line",
                f"line of {item.size} bytes exceeds the {self._max_line_bytes}-byte limit; dropped",
                item.head,
            )
            return
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._problem("invalid_utf8", str(exc), item)
            return
        try:
            message = json.loads(text)
        except ValueError as exc:
            self._problem("invalid_json", str(exc), text)
            return
        # A batch (2025-03-26 allowed them): each element is handled on its own.
        for msg in message if isinstance(message, list) else [message]:
            self._on_message(msg, text)

    def _on_message(self, msg: Any, text: str) -> None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            self._problem("not_jsonrpc", "not a JSON-RPC 2.0 object", text)
            return
        # "method" first: jsonrpcclient's parser only understands responses.
        if "method" in msg:
            if not isinstance(msg["method"], str):
                self._problem("not_jsonrpc", "method is not a string", text)
            elif "id" in msg:
                self._nursery.start_soon(self._answer_server_request, msg)
            else:
                self._on_notification(msg)
            return
        if "result" not in msg and "error" not in msg:
            self._problem("not_jsonrpc", "neither request, notification nor response", text)
            return
        rid = msg.get("id")
        pending = self._pending.get(rid) if isinstance(rid, int) else None
        if pending is None:
            kind = "late_response" if rid in self._abandoned else "unknown_response_id"
            self._problem(kind, f"answer to id {rid!r}, which is not pending", text)
            return
        try:
            response = parse(msg)
        except (KeyError, TypeError, AttributeError) as exc:
            detail = f"malformed response: {type(exc).__name__} {exc}"
            self._problem("invalid_response", detail, text)
            pending.settle(failure=ProtocolError(f"{pending.method}: {detail}"))
            return
        if not isinstance(response, Ok | Error):  # parse() maps lists; we never pass one
            raise AssertionError(type(response))
        pending.settle(response=response)

    def _on_notification(self, msg: dict[str, Any]) -> None:
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        note = Notification(time.time(), time.monotonic(), msg["method"], params)
        if note.method == "notifications/progress":
            pending = self._by_token.get(str(params.get("progressToken")))
            if pending is not None:
                pending.progress.append(params)
                if pending.on_progress is not None and pending.callback_error is None:
                    try:
                        pending.on_progress(params)
                    except Exception as exc:
                        pending.callback_error = exc
        if self._inbox.add(note) and self._inbox.dropped == 1:
            self.record.event(
                "notifications_dropped",
                kept=self._inbox.max_notifications,
                detail="the inbox is full: the oldest notifications are dropped from now on",
            )

    async def _answer_server_request(self, msg: dict[str, Any]) -> None:
        method = msg["method"]
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        if method == "ping":
            reply["result"] = {}
        elif method == "roots/list":
            reply["result"] = {"roots": []}
        else:  # sampling/createMessage, elicitation/create, anything else
            reply["error"] = {
                "code": METHOD_NOT_FOUND,
                "message": f"{method} is not supported by this client",
            }
        outcome = "answered" if "result" in reply else "refused"
        try:
            with trio.move_on_after(self.timeout):
                await self._send(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            outcome = "process_exited"
        self.record.event("server_request", method=method, id=flatten(msg["id"]), outcome=outcome)

    # -- sending --------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        # json.dumps escapes newlines inside strings: one message, one line.
        data = (json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        async with self._send_lock:
            await self._proc.stdin.send_all(data)

    async def _notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self._send(notification(method, params))

    async def _send_cancel(self, request_id: int, reason: str) -> bool:
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_S):
            try:
                await self._notify(
                    "notifications/cancelled", {"requestId": request_id, "reason": reason}
                )
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
        return False

    def _dead(self) -> ProcessExited:
        # A fresh instance per raise: one exception object raised from several tasks
        # would accumulate all their tracebacks.
        if self._exited is not None:
            e = self._exited
            return ProcessExited(e.pid, e.returncode, e.stderr_tail)
        return ProcessExited(self.pid, self._proc.returncode, self._proc.stderr_tail(5))

    # -- requests -------------------------------------------------------------------

    async def request(
        self, method: str, params: dict[str, Any] | None = None, **options: Unpack[RequestOptions]
    ) -> Any:
        """Send one request and return its ``result`` (*options*: ``timeout``,
        ``on_progress``, see :class:`RequestOptions`).

        Raises :class:`RPCError` (a JSON-RPC error answer), :class:`CallTimeout` (no answer
        within ``timeout`` seconds, default the driver's; the timeout covers writing the
        request too), :class:`ProcessExited`, :class:`ProtocolError`. Each request
        appends one record to the call log. Safe to call from several tasks at once:
        writes are serialised, answers routed by id.

        A request cut off while its line is still being written (the server stopped
        reading and the pipe is full) may leave a partial line on the server's stdin;
        a pipe with room takes a line in one write.
        """
        timeout = options.get("timeout")
        timeout = self.timeout if timeout is None else timeout
        on_progress = options.get("on_progress")
        params, token = self._with_progress_token(params, on_progress)
        call = _CallRecord.of(method, params)
        req = request_impure(self._ids, method, params or None)
        pending = _Pending(req["id"], method, token, on_progress)
        t0 = time.monotonic()
        try:
            result = await self._exchange(
                req,
                pending,
                timeout,
                # MCP: "the initialize request MUST NOT be cancelled by clients".
                cancellable=method != "initialize",
            )
            call.answered(result)
            return result
        except BaseException as exc:
            call.failed(exc, pending)
            raise
        finally:
            self.record.request(
                request_id=pending.request_id, seconds=time.monotonic() - t0, **asdict(call)
            )

    def _with_progress_token(
        self,
        params: dict[str, Any] | None,
        on_progress: Callable[[dict[str, Any]], None] | None,
    ) -> tuple[dict[str, Any], str | None]:
        """MCP progress: with *on_progress*, a fresh token in ``params._meta`` (a copy)."""
        params = dict(params) if params else {}
        if on_progress is None:
            return params, None
        token = f"progress-{next(self._progress_ids)}"
        params["_meta"] = {**(params.get("_meta") or {}), "progressToken": token}
        return params, token

    # ---------------------------------------------------------------- the JSON-RPC session

    async def _exchange(
        self, req: dict[str, Any], pending: _Pending, timeout: float, *, cancellable: bool
    ) -> Any:
        """One JSON-RPC round trip: send *req*, wait for the answer routed to *pending*
        (by id, or by its progress token), return its ``result``. Knows nothing of MCP's
        methods; *cancellable* says whether a timeout or a cancel may send
        ``notifications/cancelled``."""
        rid = pending.request_id
        self._pending[rid] = pending
        if pending.progress_token is not None:
            self._by_token[pending.progress_token] = pending
        t0 = time.monotonic()
        try:
            if self._exited is not None or self._closed:
                raise self._dead()
            with trio.move_on_after(timeout):
                try:
                    await self._send(req)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    # The pipe broke: the reader will see EOF; let it fail us with
                    # the exit code and stderr it collects.
                    pass
                await pending.done.wait()
            if not pending.done.is_set():
                self._abandoned.add(rid)
                note = self._problem_note(t0) + self._server_note()
                if cancellable:
                    await self._send_cancel(rid, f"timeout after {timeout:g} s")
                raise CallTimeout(pending.method, timeout, rid, self.pid, note)
            return pending.result()
        except trio.Cancelled:
            if not pending.done.is_set() and cancellable:
                self._abandoned.add(rid)
                await self._send_cancel(rid, "cancelled by the caller")
            raise
        finally:
            self._pending.pop(rid, None)
            if pending.progress_token is not None:
                self._by_token.pop(pending.progress_token, None)

    def _problem_note(self, since_mono: float) -> str:
        # The stdout problems since the request was sent: an oversize or garbled line may
        # well have been its answer.
        recent = self._inbox.problems(since_wall=time.time() - (time.monotonic() - since_mono))
        if not recent:
            return ""
        kinds = ", ".join(sorted({p.kind for p in recent}))
        return f"; meanwhile {len(recent)} stdout line(s) were unusable ({kinds})"

    def _server_note(self) -> str:
        # Read when the wait runs out, before anything else is done to the server.
        return server_words(self._proc.identity, self._proc.stderr_tail(3))

    async def initialize(
        self,
        *,
        protocol_version: str = LATEST_HANDSHAKE_VERSION,
        capabilities: dict[str, Any] | None = None,
        client_name: str = "faultnet-mcp-driver",
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        """Run the handshake: ``initialize``, check the version, ``notifications/initialized``.

        A counter-offer of another handshake-era version is accepted; anything else
        raises :class:`ProtocolVersionError` (the caller should close the driver).
        """
        if protocol_version not in HANDSHAKE_VERSIONS:
            raise ValueError(
                f"protocol_version {protocol_version!r} is not a handshake-era version "
                f"({', '.join(HANDSHAKE_VERSIONS)})"
            )
        result = await self.request(
            "initialize",
            {
                "protocolVersion": protocol_version,
                "capabilities": capabilities or {},
                "clientInfo": {"name": client_name, "version": __version__},
            },
            timeout=timeout,
        )
        if not isinstance(result, dict):
            raise ProtocolError(f"initialize: result is not an object: {flatten(result)[:200]}")
        offered = result.get("protocolVersion")
        if offered not in HANDSHAKE_VERSIONS:
            self.record.event("handshake_refused", requested=protocol_version, offered=offered)
            raise ProtocolVersionError(protocol_version, offered, HANDSHAKE_VERSIONS)
        self.initialize_result = result
        try:
            with trio.fail_after(timeout):
                await self._notify("notifications/initialized")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._dead() from None
        except trio.TooSlowError:
            note = self._server_note()
            raise CallTimeout("notifications/initialized", timeout, 0, self.pid, note) from None
        return result

    async def list_tools(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every tool the server offers (``tools/list``, following ``nextCursor``)."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(1000):  # a server that pages forever is a bug, not a reason to hang
            result = await self.request(
                "tools/list", {"cursor": cursor} if cursor else None, timeout=timeout
            )
            if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
                raise ProtocolError(f"tools/list: no tools array in {flatten(result)[:200]}")
            tools.extend(result["tools"])
            cursor = result.get("nextCursor")
            if not cursor:
                return tools
        raise ProtocolError("tools/list: more than 1000 pages")

    async def call(self, tool: str, /, **arguments: Any) -> ToolResult:
        """Call ``tool`` with ``arguments`` (all keyword arguments go to the tool).

        Returns the tool's answer, ``is_error`` included; raises :class:`RPCError` for a
        JSON-RPC error, :class:`CallTimeout` after the driver's default timeout. For a
        per-call timeout, a progress callback or argument names that are not Python
        identifiers, use :meth:`call_tool`.
        """
        return await self.call_tool(tool, arguments)

    async def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        **options: Unpack[RequestOptions],
    ) -> ToolResult:
        """Call ``tool``; see :meth:`call`. *options* as :meth:`request`'s; ``on_progress``
        gets each progress params dict."""
        progress: list[dict[str, Any]] = []
        on_progress = options.get("on_progress")

        def collect(params: dict[str, Any]) -> None:
            progress.append(params)
            if on_progress is not None:
                on_progress(params)

        t0 = time.monotonic()
        result = await self.request(
            "tools/call",
            {"name": tool, "arguments": dict(arguments or {})},
            timeout=options.get("timeout"),
            on_progress=collect,
        )
        if not isinstance(result, dict) or not isinstance(result.get("content", []), list):
            raise ProtocolError(f"tools/call {tool}: malformed result {flatten(result)[:200]}")
        return ToolResult(
            text=_result_text(result),
            is_error=bool(result.get("isError", False)),
            raw=result,
            progress=tuple(progress),
            seconds=time.monotonic() - t0,
        )

    async def ping(self, *, timeout: float | None = None) -> float:
        """Send ``ping``; return the round trip in seconds."""
        t0 = time.monotonic()
        await self.request("ping", timeout=timeout)
        return time.monotonic() - t0

    # -- observation ------------------------------------------------------------------

    def notifications(self, method: str | None = None) -> list[Notification]:
        """Every notification kept so far (of ``method``, if given), oldest first: the
        newest ``max_notifications`` (see :attr:`notifications_dropped`)."""
        return self._inbox.notifications(method)

    @property
    def notification_count(self) -> int:
        """Every notification received so far, including those dropped: a mark to pass
        as ``since`` to :meth:`wait_notification`."""
        return self._inbox.received

    @property
    def notifications_dropped(self) -> int:
        """How many of the oldest notifications were dropped to keep the inbox within its
        bound (``max_notifications`` of :func:`open_mcp`); the call record says when."""
        return self._inbox.dropped

    def contents(self) -> list[str]:
        """The text of every ``notifications/message`` received, oldest first.

        ``data`` rendered as text: a string as is; a dict with a string ``text``, that
        text; anything else, one line of JSON.
        """
        return self._inbox.contents()

    async def wait_notification(
        self, match: NotificationMatch, timeout: float, *, since: int = 0
    ) -> Notification | None:
        """The first notification (the ``since``-th received onward) that matches.

        ``match`` is a method name or a predicate. Notifications already received count,
        so there is no race with one that arrived just before the wait. Returns None
        after ``timeout`` seconds, or at once when stdout has closed with no match: a
        timeout is not an observation.
        """
        return await self._inbox.wait(match, timeout, since=since)

    def problems(self) -> list[StdoutProblem]:
        """Stdout lines that were not usable messages, oldest first (first 1000 kept)."""
        return self._inbox.problems()

    @property
    def problem_count(self) -> int:
        """Every unusable stdout line so far, including those not kept in memory."""
        return self._inbox.problem_count

    def stderr_lines(self) -> list[StderrLine]:
        return self._proc.stderr_lines()

    def stderr_text(self) -> str:
        """Everything the server wrote on stderr so far."""
        return self._proc.stderr_text()

    def grep_stderr(self, pattern: str | re.Pattern[str]) -> list[str]:
        """The stderr lines so far in which the regex ``pattern`` is found."""
        return self._proc.grep_stderr(pattern)

    async def wait_stderr(
        self, pattern: str | re.Pattern[str], timeout: float, *, since: int = 0
    ) -> str | None:
        """The first stderr line matching ``pattern`` (lines already read count).

        None after ``timeout`` seconds or when stderr closed without a match.
        """
        return await self._proc.wait_stderr(pattern, timeout, since=since)

    # -- close ----------------------------------------------------------------------

    async def close(self) -> CloseReport:
        """Stop the server (stdin EOF, SIGTERM, SIGKILL, each bounded; exact PID only).

        Pending requests then fail with :class:`ProcessExited`. Idempotent. The close runs
        shielded from cancellation; its total is bounded by ``close_timeouts``.
        """
        self._closed = True
        with trio.CancelScope(shield=True):
            first = self._proc.close_report is None
            report = await self._proc.close(self.close_timeouts)
            # Let the stdout reader settle the pending requests with the exit status.
            with trio.move_on_after(EXIT_GRACE_S + 1.0):
                await self.stdout_closed.wait()
            dead = self._dead()
            for pending in list(self._pending.values()):
                pending.settle(failure=dead)
            if first and self._inbox.dropped:
                self.record.event(
                    "notifications_dropped",
                    received=self._inbox.received,
                    dropped=self._inbox.dropped,
                )
            if first:
                self.record.event(
                    "exit",
                    how=report.how,
                    returncode=report.returncode,
                    signals=list(report.signals),
                    seconds=round(report.seconds, 6),
                )
        return report


@asynccontextmanager
async def open_mcp(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    call_log_dir: str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
    *,
    handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
    protocol_version: str = LATEST_HANDSHAKE_VERSION,
    capabilities: dict[str, Any] | None = None,
    close_timeouts: CloseTimeouts = DEFAULT_CLOSE_TIMEOUTS,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
) -> AsyncIterator[MCPDriver]:
    """Start the server ``argv``, run the handshake, yield the driver; close it on exit.

    ``env`` replaces the child's environment (None: inherit). ``timeout`` is the default
    per-request timeout; the handshake has its own, longer one
    (:data:`HANDSHAKE_TIMEOUT_S`: a server's start is its imports, 1-2.5 s for the
    official SDK on an idle machine, tens of seconds on a loaded one or a cold disk).
    The call record goes to ``call_log_dir`` or ``$FAULTNET_CALL_LOG_DIR`` (neither: no
    record). The inbox keeps the newest ``max_notifications`` notifications and counts
    the ones it drops.

    Raises :class:`StartError`, :class:`ProtocolVersionError`, :class:`CallTimeout`,
    :class:`ProcessExited`, :class:`RPCError` from the start and handshake (after
    closing the process); :class:`OSError` if the call log's directory cannot be made
    (before the server starts). Exceptions from the body propagate unchanged (not
    wrapped in an exception group).
    """
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    directory = resolve_dir(call_log_dir)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        drv: MCPDriver | None = None
        proc: ServerProcess | None = None
        try:
            proc = await ServerProcess.start(argv, env, cwd)
            drv = MCPDriver(
                proc,
                nursery,
                timeout=timeout,
                call_log_dir=call_log_dir,
                max_line_bytes=max_line_bytes,
                close_timeouts=close_timeouts,
                max_notifications=max_notifications,
            )
            nursery.start_soon(proc.read_stderr)
            nursery.start_soon(drv._read_stdout)
            nursery.start_soon(drv._watch_exit)
            await drv.initialize(
                protocol_version=protocol_version,
                capabilities=capabilities,
                timeout=handshake_timeout,
            )
            yield drv
        except BaseException as exc:
            # Re-raised below, outside the nursery, so callers see the exception itself
            # rather than an ExceptionGroup around it.
            failure = exc
        finally:
            if drv is not None:
                await drv.close()
                drv.record.close()
                with trio.CancelScope(shield=True):
                    await drv.process.release_pipes()
            elif proc is not None:  # started, but no driver was made around it
                with trio.CancelScope(shield=True):
                    await proc.close(close_timeouts)
                    await proc.release_pipes()
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
