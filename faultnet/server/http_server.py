"""The API's HTTP/1.1 server: one ASGI app served over trio sockets, h11 doing the HTTP.

Why not hypercorn (issue 36): measured with 1,000 proxies, ``GET /version`` cost
0.69 ms a request through hypercorn's trio worker, most of it hypercorn's own (its
per-request stream object, task group and event queue; ~2.0 M instructions for an
empty ASGI app). Toxiproxy answers in 0.13-0.24 ms and the targets (a toxic's add
under 0.5 ms) could not be met above that floor. This server does what the API needs
and nothing else: HTTP/1.1 only (no HTTP/2, no WebSocket, no TLS, no lifespan), one
request at a time per connection, the answer written in one ``send`` when the app
gives it whole.

Semantics, all of them relied on by the API's tests:

* **Keep-alive**: after an answer the connection waits for the next request for
  :attr:`HttpLimits.keep_alive_s`, then is closed with a FIN (never an RST, never a
  request read and dropped: the close happens only while nothing has been received).
* **A stalled head**: once a request's first byte is in, its head must be complete
  within :attr:`HttpLimits.read_timeout_s`, else the connection is closed. A body's
  pace is the app's business (the API answers 408 after its own timeout).
* ``Connection: close`` from either side closes the connection after the answer (h11
  adds the header to the answer when the request had it).
* Bodies, ``Content-Length`` or chunked, reach the app as ``http.request`` messages; a
  client that sent ``Expect: 100-continue`` gets its ``100 Continue`` when the app first
  reads. A body the app did not read is read and dropped (up to
  :data:`DRAIN_MAX_BYTES`, within the read timeout) so the connection can carry the
  next request; past that the connection is closed.
* ``HEAD``: the app's answer without its body (its ``Content-Length`` kept).
* A malformed request (h11's :class:`h11.RemoteProtocolError`) is answered with h11's
  status hint (400, 431 for a head over 16 KiB) as the API's JSON error, and closed.
  A client's mistake never prints a traceback; neither does a client that resets.
* Closing: our FIN first, then whatever the client still sends is read and dropped
  until its own FIN or :data:`LINGER_S`, so an answer is not destroyed by an RST that
  unread bytes would cause (a 413 sent while the body is still arriving).
* The accept loop survives descriptor exhaustion (EMFILE and friends): it waits
  :data:`ACCEPT_RETRY_S` and tries again, one log line per episode, no traceback.
* Stopping (the serving task cancelled): no new connection nor request is taken; a
  request being answered gets :attr:`HttpLimits.grace_s` to finish.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11
import trio

__all__ = ["HttpLimits", "serve_http"]

#: An ASGI 3 application (typed loosely: starlette's own types say the same).
AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

#: Bytes asked of the socket per read: an API request (head and body) fits in one.
RECEIVE_BYTES = 65536
#: The most of an unread request body read and dropped to keep a connection; a larger
#: rest closes the connection instead (the API's own bodies are at most 1 MiB).
DRAIN_MAX_BYTES = 1 << 20
#: After our FIN, how long what the client still sends is read and dropped before the
#: socket is closed (a close with unread bytes is an RST, which can destroy the answer
#: before the client reads it).
LINGER_S = 1.0
#: accept() failing for want of descriptors or memory is retried after this long, as
#: trio's serve_listeners does (its 100 ms: long enough for a close to free one).
ACCEPT_RETRY_S = 0.1
_ACCEPT_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """The server's timeouts and sizes (see the module's docstring)."""

    #: An idle connection (between requests) is closed after this many seconds.
    keep_alive_s: float
    #: A request head must be complete this many seconds after its first byte.
    read_timeout_s: float
    #: The listening socket's backlog: a burst of clients queues, is not refused.
    backlog: int = 1024
    #: A request being answered when the server stops gets this long to finish.
    grace_s: float = 1.0


#: An answer's reason phrase, by status.
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class _Closed(Exception):
    """The connection cannot carry another request: close it (quietly)."""


class _Exchange:
    """One request and its answer: the ASGI ``receive`` and ``send`` of one app call."""

    def __init__(self, conn: h11.Connection, stream: trio.SocketStream, head: bool) -> None:
        self.conn, self.stream, self.head = conn, stream, head
        self.body_done = False
        self.pending: Any = None  # an h11 event read ahead while reading the body
        self.status = 0
        self.headers: list[Any] = []
        self.sent_head = False
        self.answered = trio.Event()

    async def _event(self) -> Any:
        """The next h11 event of the request (its body's), reading as needed."""
        if self.pending is not None:
            event, self.pending = self.pending, None
            return event
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.conn.they_are_waiting_for_100_continue:
                await self.stream.send_all(
                    self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                )
            self.conn.receive_data(await self.stream.receive_some(RECEIVE_BYTES))

    async def receive(self) -> dict[str, Any]:
        """ASGI ``receive``: the body's parts; once it is all read, ``http.disconnect``
        when the answer is done. A client gone mid-body is ``http.disconnect`` at once."""
        if self.body_done:
            await self.answered.wait()
            return {"type": "http.disconnect"}
        try:
            event = await self._event()
            if type(event) is h11.Data:
                data = bytes(event.data)
                following = self.conn.next_event()  # the end, when it is already here
                done = type(following) is h11.EndOfMessage
                if not done and following is not h11.NEED_DATA:
                    self.pending = following
                self.body_done = done
                return {"type": "http.request", "body": data, "more_body": not done}
            if type(event) is h11.EndOfMessage:
                self.body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
        except (h11.RemoteProtocolError, trio.BrokenResourceError, OSError):
            pass
        self.body_done = True  # the client closed or broke the body: it is gone
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        """ASGI ``send``: the answer's head is held until its first body part, so an
        answer given whole goes out in one write."""
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body" or self.answered.is_set():
            return
        out = b""
        if not self.sent_head:
            self.sent_head = True
            response = h11.Response(
                status_code=self.status, headers=self.headers, reason=_REASONS.get(self.status, b"")
            )
            out = self.conn.send(response)
        body = message.get("body", b"")
        if body and not self.head:
            out += self.conn.send(h11.Data(data=body))
        if not message.get("more_body", False):
            out += self.conn.send(h11.EndOfMessage())
            self.answered.set()
        await self.stream.send_all(out)


def _error_answer(conn: h11.Connection, status: int, message: str) -> bytes:
    """The API's JSON error (``{"error", "status"}``) as bytes, closing the connection."""
    body = json.dumps({"error": message, "status": status}).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    response = h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b""))
    return conn.send(response) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())


