"""HTTP/1.1 request-level faults: the session that reads one connection's requests and
responses with h11 and applies a plan to each request.

Theory of operation
-------------------

h11 parses; this module never re-serialises. Each stream's bytes are fed to an h11
connection (a fresh one per message, so pipelined requests need no answer from us to be
parsed), and after every event the bytes h11 consumed for it (what was fed, less its
``trailing_data``) are that event's span of the original stream. Spans are forwarded as
they came, so a request no plan touches crosses byte-identical, framing (Content-Length
or chunked) included; only a plan's own rewrites (a header added or removed) change
bytes.

Responses come back in request order (HTTP/1.1 has no other way to pair them), so the
session keeps one :class:`_Slot` per request not yet answered, in order. A slot is
either answered by the server (its plan may delay, slow, cut or rewrite the response) or
by the plan itself (an abort: the request never reaches the server, and its answer goes
out when every earlier response has). A request that is held is not forwarded, and
neither is anything after it on that connection: nothing is answered again there.

Interim responses (``100 Continue``, ``103``) pass as they came. An upgrade (``101``)
or a CONNECT's 2xx turns both streams into opaque bytes from there on; while such a
request waits for its answer, the client's next bytes wait too (they may not be HTTP).
Bytes either parser refuses (h11's ``ProtocolError``) turn that stream opaque: a
fault proxy must not break what it cannot read.

Writes: the session writes each stream through an :class:`Out` (a both-stream toxic's
link on that stream) under a lock per stream; the upstream task takes the downstream
lock only to send an abort's answer, and the downstream task never takes the upstream
lock while holding its own, so the two cannot wait on each other.
"""

from __future__ import annotations

import http
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import h11
import trio

__all__ = [
    "MAX_HEAD",
    "Answer",
    "Out",
    "Plan",
    "Session",
    "answer_bytes",
    "parse_header_lines",
    "rewrite_head",
]

#: The largest request or response head parsed (h11's default is 16 KiB; a fault proxy
#: should carry a server's "huge headers" test, so 1 MiB). A larger one turns the stream
#: opaque (forwarded untouched).
MAX_HEAD = 1024 * 1024


class Out(Protocol):
    """Where one stream's bytes go on (a both-stream toxic's link on that stream)."""

    async def inject(self, data: bytes, t_read: float | None = None) -> None: ...

    async def inject_eof(self) -> None: ...

    async def close(self) -> None: ...

    async def reset(self) -> None: ...


@dataclass
class Answer:
    """A response the plan makes itself; the request is not forwarded."""

    data: bytes
    #: Close the connection (FIN both ways) once it is sent.
    close: bool = False


class Plan:
    """What one toxic does to one request and its response. This base passes both.

    The hooks get the response's bytes as spans of the original stream: its head (status
    line and headers, CRLFs included), then its body as it arrives (wire bytes: chunked
    framing counts), then the end (the last framing bytes, often empty). Each hook sends
    what it wants on with ``await out(data)``; sending nothing drops the bytes.
    """

    #: What was done, for the event log (``abort``, ``delay``, ...), and its figures.
    action = "pass"
    detail: dict[str, object] = {}  # noqa: RUF012 (read only; subclasses set their own)

    def rewrite_request_head(self, head: bytes) -> bytes:
        return head

    def answer(self, request: h11.Request) -> Answer | None:
        """A response to send instead of forwarding the request, or None to forward it."""
        return None

    #: True: this request and everything after it on the connection are not forwarded,
    #: and nothing answers them.
    hold = False

    async def response_head(self, send: Send, head: bytes) -> None:
        await send(head)

    async def response_body(self, send: Send, data: bytes) -> None:
        await send(data)

    async def response_end(self, send: Send, data: bytes) -> None:
        await self.response_body(send, data)


