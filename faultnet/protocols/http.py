"""HTTP/1.1 request-level faults: a pure session (sans-I/O) that reads one connection's
requests and responses with h11 and applies a plan to each request.

Theory of operation
-------------------

:class:`Session` does no I/O and knows no clock: events go in (bytes read on a stream,
the end of a stream, a timer that came due, each with the time), and commands come out
(:class:`Forward` the original bytes, :class:`Inject` bytes the session made,
:class:`Hold` a stream until a time or until resumed, :class:`Resume`, :class:`Eof`,
:class:`Close`, :class:`Reset`). Whoever runs it (a both-stream toxic's stages,
:mod:`faultnet.toxics.http`) carries the commands out in order, in the task of the
stream the event came on; a :class:`Hold` of that stream means: read no more of it
until the time comes (then :meth:`Session.timer`) or a :class:`Resume` says so. That
is the backpressure: a held stream is not read, so nothing piles up here.

h11 parses; this module never re-serialises. Each stream's bytes are fed to an h11
connection (a fresh one per message, so pipelined requests need no answer from us to be
parsed), and after every event the bytes h11 consumed for it (what was fed, less its
``trailing_data``) are that event's span of the original stream. Spans are forwarded as
they came, so a request no plan touches crosses byte-identical, framing included.

Responses come back in request order, so the session keeps one :class:`_Slot` per
request not yet answered, in order; a plan's own answer (an abort) goes out when every
earlier response has. What goes to the client passes through one queue (``_out``),
emptied by :meth:`Session._pump` as the plans' timers allow.

Every state of the two streams and every transition between them is in
:data:`TRANSITIONS` (h11's ``_state.py`` rule: what changes a stream's state is there,
nowhere else).
"""

from __future__ import annotations

import enum
import http
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import h11

from faultnet.protocols._states import step

__all__ = [
    "DATA_COMMANDS",
    "MAX_BUFFER",
    "MAX_HEAD",
    "Answer",
    "Close",
    "Command",
    "Duplex",
    "Eof",
    "Forward",
    "Hold",
    "Inject",
    "Plan",
    "Reset",
    "Resume",
    "Session",
    "answer_bytes",
    "parse_header_lines",
    "rewrite_head",
]

UP, DOWN = "upstream", "downstream"

#: The largest request or response head parsed. nginx's default ceiling is 4 x 8 KiB
#: (large_client_header_buffers), Apache's 100 fields of 8 KiB; 64 KiB carries a
#: server's "huge headers" test. A larger head turns the stream opaque (forwarded
#: untouched). Issue 33: at 1 MiB an unfinished head cost 2.4 MB a connection.
MAX_HEAD = 64 * 1024

#: The most client bytes kept while they wait (behind an unanswered Upgrade or
#: CONNECT): past it the upstream stream is held, unread (issue 33: +308 MB unbounded).
MAX_BUFFER = 64 * 1024


# -- commands --------------------------------------------------------------------------


@dataclass
class Forward:
    """Send the stream's own bytes on (a plan's rewrite of a head included)."""

    stream: str
    data: bytes
    t_read: float | None = None