class _Server:
    """The accept loop and the connections of one :func:`serve_http`."""

    def __init__(self, app: AsgiApp, limits: HttpLimits) -> None:
        self.app, self.limits = app, limits
        #: The cancel scopes of requests being answered (shielded; see :meth:`accept`).
        self.in_flight: set[trio.CancelScope] = set()
        self.stopping = False

    async def accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        starved = False
        try:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_RESOURCE_ERRNOS:
                        raise
                    if not starved:
                        _log.warning("API accept(): %s; retrying", exc.strerror)
                    starved = True
                    await trio.sleep(ACCEPT_RETRY_S)  # a backoff, as serve_listeners
                    continue
                starved = False
                nursery.start_soon(self.connection, stream)
        except trio.Cancelled:
            # Stopping: the requests being answered get the grace period, then end.
            self.stopping = True
            for scope in self.in_flight:
                scope.deadline = trio.current_time() + self.limits.grace_s
            raise

    async def connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        linger = LINGER_S
        try:
            sock = stream.socket
            addresses = (tuple(sock.getsockname()[:2]), tuple(sock.getpeername()[:2]))
            while await self._request(conn, stream, addresses):
                conn.start_next_cycle()
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except trio.Cancelled:
            linger = 0  # the server stops: FIN and close at once
            raise
        finally:
            with trio.CancelScope(shield=True):
                await _close(stream, linger)

    async def _head(self, conn: h11.Connection, stream: trio.SocketStream) -> Any:
        """The next request's first h11 event; raises :class:`_Closed` when there is
        none to read (idle past the keep-alive, the client's FIN, a stalled head)."""
        if not conn.trailing_data[0]:
            with trio.move_on_after(self.limits.keep_alive_s):
                data = await stream.receive_some(RECEIVE_BYTES)
                conn.receive_data(data)
            if not conn.trailing_data[0] and not conn.trailing_data[1]:
                raise _Closed  # idle past the keep-alive: nothing was read, nothing lost
        event = conn.next_event()  # a whole head in the first read: no timer needed
        if event is not h11.NEED_DATA:
            return event
        with trio.move_on_after(self.limits.read_timeout_s):
            while event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(RECEIVE_BYTES))
                event = conn.next_event()
            return event
        raise _Closed  # the head stalled

    async def _request(
        self, conn: h11.Connection, stream: trio.SocketStream, addresses: tuple[Any, Any]
    ) -> bool:
        """Read one request and answer it; whether the connection can carry another."""
        try:
            event = await self._head(conn, stream)
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await stream.send_all(
                    _error_answer(conn, exc.error_status_hint, f"bad request: {exc}")
                )
            return False
        if type(event) is not h11.Request:
            return False  # ConnectionClosed: the client's FIN between requests
        exchange = _Exchange(conn, stream, event.method == b"HEAD")
        with trio.CancelScope(shield=True) as scope:
            if self.stopping:
                scope.deadline = trio.current_time() + self.limits.grace_s
            self.in_flight.add(scope)
            try:
                await self._call(exchange, _scope(event, addresses))
            finally:
                self.in_flight.discard(scope)
        if not exchange.answered.is_set() or conn.our_state is not h11.DONE:
            return False
        return await self._drain(conn, stream)

    async def _call(self, exchange: _Exchange, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return  # the client left while being answered
        except Exception:
            # A bug in the app (the API's handlers answer their own failures): say it.
            _log.exception("API: the app failed on %s %s", scope["method"], scope["path"])
        if not exchange.sent_head:
            await exchange.send({"type": "http.response.start", "status": 500, "headers": []})
            await exchange.send({"type": "http.response.body", "body": b""})

    async def _drain(self, conn: h11.Connection, stream: trio.SocketStream) -> bool:
        """Read and drop what the app left of the request body; whether the connection
        can carry another request (the body ended in bounds)."""
        try:
            if conn.their_state is h11.SEND_BODY:
                conn.next_event()  # the end of a request with no body: no timer needed
        except h11.RemoteProtocolError:
            return False
        dropped = 0
        if conn.their_state is not h11.SEND_BODY:
            return _reusable(conn)
        with trio.move_on_after(self.limits.read_timeout_s):
            while conn.their_state is h11.SEND_BODY and dropped <= DRAIN_MAX_BYTES:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError:
                    return False
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(RECEIVE_BYTES)
                    conn.receive_data(data)
                    dropped += len(data)
        return _reusable(conn)


def _reusable(conn: h11.Connection) -> bool:
    """Whether *conn* is between requests: both sides done with the last one."""
    return conn.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}