class Send(Protocol):
    """A plan's way to pass bytes on towards the client, to wait, and to end the
    connection. What it is given leaves in one write per chunk the proxy read, so a plan
    that waits must wait through :meth:`sleep`/:meth:`sleep_until` (which send what is
    pending first)."""

    async def __call__(self, data: bytes) -> None: ...

    async def sleep(self, seconds: float) -> None: ...

    async def sleep_until(self, deadline: float) -> None: ...

    async def close(self) -> None: ...

    async def reset(self) -> None: ...


class _Coalescing:
    """An :class:`Out` that gathers what it is given until :meth:`flush`: the spans of
    one chunk (a head, its body, the end) leave in one write, not three. (Measured: three
    small writes to a client socket without TCP_NODELAY met its delayed ACK, 45 ms per
    keep-alive request instead of 0.5.)"""

    def __init__(self, out: Out) -> None:
        self.out = out
        self._buf = bytearray()
        self._t_read: float | None = None

    async def inject(self, data: bytes, t_read: float | None = None) -> None:
        if data:
            if not self._buf:
                self._t_read = t_read
            self._buf += data

    async def flush(self) -> None:
        if self._buf:
            data, self._buf = bytes(self._buf), bytearray()
            await self.out.inject(data, self._t_read)

    async def inject_eof(self) -> None:
        await self.flush()
        await self.out.inject_eof()

    async def close(self) -> None:
        await self.flush()
        await self.out.close()

    async def reset(self) -> None:
        self._buf.clear()  # a reset discards what was not sent, as the kernel's does
        await self.out.reset()


Decide = Callable[[h11.Request], Plan | None]


@dataclass
class _Slot:
    """One request waiting for its response, in order."""

    plan: Plan
    method: bytes
    headers: list[tuple[bytes, bytes]]
    #: The plan's own answer; ``ready`` once the request's body was read (or not needed).
    answer: Answer | None = None
    ready: bool = True
    #: An upgrade or CONNECT: a successful answer turns both streams opaque.
    switch: bool = False


@dataclass
class _Parser:
    """An h11 connection and the bytes fed to it that no event has accounted for yet."""

    conn: h11.Connection
    #: The request it reads the response to (client-side parsers only).
    slot: _Slot | None = None
    pending: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        """Give h11 *data* (b"" means nothing here: the end is :meth:`close`)."""
        if data:
            self.conn.receive_data(data)
            self.pending += data

    def close(self) -> None:
        """The stream ended (h11 ends a response framed by the close)."""
        self.conn.receive_data(b"")

    def next(self) -> tuple[object, bytes]:
        """The next event and its span of the original bytes (none for NEED_DATA and
        PAUSED: bytes h11 consumed without an event, a chunk's size line, belong to the
        next event's span)."""
        event = self.conn.next_event()
        if event is h11.NEED_DATA or event is h11.PAUSED:
            return event, b""
        used = len(self.pending) - len(self.conn.trailing_data[0])
        span = bytes(self.pending[:used])
        del self.pending[:used]
        return event, span


def _server_parser(data: bytes = b"") -> _Parser:
    p = _Parser(h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD))
    p.feed(data)
    return p


def _client_parser(slot: _Slot, data: bytes = b"") -> _Parser:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    # h11 frames a response by the request it answers (HEAD has no body, an Upgrade may
    # be answered with 101): tell it the request, without its body.
    headers = [
        (k, v) for k, v in slot.headers if k not in (b"content-length", b"transfer-encoding")
    ]
    if not any(k == b"host" for k, _ in headers):
        headers.append((b"host", b"faultnet"))
    try:
        conn.send(h11.Request(method=slot.method, target=b"/", headers=headers))
        conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        # Headers h11 read but will not write (none known): frame the answer as a GET's.
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        conn.send(h11.Request(method=b"GET", target=b"/", headers=[(b"host", b"faultnet")]))
        conn.send(h11.EndOfMessage())
    p = _Parser(conn, slot)
    p.feed(data)
    return p