@dataclass
class Inject:
    """Send bytes the session made (an abort's answer) on *stream*."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class Hold:
    """Read no more of *stream* until trio time *until* (then call
    :meth:`Session.timer`), or, *until* None, until a :class:`Resume` of it."""

    stream: str
    until: float | None


@dataclass(frozen=True)
class Resume:
    """A :class:`Hold` with no time on *stream* is over: call :meth:`Session.timer`."""

    stream: str


@dataclass(frozen=True)
class Eof:
    """The end of *stream* (a FIN; the other direction stays open)."""

    stream: str


@dataclass(frozen=True)
class Close:
    """End the connection: FIN both ways, after what was sent."""


@dataclass(frozen=True)
class Reset:
    """End the connection: RST both ways, after what was sent."""


Command = Forward | Inject | Hold | Resume | Eof | Close | Reset
#: The commands that carry bytes (a tuple: ``Forward | Inject`` in place builds a union
#: at every call).
DATA_COMMANDS = (Forward, Inject)


class Duplex:
    """What every protocol session (this HTTP/1.1 one, :mod:`faultnet.protocols.http2`'s,
    :mod:`faultnet.protocols.resp`'s) shares: events in by stream, commands out in order. A subclass handles each
    stream's bytes and end (``_upstream``, ``_downstream``, ``_upstream_eof``,
    ``_downstream_eof``) by :meth:`_emit`-ting commands."""

    def __init__(self) -> None:
        self._cmds: list[Command] = []

    def receive(self, stream: str, data: bytes, now: float) -> list[Command]:
        """Bytes read on *stream* at trio time *now*."""
        if stream == UP:
            self._upstream(data, now)
        else:
            self._downstream(data, now)
        return self._take()

    def receive_eof(self, stream: str, now: float) -> list[Command]:
        """The end of *stream*."""
        if stream == UP:
            self._upstream_eof(now)
        else:
            self._downstream_eof(now)
        return self._take()

    def _upstream(self, data: bytes, now: float) -> None:
        raise NotImplementedError

    def _downstream(self, data: bytes, now: float) -> None:
        raise NotImplementedError

    def _upstream_eof(self, now: float) -> None:
        raise NotImplementedError

    def _downstream_eof(self, now: float) -> None:
        raise NotImplementedError

    def _take(self) -> list[Command]:
        cmds, self._cmds = self._cmds, []
        return cmds

    def _emit(self, cmd: Command) -> None:
        if isinstance(cmd, DATA_COMMANDS) and not cmd.data:
            return
        last = self._cmds[-1] if self._cmds else None
        # The spans of one chunk (a head, its body, the end) leave in one write, not
        # three. (Measured: three small writes to a client socket without TCP_NODELAY
        # met its delayed ACK, 45 ms per keep-alive request instead of 0.5.)
        if isinstance(cmd, Forward) and isinstance(last, Forward) and last.stream == cmd.stream:
            last.data += cmd.data
        else:
            self._cmds.append(cmd)


# -- plans -----------------------------------------------------------------------------


@dataclass
class Answer:
    """A response a plan makes itself; the request is not forwarded."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Plan:
    """What one toxic does to one request and its response: data, no code that runs
    I/O. The default passes both."""

    #: What was done, for the event log (``abort``, ``delay``, ...), and its figures.
    action: str = "pass"
    detail: dict[str, object] = field(default_factory=dict)
    #: Answer the request with this instead of forwarding it.
    answer: Answer | None = None
    #: Never forward this request, nor anything after it; nothing answers it.
    hold: bool = False
    #: Hold the request this long (seconds) from when its head came before the server
    #: sees any of it; the client's stream is not read meanwhile (what came behind it
    #: in the same read waits with it).
    delay_request: float = 0.0
    #: Reset the connection (RST both ways) when this request's head comes; it is not
    #: forwarded, and responses still owed to earlier pipelined requests are lost.
    reset: bool = False
    #: Rewrite the request's head (status line and headers, CRLFs included).
    request_head: Callable[[bytes], bytes] | None = None
    #: Rewrite the response's head.
    response_head: Callable[[bytes], bytes] | None = None
    #: Hold the response this long (seconds) before its head, or (*delay_body*)
    #: before its first body byte, from when that reached the proxy.
    delay: float = 0.0
    delay_body: bool = False
    #: Pace the body's wire bytes at this many bytes a second (0: no pacing).
    rate: int = 0
    #: After the head and this many body bytes, end the connection: ``cut`` is
    #: :class:`Close` or :class:`Reset` (None: no cut).
    cut: type[Close] | type[Reset] | None = None
    cut_after: int = 0

    @property
    def touches_response(self) -> bool:
        """True if the plan does anything to the response's bytes or their timing."""
        return bool(self.response_head or self.delay or self.rate or self.cut is not None)

    @property
    def on_response(self) -> bool:
        """True if the plan acts on the response (logged when it does, not before)."""
        return self.touches_response and not (self.answer or self.hold or self.reset)


#: The plan of every request no rule picked (never changed: shared).
_PASS = Plan()

Decide = Callable[[h11.Request], Plan | None]
Log = Callable[..., None]


# -- the states, all in one place ------------------------------------------------------


class Up(enum.Enum):
    """The client-to-server stream."""

    IDLE = "idle"  # between requests
    SENDING = "sending"  # a request is crossing
    DROPPING = "dropping"  # an answered request's body: read, not forwarded
    SWITCHING = "switching"  # an Upgrade or CONNECT crossing
    WAITING = "waiting"  # its answer awaited: later bytes kept (bounded), not parsed
    HELD = "held"  # a held request: nothing more is forwarded
    DELAYING = "delaying"  # a request held back for its time: not read meanwhile
    OPAQUE = "opaque"  # upgraded, or bytes h11 refuses: forwarded as they come
    DONE = "done"  # its end was passed on, or the connection ended