def _scope(request: h11.Request, addresses: tuple[Any, Any]) -> dict[str, Any]:
    """The ASGI HTTP scope of *request* (*addresses*: the server's, the client's)."""
    path, _, query = request.target.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": request.http_version.decode(),
        "method": request.method.decode(),
        "scheme": "http",
        "path": unquote(path.decode("ascii", "replace")),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": list(request.headers),
        "server": addresses[0],
        "client": addresses[1],
    }


async def _close(stream: trio.SocketStream, linger_s: float) -> None:
    """Our FIN, then drop what the client still sends until its FIN or *linger_s*."""
    try:
        await stream.send_eof()
        with trio.move_on_after(linger_s):
            while await stream.receive_some(RECEIVE_BYTES):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    await stream.aclose()


async def _listen(host: str, port: int, backlog: int) -> trio.SocketListener:
    """A listener on *host* (an IPv6 address when it has a ``:``) and *port*."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_http(
    app: AsgiApp,
    host: str,
    port: int,
    limits: HttpLimits,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve *app* on *host*:*port* until cancelled; report ``http://host:port`` (the
    bound address, IPv6 in brackets) when listening. An address that cannot be bound
    raises its :class:`OSError` before that."""
    listener = await _listen(host, port, limits.backlog)
    bound = listener.socket.getsockname()
    url = f"http://[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"http://{bound[0]}:{bound[1]}"
    server = _Server(app, limits)
    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(server.accept, listener, nursery)
        task_status.started(url)