def _wants_switch(request: h11.Request) -> bool:
    if request.method == b"CONNECT":
        return True
    return any(k == b"upgrade" for k, _ in request.headers)


class _Send:
    """:class:`Send` for a plan: the downstream :class:`Out`, after the session's lock."""

    def __init__(self, session: Session, t_read: float | None) -> None:
        self.session = session
        self.t_read = t_read

    async def __call__(self, data: bytes) -> None:
        if data and not self.session.ended:
            await self.session.down.inject(data, self.t_read)

    async def sleep(self, seconds: float) -> None:
        await self.session.down.flush()
        await trio.sleep(seconds)

    async def sleep_until(self, deadline: float) -> None:
        await self.session.down.flush()
        await trio.sleep_until(deadline)

    async def close(self) -> None:
        self.session.ended = True
        await self.session.down.close()

    async def reset(self) -> None:
        self.session.ended = True
        await self.session.down.reset()


class Session:
    """One connection's HTTP/1.1 traffic through one toxic (see the module docstring).

    *up* and *down* are where client->server and server->client bytes go on; *decide*
    says what to do with each request (None: pass it); *log* is told each decision that
    is not a pass, and each stream that turned opaque.
    """

    def __init__(
        self,
        up: Out,
        down: Out,
        decide: Decide,
        log: Callable[..., None] = lambda event, **fields: None,
    ) -> None:
        self.up = _Coalescing(up)
        self.down = _Coalescing(down)
        self.decide = decide
        self.log_event = log
        self.slots: deque[_Slot] = deque()
        self._up_lock = trio.Lock()
        self._down_lock = trio.Lock()
        self._request: _Parser = _server_parser()
        self._response: _Parser | None = None
        self._current: _Slot | None = None  # the request being read
        self._dropping = False  # the current request's bytes are not forwarded
        self._held = False
        self._waiting: bytearray | None = None  # client bytes behind an upgrade's answer
        self._waiting_eof = False
        self._opaque_up = False
        self._opaque_down = False
        #: True once a plan ended the connection: nothing more is sent.
        self.ended = False

    # -- client to server --

    async def upstream(self, data: bytes, t_read: float | None = None) -> None:
        async with self._up_lock:
            await self._upstream(data, t_read)
            await self.up.flush()

    async def _upstream(self, data: bytes, t_read: float | None) -> None:
        if self._held or self.ended:
            return
        if self._opaque_up:
            return await self.up.inject(data, t_read)
        if self._waiting is not None:
            self._waiting += data
            return
        try:
            self._request.feed(data)
        except h11.RemoteProtocolError:
            return await self._go_opaque_up(t_read)
        while True:
            try:
                event, span = self._request.next()
            except h11.RemoteProtocolError:
                return await self._go_opaque_up(t_read)
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                span = await self._on_request(event, span)
                if self._held:
                    return
            if not self._dropping:
                await self.up.inject(span, t_read)
            if isinstance(event, h11.EndOfMessage):
                slot, self._current = self._current, None
                dropped, self._dropping = self._dropping, False
                rest = bytes(self._request.pending)
                self._request = _server_parser()
                if slot is not None and slot.answer is not None and not slot.ready:
                    slot.ready = True
                    await self._drain_from_upstream()
                if slot is not None and slot.switch and not dropped:
                    self._waiting = bytearray(rest)
                    return
                try:
                    self._request.feed(rest)
                except h11.RemoteProtocolError:
                    return await self._go_opaque_up(t_read)

    async def _on_request(self, request: h11.Request, head: bytes) -> bytes:
        plan = self.decide(request)
        if plan is not None:
            self.log_event(
                "http_fault",
                method=request.method.decode("latin-1"),
                path=request.target.decode("latin-1"),
                action=plan.action,
                **plan.detail,
            )
        plan = plan or Plan()
        if plan.hold:
            self._held = True
            return head
        slot = _Slot(plan, request.method, list(request.headers), switch=_wants_switch(request))
        answer = plan.answer(request)
        self._current = slot
        if answer is not None:
            self._dropping = True
            slot.answer, slot.switch = answer, False
            expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in slot.headers)
            # A client waiting for 100 Continue sends no body until answered: answer now,
            # and close after (the body it may still send would be read as a request).
            slot.ready = expects
            if expects:
                answer.close = True
        self.slots.append(slot)
        if answer is not None and slot.ready:
            await self._drain_from_upstream()
        return plan.rewrite_request_head(head)

    async def _drain_from_upstream(self) -> None:
        async with self._down_lock:
            await self._drain()
            await self.down.flush()

    async def upstream_eof(self) -> None:
        async with self._up_lock:
            if self._held or self.ended:
                return  # held: the server never hears of it
            if self._waiting is not None:
                self._waiting_eof = True
                return
            if not self._opaque_up and self._request.pending:
                # A request the client never finished: pass what came, as it came.
                await self.up.inject(bytes(self._request.pending))
                self._request.pending.clear()
            await self.up.inject_eof()

    async def _go_opaque_up(self, t_read: float | None) -> None:
        self._opaque_up = True
        self.log_event("http_opaque", stream="upstream")
        if not self._dropping and self._request.pending:
            await self.up.inject(bytes(self._request.pending), t_read)
        self._request.pending.clear()

    # -- server to client --

    async def downstream(self, data: bytes, t_read: float | None = None) -> None:
        async with self._down_lock:
            if self.ended:
                return
            await self._drain()
            if self._opaque_down:
                await self.down.inject(data, t_read)
                then = None
            else:
                then = await self._downstream(data, t_read)
            await self.down.flush()
        await self._after_answer(then, t_read)

    async def _downstream(self, data: bytes, t_read: float | None) -> str | None:
        """Handle server bytes (down lock held). Returns what the upstream must do next,
        outside that lock: ``"switch"`` (opaque from now on), ``"resume"`` (parse the
        client's bytes held behind an upgrade's refusal), or None."""
        send = _Send(self, t_read)
        then = None
        parser = self._response
        if parser is None:
            if not data:
                return None
            # Bound to its request when its first byte arrives: by then the request has
            # crossed, so its slot is queued.
            parser = self._response = _client_parser(self._head_slot())
        try:
            parser.feed(data)
        except h11.RemoteProtocolError:
            await self._go_opaque_down(t_read)
            return then
        while not self.ended:
            slot = parser.slot
            assert slot is not None
            try:
                event, span = parser.next()
            except h11.RemoteProtocolError:
                await self._go_opaque_down(t_read)
                return then
            if event is h11.NEED_DATA:
                return then
            if event is h11.PAUSED:  # a 101: opaque from here on, both ways
                await self._opaque_from_here(parser, t_read)
                return "switch"
            if isinstance(event, h11.InformationalResponse):
                await send(span)
            elif isinstance(event, h11.Response):
                await slot.plan.response_head(send, span)
                if slot.switch and slot.method == b"CONNECT" and 200 <= event.status_code < 300:
                    await self._opaque_from_here(parser, t_read)
                    return "switch"
                if slot.switch:
                    then = "resume"  # refused: the client's next bytes are HTTP
            elif isinstance(event, h11.Data):
                await slot.plan.response_body(send, span)
            elif isinstance(event, h11.EndOfMessage):
                await slot.plan.response_end(send, span)
                if self.slots and self.slots[0] is slot:
                    self.slots.popleft()
                rest = bytes(parser.pending)
                self._response = None
                await self._drain()
                if not rest:
                    return then
                parser = self._response = _client_parser(self._head_slot())
                try:
                    parser.feed(rest)
                except h11.RemoteProtocolError:
                    await self._go_opaque_down(t_read)
                    return then
            else:  # ConnectionClosed: nothing more will come
                await send(span)
                return then
        return then

    def _head_slot(self) -> _Slot:
        # The request the next response answers; a response nobody asked for (a 408
        # before any request) is framed as a GET's and passed.
        for slot in self.slots:
            if slot.answer is None:
                return slot
        return _Slot(Plan(), b"GET", [])

    async def _drain(self) -> None:
        """Send the plans' own answers now at the head of the queue (down lock held)."""
        while self.slots and self.slots[0].answer is not None and not self.ended:
            slot = self.slots[0]
            if not slot.ready:
                return
            assert slot.answer is not None
            self.slots.popleft()
            await self.down.inject(slot.answer.data)
            if slot.answer.close:
                self.ended = True
                await self.down.close()

    async def _opaque_from_here(self, parser: _Parser, t_read: float | None) -> None:
        self._opaque_down = True
        rest = bytes(parser.pending)
        parser.pending.clear()
        if rest:
            await self.down.inject(rest, t_read)

    async def _after_answer(self, then: str | None, t_read: float | None) -> None:
        if then is None:
            return
        async with self._up_lock:
            waiting, self._waiting = self._waiting, None
            eof, self._waiting_eof = self._waiting_eof, False
            if then == "switch":
                self._opaque_up = True
                if waiting:
                    await self.up.inject(bytes(waiting), t_read)
            elif waiting is not None:
                await self._upstream(bytes(waiting), t_read)
            if eof:
                await self.up.inject_eof()
            await self.up.flush()

    async def downstream_eof(self) -> None:
        async with self._down_lock:
            if self.ended:
                return
            if not self._opaque_down and self._response is not None:
                self._response.close()
                await self._downstream(b"", None)  # a response framed by the close ends
            await self._drain()
            if self._response is not None and self._response.pending:
                await self.down.inject(bytes(self._response.pending))
                self._response.pending.clear()
            if not self.ended:
                await self.down.inject_eof()

    async def _go_opaque_down(self, t_read: float | None) -> None:
        self._opaque_down = True
        self.log_event("http_opaque", stream="downstream")
        assert self._response is not None
        if self._response.pending:
            await self.down.inject(bytes(self._response.pending), t_read)
        self._response.pending.clear()