class Down(enum.Enum):
    """The server-to-client stream."""

    UNSYNCED = "unsynced"  # the session began mid-stream: pass until a request is seen
    IDLE = "idle"  # between responses
    RESPONDING = "responding"  # a response is crossing
    OPAQUE = "opaque"
    DONE = "done"


class Ev(enum.Enum):
    """What moves a stream from one state to another."""

    REQUEST = "request"
    REQUEST_ANSWERED = "request answered"
    REQUEST_HELD = "request held"
    REQUEST_DELAYED = "request delayed"
    DELAY_OVER = "delay over"
    REQUEST_SWITCH = "request switch"
    REQUEST_END = "request end"
    SWITCH_REFUSED = "switch refused"
    SWITCHED = "switched"
    UNREADABLE = "unreadable"
    RESPONSE = "response"
    RESPONSE_END = "response end"
    END = "end"  # the stream's end passed on
    ENDED = "ended"  # the connection ended (a plan's close or reset)


#: (state, event) -> next state, for each stream. A pair not here is a bug (KeyError).
TRANSITIONS: dict[tuple[Up | Down, Ev], Up | Down] = {
    # client to server
    (Up.IDLE, Ev.REQUEST): Up.SENDING,
    (Up.IDLE, Ev.REQUEST_ANSWERED): Up.DROPPING,
    (Up.IDLE, Ev.REQUEST_HELD): Up.HELD,
    (Up.IDLE, Ev.REQUEST_SWITCH): Up.SWITCHING,
    (Up.IDLE, Ev.REQUEST_DELAYED): Up.DELAYING,
    (Up.DELAYING, Ev.DELAY_OVER): Up.SENDING,
    (Up.SENDING, Ev.REQUEST_END): Up.IDLE,
    (Up.DROPPING, Ev.REQUEST_END): Up.IDLE,
    (Up.SWITCHING, Ev.REQUEST_END): Up.WAITING,
    (Up.SWITCHING, Ev.SWITCH_REFUSED): Up.SENDING,  # refused before its body ended
    (Up.SWITCHING, Ev.SWITCHED): Up.OPAQUE,
    (Up.WAITING, Ev.SWITCH_REFUSED): Up.IDLE,
    (Up.WAITING, Ev.SWITCHED): Up.OPAQUE,
    **{(s, Ev.UNREADABLE): Up.OPAQUE for s in (Up.IDLE, Up.SENDING, Up.DROPPING, Up.SWITCHING)},
    **{(s, Ev.END): Up.DONE for s in Up},
    **{(s, Ev.ENDED): Up.DONE for s in Up},
    # server to client
    (Down.UNSYNCED, Ev.REQUEST): Down.IDLE,
    (Down.IDLE, Ev.RESPONSE): Down.RESPONDING,
    (Down.RESPONDING, Ev.RESPONSE_END): Down.IDLE,
    (Down.IDLE, Ev.SWITCHED): Down.OPAQUE,  # a 101 (h11 pauses before its head)
    (Down.RESPONDING, Ev.SWITCHED): Down.OPAQUE,  # a CONNECT's 2xx
    (Down.IDLE, Ev.UNREADABLE): Down.OPAQUE,
    (Down.RESPONDING, Ev.UNREADABLE): Down.OPAQUE,
    **{(s, Ev.END): Down.DONE for s in Down},
    **{(s, Ev.ENDED): Down.DONE for s in Down},
}


# -- parsing ---------------------------------------------------------------------------


@dataclass
class _Slot:
    """One request waiting for its response, in order."""

    plan: Plan
    request: h11.Request
    #: The plan's own answer, made; ``ready`` once the request's body was read.
    answer: bytes | None = None
    close: bool = False
    ready: bool = True
    #: An Upgrade or CONNECT: a successful answer turns both streams opaque.
    switch: bool = False
    logged: bool = False
    # The response's progress through its plan.
    body_at: float | None = None
    sent: int = 0


@dataclass
class _Parser:
    """An h11 connection and the bytes fed to it that no event has accounted for yet.

    A read fed while nothing is pending is kept as it came (``bytes``), and an event
    that consumes all of it (a body chunk, a whole keep-alive request) gets that very
    object as its span: a 64 KiB body chunk crosses with no copy of ours (a buffer
    copied it in, sliced it out and moved the rest: three copies a chunk). Only a read
    that joins bytes already pending makes a buffer (``bytearray``: a head in many
    small reads costs linear time, not quadratic)."""

    conn: h11.Connection
    slot: _Slot | None = None
    pending: bytes | bytearray = b""
    #: Nothing was given to h11 yet (not even an end): it can only need data.
    fresh: bool = True

    def feed(self, data: bytes) -> None:
        if data:
            self.conn.receive_data(data)
            if not self.pending:
                self.pending = data
            elif isinstance(self.pending, bytearray):
                self.pending += data
            else:
                self.pending = bytearray(self.pending) + data
            self.fresh = False

    def feed_eof(self) -> None:
        self.conn.receive_data(b"")
        self.fresh = False

    def rest(self) -> bytes:
        """The bytes no event has accounted for (kept: the caller drops the parser)."""
        return bytes(self.pending)

    def next(self) -> tuple[object, bytes]:
        """The next event and its span of the original bytes (none for NEED_DATA and
        PAUSED: bytes consumed without an event belong to the next event's span)."""
        if self.fresh:
            # The parser made at each message's end, asked before any byte of the next
            # came: h11's answer is NEED_DATA (asking it cost a sixth of its events).
            return h11.NEED_DATA, b""
        event = self.conn.next_event()
        if event is h11.NEED_DATA or event is h11.PAUSED:
            return event, b""
        pending = self.pending
        left = len(self.conn.trailing_data[0])
        if not left:
            self.pending = b""
            return event, bytes(pending)  # no copy of bytes
        used = len(pending) - left
        span = bytes(pending[:used])
        if isinstance(pending, bytearray):
            del pending[:used]
        else:
            self.pending = pending[used:]
        return event, span


def _server_parser() -> _Parser:
    return _Parser(h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD))


#: The request h11 is told a response answers, by method (see :func:`_client_parser`):
#: made once (an event's validation cost a tenth of the session's time per request).
_FRAMING = {
    method: h11.Request(method=method, target=b"/", headers=[(b"host", b"faultnet")])
    for method in (b"GET", b"HEAD", b"CONNECT")
}
_END = h11.EndOfMessage()


def _client_parser(slot: _Slot) -> _Parser:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    # h11 frames a response by the request it answers: HEAD has no body, a CONNECT's
    # 2xx and an Upgrade's 101 switch protocols. Nothing else of the request matters to
    # the framing, so h11 is told only that (the whole head, revalidated, cost a quarter
    # of the session's time per keep-alive request).
    method = slot.request.method
    method = method if method in (b"HEAD", b"CONNECT") else b"GET"
    upgrade = _header(slot.request, b"upgrade") if slot.switch else []
    if upgrade:
        headers = [(b"host", b"faultnet"), (b"connection", b"upgrade")]
        headers.append((b"upgrade", upgrade[0] or b"x"))
        conn.send(h11.Request(method=method, target=b"/", headers=headers))
    else:
        conn.send(_FRAMING[method])
    conn.send(_END)
    return _Parser(conn, slot)


def _header(request: h11.Request, name: bytes) -> list[bytes]:
    return [v.lower() for k, v in request.headers if k == name]


def _wants_switch(request: h11.Request) -> bool:
    return request.method == b"CONNECT" or bool(_header(request, b"upgrade"))


def _keeps_alive(request: h11.Request) -> bool:
    """Whether the client may send another request after this one's answer."""
    tokens = {t.strip() for v in _header(request, b"connection") for t in v.split(b",")}
    if request.http_version == b"1.0":
        return b"keep-alive" in tokens
    return b"close" not in tokens


def _expects_continue(request: h11.Request) -> bool:
    return b"100-continue" in _header(request, b"expect")


# -- the session -----------------------------------------------------------------------


class _Part(enum.Enum):
    HEAD, BODY, END, RAW, ANSWER, EOF = range(6)


@dataclass
class _Out:
    """Something waiting to go to the client, in order."""

    part: _Part
    data: bytes
    slot: _Slot | None
    t: float