# -- heads ---------------------------------------------------------------------------


def parse_header_lines(text: str) -> list[tuple[str, str]]:
    """``"Name: value"`` lines (separated by newlines) as pairs; ValueError names a line
    without a colon or with a character a header may not hold."""
    pairs = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in ' \t()<>@,;\\"/[]?={}'):
            raise ValueError(f"header line {line!r} is not 'Name: value'")
        if any(ord(c) < 32 or ord(c) > 126 for c in name + value):
            raise ValueError(f"header line {line!r} holds a character a header may not")
        pairs.append((name, value))
    return pairs


def rewrite_head(head: bytes, add: list[tuple[str, str]], remove: set[str]) -> bytes:
    """*head* (a start line, header lines, the blank line) without the header lines whose
    names are in *remove* (lower case) and with *add* appended; every other byte kept."""
    lines = head.split(b"\r\n")
    # lines: start line, headers..., "", "" (the head ends with CRLF CRLF)
    kept = [lines[0]]
    for line in lines[1:]:
        if not line:
            continue
        name = line.split(b":", 1)[0].strip().lower().decode("latin-1")
        if name not in remove:
            kept.append(line)
    kept += [f"{n}: {v}".encode("latin-1") for n, v in add]
    return b"\r\n".join(kept) + b"\r\n\r\n"


def answer_bytes(
    status: int, body: bytes, headers: list[tuple[str, str]], head_only: bool = False
) -> bytes:
    """A whole HTTP/1.1 response: *status* with its standard reason, *headers*, a
    Content-Length for *body* (unless *headers* give one), and *body* unless
    *head_only* (the answer to a HEAD)."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Fault"
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{n}: {v}" for n, v in headers]
    if not any(n.lower() == "content-length" for n, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body