class Session(Duplex):
    """One connection's HTTP/1.1 traffic through one toxic (see the module docstring).

    *decide* says what to do with each request (None: pass it); *log* is told each fault
    when it takes effect, and each stream that turned opaque.
    """

    def __init__(self, decide: Decide, log: Log = lambda event, **fields: None) -> None:
        super().__init__()
        self.decide = decide
        self.log_event = log
        self.up = Up.IDLE
        self.down = Down.UNSYNCED
        self.slots: deque[_Slot] = deque()
        self._request = _server_parser()
        self._response: _Parser | None = None
        self._waiting = bytearray()  # client bytes behind an Upgrade's answer
        self._up_eof = False  # the client's end came (while WAITING or HELD)
        self._down_eof = False
        self._out: deque[_Out] = deque()
        self._holding = False  # the downstream is held for a plan's time
        self._delayed = b""  # a delayed request's head, sent at ``_delayed_until``
        self._delayed_until = 0.0

    # -- events in, commands out --

    def timer(self, stream: str, now: float) -> list[Command]:
        """A :class:`Hold` of *stream* came due (or was resumed)."""
        if stream == DOWN:
            self._holding = False
            self._pump(now)
        elif self.up is Up.DELAYING:
            self._delay_over(now)
        elif self.up is Up.WAITING and len(self._waiting) > MAX_BUFFER:
            self._emit(Hold(UP, None))  # still behind its answer
        return self._take()

    @property
    def buffered(self) -> int:
        """Bytes the session holds now (bounded: :data:`MAX_HEAD` per stream's parser,
        :data:`MAX_BUFFER` behind an Upgrade, one read chunk in the queue to the client)."""
        held = len(self._request.pending) + len(self._waiting) + len(self._delayed)
        if self._response is not None:
            held += len(self._response.pending)
        return held + sum(len(o.data) for o in self._out)

    # -- internals --

    # (Methods, not ``is`` in place: mypy narrows a state across the calls that change it.)
    def _up_is(self, state: Up) -> bool:
        return self.up is state

    def _down_is(self, state: Down) -> bool:
        return self.down is state

    def _go_up(self, event: Ev) -> None:
        self.up = step(TRANSITIONS, self.up, event)

    def _go_down(self, event: Ev) -> None:
        self.down = step(TRANSITIONS, self.down, event)

    def _end(self, cmd: Close | Reset) -> None:
        self._emit(cmd)
        self._go_up(Ev.ENDED)
        self._go_down(Ev.ENDED)
        self._drop_buffers()

    def _drop_buffers(self) -> None:
        self._out.clear()
        self._waiting = bytearray()
        self._delayed = b""
        self._request = _server_parser()
        self._response = None
        self.slots.clear()

    def _log(self, slot: _Slot) -> None:
        if slot.logged or slot.plan.action == "pass":
            return
        slot.logged = True
        self.log_event(
            "http_fault",
            method=slot.request.method.decode("latin-1"),
            path=slot.request.target.decode("latin-1"),
            action=slot.plan.action,
            **slot.plan.detail,
        )

    # -- client to server --

    def _upstream(self, data: bytes, now: float) -> None:
        if self.up in (Up.HELD, Up.DONE):
            return
        if self.up is Up.DELAYING:  # not read while held: only what a driver had
            return self._request.feed(data)  # kept, parsed when the delay is over
        if self.up is Up.OPAQUE:
            return self._emit(Forward(UP, data, now))
        if self.up is Up.WAITING:
            return self._wait(data)
        try:
            self._request.feed(data)
        except h11.RemoteProtocolError:
            return self._up_unreadable(now)
        self._parse_requests(now)

    def _wait(self, data: bytes) -> None:
        """Keep client bytes that came behind an Upgrade until its answer says what they
        are; past MAX_BUFFER of them, stop reading the client."""
        self._waiting += data
        if len(self._waiting) > MAX_BUFFER:
            self._emit(Hold(UP, None))

    def _parse_requests(self, now: float) -> None:
        while self.up not in (Up.HELD, Up.DONE, Up.WAITING, Up.OPAQUE, Up.DELAYING):
            try:
                event, span = self._request.next()
            except h11.RemoteProtocolError:
                return self._up_unreadable(now)
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                span = self._on_request(event, span, now)
            if self.up in (Up.SENDING, Up.SWITCHING):
                self._emit(Forward(UP, span, now))
            if isinstance(event, h11.EndOfMessage) and not self._up_is(Up.HELD):
                self._on_request_end(now)

    def _on_request(self, request: h11.Request, head: bytes, now: float) -> bytes:
        if self.down is Down.UNSYNCED:
            # A session that began mid-stream (a toxic added to an open connection)
            # passed the server's bytes untouched; a request means the next response
            # starts afresh (a client that pipelined across the change is the risk).
            self._go_down(Ev.REQUEST)
        plan = self.decide(request) or _PASS
        slot = _Slot(plan, request)
        if plan.hold:
            self._log(slot)
            self._go_up(Ev.REQUEST_HELD)
            self._request = _server_parser()
            if self._down_eof:
                self._end(Close())  # both ends gone: nothing is left to wait for
            return b""
        if plan.reset:
            self._log(slot)
            self._end(Reset())
            return b""
        if plan.answer is not None:
            slot.answer, slot.close = _answer(plan.answer, request)
            # A client waiting for 100 Continue sends no body until answered: answer
            # now, and close after (the body it may still send would read as a request).
            slot.ready = _expects_continue(request)
            self._log(slot)
            self._go_up(Ev.REQUEST_ANSWERED)
        elif _wants_switch(request):
            slot.switch = True
            self._go_up(Ev.REQUEST_SWITCH)
        elif plan.delay_request > 0:
            self._delay(plan, head, now)
        else:
            self._go_up(Ev.REQUEST)
        if not plan.on_response:
            self._log(slot)
        self.slots.append(slot)
        if slot.answer is not None and slot.ready:
            self._drain(now)
            self._pump(now)
        return plan.request_head(head) if plan.request_head else head

    def _delay(self, plan: Plan, head: bytes, now: float) -> None:
        """Hold the request back: its head (rewritten) is kept, the rest of what came
        stays in the parser, and the client's stream is not read until the time."""
        self._go_up(Ev.REQUEST_DELAYED)
        self._delayed = plan.request_head(head) if plan.request_head else head
        self._delayed_until = now + plan.delay_request
        self._emit(Hold(UP, self._delayed_until))

    def _delay_over(self, now: float) -> None:
        if now < self._delayed_until:
            return self._emit(Hold(UP, self._delayed_until))
        head, self._delayed = self._delayed, b""
        self._go_up(Ev.DELAY_OVER)
        self._emit(Forward(UP, head, now))
        self._parse_requests(now)
        if self._up_eof and self.up not in (Up.DONE, Up.HELD, Up.WAITING, Up.DELAYING):
            self._upstream_eof(now)

    def _on_request_end(self, now: float) -> None:
        rest = self._request.rest()
        self._request = _server_parser()
        slot = self.slots[-1] if self.slots else None
        self._go_up(Ev.REQUEST_END)
        if slot is not None and slot.answer is not None and not slot.ready:
            slot.ready = True
            self._drain(now)
            self._pump(now)
        if self.up is Up.DONE:
            return
        if self.up is Up.WAITING:
            return self._wait(rest)
        try:
            self._request.feed(rest)
        except h11.RemoteProtocolError:
            self._up_unreadable(now)

    def _up_unreadable(self, now: float) -> None:
        dropping = self.up is Up.DROPPING
        self._go_up(Ev.UNREADABLE)
        self.log_event("http_opaque", stream=UP)
        if not dropping and self._request.pending:
            self._emit(Forward(UP, self._request.rest(), now))
        self._request = _server_parser()

    def _upstream_eof(self, now: float) -> None:
        self._up_eof = True
        if self.up is Up.DONE:
            return
        if self.up is Up.HELD:
            if self._down_eof:
                self._end(Close())  # issue 33, 3: else its sockets stayed in CLOSE-WAIT
            return  # held: the server never hears of it
        if self.up in (Up.WAITING, Up.DELAYING):
            return  # passed on after the answer, or the delay
        if self.up is not Up.OPAQUE and self._request.pending:
            # A request the client never finished: pass what came, as it came.
            self._emit(Forward(UP, self._request.rest(), now))
        self._request = _server_parser()
        self._emit(Eof(UP))
        self._go_up(Ev.END)

    # -- server to client --

    def _downstream(self, data: bytes, now: float) -> None:
        if self.down is Down.DONE:
            return
        if self.down in (Down.OPAQUE, Down.UNSYNCED):
            self._queue(_Part.RAW, data, None, now)
            return self._pump(now)
        parser = self._response
        if parser is None:
            # Bound to its request when its first byte arrives: by then the request has
            # crossed, so its slot is queued.
            parser = self._response = _client_parser(self._head_slot())
        try:
            parser.feed(data)
        except h11.RemoteProtocolError:
            return self._down_unreadable(now)
        self._parse_responses(now)
        self._pump(now)

    def _parse_responses(self, now: float) -> None:
        while self.down in (Down.IDLE, Down.RESPONDING) and self._response is not None:
            parser = self._response
            slot = parser.slot
            assert slot is not None
            try:
                event, span = parser.next()
            except h11.RemoteProtocolError:
                return self._down_unreadable(now)
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:  # a 101: opaque from here on, both ways
                return self._switched(parser, now)
            if isinstance(event, h11.InformationalResponse):
                self._out.append(_Out(_Part.RAW, span, None, now))
            elif isinstance(event, h11.Response):
                self._go_down(Ev.RESPONSE)
                self._queue(_Part.HEAD, span, slot, now)
                if slot.switch:
                    if slot.request.method == b"CONNECT" and 200 <= event.status_code < 300:
                        return self._switched(parser, now)
                    self._switch_refused(now)
            elif isinstance(event, h11.Data):
                self._queue(_Part.BODY, span, slot, now)
            elif isinstance(event, h11.EndOfMessage):
                self._queue(_Part.END, span, slot, now)
                self._go_down(Ev.RESPONSE_END)
                if self.slots and self.slots[0] is slot:
                    self.slots.popleft()
                rest = parser.rest()
                self._response = None
                self._drain(now)
                if not rest:
                    return
                self._response = _client_parser(self._head_slot())
                try:
                    self._response.feed(rest)
                except h11.RemoteProtocolError:
                    return self._down_unreadable(now)
            else:  # ConnectionClosed: nothing more will come
                self._out.append(_Out(_Part.RAW, span, None, now))
                return

    def _head_slot(self) -> _Slot:
        # The request the next response answers; a response nobody asked for (a 408
        # before any request) is framed as a GET's and passed.
        for slot in self.slots:
            if slot.answer is None:
                return slot
        return _Slot(_PASS, h11.Request(method="GET", target="/", headers=[("host", "x")]))

    def _switched(self, parser: _Parser, now: float) -> None:
        self._go_down(Ev.SWITCHED)
        rest = parser.rest()
        self._response = None
        if rest:
            self._out.append(_Out(_Part.RAW, rest, None, now))
        if self.up in (Up.SWITCHING, Up.WAITING):
            waiting, self._waiting = bytes(self._waiting), bytearray()
            if self.up is Up.SWITCHING:  # a 101 before the request's body ended
                waiting = self._request.rest() + waiting
                self._request = _server_parser()
            was_waiting = self.up is Up.WAITING
            self._go_up(Ev.SWITCHED)
            if waiting:
                self._emit(Forward(UP, waiting, now))
            self._after_waiting(was_waiting, now)

    def _switch_refused(self, now: float) -> None:
        if self.up is Up.SWITCHING:
            return self._go_up(Ev.SWITCH_REFUSED)
        if self.up is not Up.WAITING:
            return
        waiting, self._waiting = bytes(self._waiting), bytearray()
        self._go_up(Ev.SWITCH_REFUSED)
        if waiting:
            try:
                self._request.feed(waiting)
            except h11.RemoteProtocolError:
                self._up_unreadable(now)
            else:
                self._parse_requests(now)
        self._after_waiting(True, now)

    def _after_waiting(self, was_waiting: bool, now: float) -> None:
        # The upstream's task may be held (its bytes over the bound): let it read again;
        # an end that came meanwhile is passed on now.
        if was_waiting:
            self._emit(Resume(UP))
        if self._up_eof and self.up not in (Up.DONE, Up.HELD):
            self._upstream_eof(now)

    def _drain(self, now: float) -> None:
        """Queue the plans' own answers now at the head of the slots."""
        while self.slots and self.slots[0].answer is not None and self.slots[0].ready:
            slot = self.slots.popleft()
            assert slot.answer is not None
            self._out.append(_Out(_Part.ANSWER, slot.answer, slot, now))

    def _down_unreadable(self, now: float) -> None:
        self._go_down(Ev.UNREADABLE)
        self.log_event("http_opaque", stream=DOWN)
        if self._response is not None and self._response.pending:
            self._out.append(_Out(_Part.RAW, self._response.rest(), None, now))
        self._response = None
        self._pump(now)

    def _downstream_eof(self, now: float) -> None:
        self._down_eof = True
        if self.down is Down.DONE:
            return
        if self.up is Up.HELD and self._up_eof:
            return self._end(Close())
        if self.down in (Down.IDLE, Down.RESPONDING) and self._response is not None:
            self._response.feed_eof()  # a response framed by the close ends
            self._parse_responses(now)
        self._drain(now)
        if self._response is not None and self._response.pending:
            self._out.append(_Out(_Part.RAW, self._response.rest(), None, now))
        self._response = None
        self._out.append(_Out(_Part.EOF, b"", None, now))
        self._pump(now)

    # -- the queue to the client --

    def _queue(self, part: _Part, data: bytes, slot: _Slot | None, now: float) -> None:
        """Queue the server's *data* for the client, or send it at once when nothing
        waits before it and its plan leaves the response alone: what :meth:`_pump`
        would do with it, without the queue. (Not an Upgrade's answer: the client's
        bytes it releases go first, as the queue orders them.)"""
        if (
            self._out
            or self._holding
            or (slot is not None and (slot.switch or slot.plan.touches_response))
        ):
            return self._out.append(_Out(part, data, slot, now))  # the caller pumps
        self._emit(Forward(DOWN, data, now))

    def _pump(self, now: float) -> None:
        """Send what the plans' times allow, in order; a plan that must wait holds the
        downstream (the driver calls :meth:`timer` then)."""
        while self._out and not self._holding and self.down is not Down.DONE:
            item = self._out[0]
            slot = item.slot
            if item.part is _Part.RAW:
                self._emit(Forward(DOWN, item.data, item.t))
            elif item.part is _Part.EOF:
                self._emit(Eof(DOWN))
                self._go_down(Ev.END)
            elif item.part is _Part.ANSWER:
                assert slot is not None
                self._emit(Inject(DOWN, item.data))
                if slot.close:
                    self._out.popleft()
                    return self._end(Close())
            else:
                assert slot is not None
                if not self._respond(item, slot, now):
                    self._holding = True
                    return
                if self._down_is(Down.DONE):
                    return
                if item.data:
                    continue  # a paced body, part sent
            self._out.popleft()

    def _respond(self, item: _Out, slot: _Slot, now: float) -> bool:
        """Send what *slot*'s plan lets go of *item* now; False (a Hold emitted) if it
        must wait. A paced body's item keeps what is not sent yet."""
        plan = slot.plan
        if item.part is _Part.HEAD:
            if plan.delay and not plan.delay_body and now < item.t + plan.delay:
                self._emit(Hold(DOWN, item.t + plan.delay))
                return False
            self._log(slot)
            head = plan.response_head(item.data) if plan.response_head else item.data
            self._emit(Forward(DOWN, head, item.t))
            item.data = b""
            if plan.cut is not None and plan.cut_after <= 0:
                self._end(plan.cut())
            return True
        if slot.body_at is None:
            slot.body_at = item.t if plan.delay_body else now
        if plan.delay and plan.delay_body and now < slot.body_at + plan.delay:
            self._emit(Hold(DOWN, slot.body_at + plan.delay))
            return False
        data = item.data
        if plan.rate:
            # About 20 writes a second: smooth enough for a client's progress, few
            # enough not to cost the proxy.
            due = slot.body_at + slot.sent / plan.rate
            if data and now < due:
                self._emit(Hold(DOWN, due))
                return False
            data = data[: max(1, plan.rate // 20)]
        item.data = item.data[len(data) :]
        if plan.cut is not None:
            left = plan.cut_after - slot.sent
            self._emit(Forward(DOWN, data[: max(0, left)], item.t))
            slot.sent += len(data)
            if slot.sent >= plan.cut_after and data:
                self._end(plan.cut())
            return True
        slot.sent += len(data)
        self._emit(Forward(DOWN, data, item.t))
        return True


def _answer(answer: Answer, request: h11.Request) -> tuple[bytes, bool]:
    """An abort's bytes for *request*, and whether the connection closes after them:
    when the client said it would not send another request (HTTP/1.0 without keep-alive,
    ``Connection: close``) or waits for ``100 Continue`` (its body may follow, and would
    read as a request); such an answer says ``Connection: close``."""
    close = not _keeps_alive(request) or _expects_continue(request)
    headers = list(answer.headers)
    if close and not any(n.lower() == "connection" for n, _ in headers):
        headers.append(("Connection", "close"))
    data = answer_bytes(answer.status, answer.body, headers, request.method == b"HEAD")
    return data, close


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
    *head_only* (the answer to a HEAD). A 1xx, 204 or 304 has no body whatever *body*
    says (RFC 9110 6.4.1; issue 33: the body was read as the next response), and a 1xx
    or 204 no Content-Length."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Fault"
    bodiless = status < 200 or status in (204, 304)
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{n}: {v}" for n, v in headers]
    if not bodiless and not any(n.lower() == "content-length" for n, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only or bodiless else head + body
