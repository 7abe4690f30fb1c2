"""HTTP/2 (and gRPC, which is HTTP/2) request-level faults: a pure session that reads
one connection's frames with h2's own parsers and applies a plan to each stream.

Theory of operation
-------------------

:class:`Session` is sans-I/O, as :class:`faultnet.protocols.http.Session` is, and
speaks its command vocabulary (:class:`~faultnet.protocols.http.Forward`,
:class:`~faultnet.protocols.http.Inject`, :class:`~faultnet.protocols.http.Hold`, ...):
bytes, ends and timers in, commands out; whoever runs one runs the other.

Frames, not connections. h2's ``H2Connection`` is a whole endpoint: two of them (a
server facing the client, a client facing the server) would re-encode every frame,
so nothing would cross as it came, and the two HPACK contexts and flow-control windows
would be the proxy's, not the peers'. Instead each frame is cut with h2's frame parser
(hyperframe) and forwarded as the bytes it came as; only header blocks are decoded
(hpack), because a rule needs the request's ``:method``, ``:path`` and headers, and
because HPACK is a state both ends share: every block must be decoded, in order, to
know that state. (Measured, CPU time per gRPC unary call, its six frames both ways,
2,000 calls on one connection, this machine at load ~14: 80-95 µs through this
session; 314 µs through two ``H2Connection`` relaying events, whose request left 42
bytes where 33 came.)

What HPACK forbids, and what is done instead:

* A header block cannot be dropped, nor moved past another one: the receiver's
  dynamic table is built by every block in order. So the frames to the client leave in
  the order they came (one queue, as the HTTP/1.1 session's); a delayed response holds
  the frames behind it, other streams' included, as a server's one connection would.
* A request that is not forwarded (an answer, a hold, a reset, a GOAWAY) is a header
  block the server never decodes. If decoding it changed the dynamic table (the
  client's first requests do; a gRPC client's repeated calls usually do not), the
  server's table is behind the client's from then on, and every later block on that
  stream of bytes is re-encoded without the dynamic table (static indices and
  literals, "never indexed", which no table state can misread). Until then, bytes are
  untouched.
* Answers the session makes are encoded the same way, so they leave the client's table
  as it was.

A request's DATA frames that the server never sees were still counted against the
connection's flow-control window by the client: the session gives that window back
(a WINDOW_UPDATE on stream 0), as the real server would have.

Every state of the two directions and of a stream, and every transition, is in
:data:`TRANSITIONS` (h11's ``_state.py`` rule).
"""

from __future__ import annotations

import enum
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import hpack
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hpack.table import HeaderTable
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from faultnet.protocols._states import step
from faultnet.protocols.http import (
    DOWN,
    MAX_BUFFER,
    MAX_HEAD,
    UP,
    Command,
    Duplex,
    Eof,
    Forward,
    Hold,
    Inject,
    Resume,
)

__all__ = [
    "GRPC_STATUS",
    "PREFACE",
    "H2Request",
    "Session",
    "StreamPlan",
    "grpc_answer",
    "is_preface",
    "is_server_preface",
]

#: The client connection preface (RFC 9113 3.4): h2c with prior knowledge, and
#: HTTP/2 inside TLS (ALPN ``h2``), both begin with it.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

#: gRPC's status codes by name (grpc/doc/statuscodes.md).
GRPC_STATUS = {
    name: code
    for code, name in enumerate(
        "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS "
        "PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE "
        "UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS UNAUTHENTICATED".split()
    )
}

#: The largest frame every peer must accept (SETTINGS_MAX_FRAME_SIZE's initial value).
MIN_MAX_FRAME = 16_384


def is_preface(data: bytes) -> bool | None:
    """Whether a connection whose client sent *data* first speaks HTTP/2 (None: too
    few bytes yet to say)."""
    if PREFACE.startswith(data[: len(PREFACE)]):
        return True if len(data) >= len(PREFACE) else None
    return False


def is_server_preface(data: bytes) -> bool:
    """Whether *data*, the first a server sent, begins as an HTTP/2 server's does: a
    SETTINGS frame on stream 0 (an HTTP/1.1 server that speaks first says ``HTTP/``)."""
    if len(data) < 9:
        return False
    try:
        frame, _ = Frame.parse_frame_header(memoryview(data[:9]))
    except HyperframeError:
        return False
    return isinstance(frame, SettingsFrame) and frame.stream_id == 0


# -- requests and plans ----------------------------------------------------------------


@dataclass
class H2Request:
    """A request's head as the rules see it: the names an HTTP/1.1 request has
    (``method``, ``target``, ``headers`` in lower case, ``host`` from ``:authority``)."""

    stream_id: int
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass
class StreamPlan:
    """What one toxic does to one stream: data, no code. The default passes it."""

    action: str = "pass"
    detail: dict[str, object] = field(default_factory=dict)
    #: Answer with these headers (``:status`` first) and *body*, END_STREAM; the
    #: request is not forwarded. With no body, the headers carry END_STREAM.
    answer: list[tuple[str, str]] | None = None
    body: bytes = b""
    #: Never forward the request, never answer it.
    hold: bool = False
    #: RST_STREAM the stream with this error code when its request comes (not
    #: forwarded).
    rst: int | None = None
    #: GOAWAY with this error code when the request comes: the request (and every later
    #: one) is not forwarded, and the GOAWAY's last stream is the last one that was.
    goaway: int | None = None
    #: Hold the response's headers (or, *delay_body*, its first DATA) this long.
    delay: float = 0.0
    delay_body: bool = False
    #: Pace the response's DATA payload at this many bytes a second (0: no pacing).
    rate: int = 0

    @property
    def on_response(self) -> bool:
        """True if the plan acts on the response (logged when it does)."""
        return bool(self.delay or self.rate)


def grpc_answer(status: str, message: str) -> list[tuple[str, str]]:
    """A gRPC trailers-only response (a HEADERS frame with END_STREAM) with
    ``grpc-status`` *status* (a name of :data:`GRPC_STATUS`) and ``grpc-message``
    *message*, percent-encoded as the gRPC spec says."""
    safe = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
    return [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", str(GRPC_STATUS[status])),
        ("grpc-message", urllib.parse.quote(message, safe=safe)),
    ]


Decide = Callable[[H2Request], StreamPlan | None]
Log = Callable[..., None]


# -- the states, all in one place ------------------------------------------------------


class Dir(enum.Enum):
    """A direction (client to server, server to client)."""

    PREFACE = "preface"  # client to server: the preface is not through yet
    FRAMES = "frames"
    OPAQUE = "opaque"  # bytes not understood: forwarded as they come
    DONE = "done"


class St(enum.Enum):
    """A client stream."""

    NEW = "new"
    OPEN = "open"  # forwarded
    HELD = "held"  # never forwarded, never answered
    ANSWERED = "answered"  # answered here, not forwarded
    RESET = "reset"  # RST_STREAM sent to the client, not forwarded
    REFUSED = "refused"  # after a GOAWAY: not forwarded


class Ev(enum.Enum):
    PREFACE = "preface"
    UNREADABLE = "unreadable"
    END = "end"
    PASS = "pass"
    HOLD = "hold"
    ANSWER = "answer"
    RST = "rst"
    GOAWAY = "goaway"


#: (state, event) -> next state. A pair not here is a bug (KeyError).
TRANSITIONS: dict[tuple[Dir | St, Ev], Dir | St] = {
    (Dir.PREFACE, Ev.PREFACE): Dir.FRAMES,
    (Dir.PREFACE, Ev.UNREADABLE): Dir.OPAQUE,
    (Dir.FRAMES, Ev.UNREADABLE): Dir.OPAQUE,
    **{(s, Ev.END): Dir.DONE for s in Dir},
    (St.NEW, Ev.PASS): St.OPEN,
    (St.NEW, Ev.HOLD): St.HELD,
    (St.NEW, Ev.ANSWER): St.ANSWERED,
    (St.NEW, Ev.RST): St.RESET,
    (St.NEW, Ev.GOAWAY): St.REFUSED,
}


# -- one direction's frames ------------------------------------------------------------


class _Unreadable(Exception):
    """Bytes that are not HTTP/2 frames (or a block hpack cannot decode)."""


_BLOCK_FRAMES = (HeadersFrame, PushPromiseFrame)


@dataclass
class _Side:
    """One direction's framing: its unread bytes, the header block in progress, and
    the HPACK decoder that mirrors its sender's encoder."""

    buf: bytearray = field(default_factory=bytearray)
    decoder: Decoder = field(default_factory=Decoder)
    #: The largest frame its receiver accepts (its SETTINGS_MAX_FRAME_SIZE).
    max_frame: int = MIN_MAX_FRAME
    #: Since a block was dropped: every block is re-encoded without the table.
    reencode: bool = False
    #: A header block not ended yet: its first frame, its raw frames, its fragment.
    block: HeadersFrame | PushPromiseFrame | None = None
    raws: list[bytes] = field(default_factory=list)
    fragment: bytearray = field(default_factory=bytearray)

    def next_frame(self) -> tuple[Frame, bytes] | None:
        """The next whole frame and its bytes, or None if it has not all come."""
        if len(self.buf) < 9:
            return None
        try:
            frame, length = Frame.parse_frame_header(memoryview(bytes(self.buf[:9])))
            if length > self.max_frame:
                raise _Unreadable(f"a frame of {length} bytes")
            if len(self.buf) < 9 + length:
                return None
            raw = bytes(self.buf[: 9 + length])
            frame.parse_body(memoryview(raw[9:]))
        except HyperframeError as error:
            raise _Unreadable(str(error)) from error
        del self.buf[: 9 + length]
        return frame, raw

    def add_to_block(self, frame: Frame, raw: bytes) -> bool:
        """Collect a header block's frames; True when it is whole."""
        if isinstance(frame, _BLOCK_FRAMES):
            if self.block is not None:
                raise _Unreadable("a header block inside another")
            self.block, self.raws, self.fragment = frame, [raw], bytearray(frame.data)
        elif (
            not isinstance(frame, ContinuationFrame)
            or self.block is None
            or frame.stream_id != self.block.stream_id
        ):
            raise _Unreadable("a frame inside a header block, or a CONTINUATION outside one")
        else:
            self.raws.append(raw)
            self.fragment += frame.data
        if len(self.fragment) > MAX_HEAD:
            raise _Unreadable("a header block over MAX_HEAD")
        return "END_HEADERS" in frame.flags

    def decode(self) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The whole block's fields, and whether decoding it changed the table."""
        table = self.decoder.header_table
        before = (len(table.dynamic_entries), table.maxsize, _newest(table))
        try:
            fields = self.decoder.decode(bytes(self.fragment), raw=True)
        except hpack.HPACKError as error:
            raise _Unreadable(str(error)) from error
        after = (len(table.dynamic_entries), table.maxsize, _newest(table))
        return [(bytes(n), bytes(v)) for n, v in fields], before != after

    def take_block(self, fields: list[tuple[bytes, bytes]]) -> bytes:
        """The block's bytes to forward: as they came, or re-encoded (:attr:`reencode`)."""
        first, raws = self.block, self.raws
        self.block, self.raws, self.fragment = None, [], bytearray()
        assert first is not None
        if not self.reencode:
            return b"".join(raws)
        return _block_frames(first, encode(fields))


def _newest(table: HeaderTable) -> object:
    return id(table.dynamic_entries[0]) if table.dynamic_entries else None


def encode(fields: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> bytes:
    """A header block that neither reads nor writes the dynamic table: static indices
    and "never indexed" literals, which every decoder reads the same whatever its state.
    (A fresh hpack Encoder's table stays empty when every field is never-indexed.)"""
    return Encoder().encode([NeverIndexedHeaderTuple(n, v) for n, v in fields])


def _block_frames(first: HeadersFrame | PushPromiseFrame, block: bytes) -> bytes:
    """*block* as a HEADERS (or PUSH_PROMISE) frame like *first* (its stream, its
    END_STREAM and priority; no padding), then CONTINUATIONs, each within the smallest
    frame size every peer accepts."""
    head, rest = block[:MIN_MAX_FRAME], block[MIN_MAX_FRAME:]
    flags = {"END_HEADERS"} if not rest else set()
    if isinstance(first, PushPromiseFrame):
        frame: Frame = PushPromiseFrame(
            first.stream_id, promised_stream_id=first.promised_stream_id, data=head
        )
    else:
        frame = HeadersFrame(
            first.stream_id,
            data=head,
            depends_on=first.depends_on,
            stream_weight=first.stream_weight,
            exclusive=first.exclusive,
        )
        flags |= {f for f in ("END_STREAM", "PRIORITY") if f in first.flags}
    for flag in flags:
        frame.flags.add(flag)
    out = [frame.serialize()]
    while rest:
        piece, rest = rest[:MIN_MAX_FRAME], rest[MIN_MAX_FRAME:]
        cont = ContinuationFrame(first.stream_id, data=piece)
        if not rest:
            cont.flags.add("END_HEADERS")
        out.append(cont.serialize())
    return b"".join(out)


def _request(stream_id: int, fields: list[tuple[bytes, bytes]]) -> H2Request:
    pseudo = {n: v for n, v in fields if n.startswith(b":")}
    headers = [(n.lower(), v) for n, v in fields if not n.startswith(b":")]
    if b":authority" in pseudo and not any(n == b"host" for n, _ in headers):
        headers.insert(0, (b"host", pseudo[b":authority"]))
    return H2Request(stream_id, pseudo.get(b":method", b""), pseudo.get(b":path", b""), headers)


# -- the session -----------------------------------------------------------------------


@dataclass
class _Stream:
    """A client stream and what its plan has done to it."""

    request: H2Request
    plan: StreamPlan
    state: St = St.NEW
    logged: bool = False
    head_sent: bool = False
    body_at: float | None = None
    sent: int = 0


@dataclass
class _Out:
    """A frame (or the end) waiting to go to the client, in order."""

    data: bytes
    t: float
    frame: Frame | None = None  # None: the session's own bytes, or the end (data b"")
    made: bool = False  # the session's own (an Inject)
    eof: bool = False


class Session(Duplex):
    """One HTTP/2 connection through one toxic (see the module docstring). *decide*
    says what to do with each request (None: pass it); *log* is told each fault when it
    takes effect, and a direction that turned opaque."""

    def __init__(self, decide: Decide, log: Log = lambda event, **fields: None) -> None:
        super().__init__()
        self.decide = decide
        self.log_event = log
        self.up = Dir.PREFACE
        self.down = Dir.FRAMES
        self.streams: dict[int, _Stream] = {}
        self._sides = {UP: _Side(), DOWN: _Side()}
        self._out: deque[_Out] = deque()
        self._holding = False  # the downstream waits for a plan's time
        self._up_paused = False  # the upstream waits for the queue to the client
        self._last_forwarded = 0  # the highest client stream the server saw
        self._goaway = False
        #: Frames made here before the server's preface (its SETTINGS) went to the
        #: client: that must be the first frame a client reads (RFC 9113 3.4).
        self._early: list[_Out] | None = []

    # -- events in, commands out --

    def timer(self, stream: str, now: float) -> list[Command]:
        """A :class:`Hold` of *stream* came due (or was resumed)."""
        if stream == DOWN:
            self._holding = False
            self._pump(now, True)
        elif self._up_paused:
            self._pause_up()
        return self._take()

    @property
    def buffered(self) -> int:
        """Bytes the session holds now: each direction's partial frame and header block
        (bounded by its receiver's frame size and :data:`MAX_HEAD`), and the queue to
        the client (a read of the server, and answers up to :data:`MAX_BUFFER`)."""
        held = sum(len(s.buf) + len(s.fragment) for s in self._sides.values())
        return held + sum(len(o.data) for o in self._out)

    # -- internals --

    @staticmethod
    def _go(state: Dir, event: Ev) -> Dir:
        return step(TRANSITIONS, state, event)

    def _log(self, stream: _Stream) -> None:
        if stream.logged or stream.plan.action == "pass":
            return
        stream.logged = True
        self.log_event(
            "http_fault",
            method=stream.request.method.decode("latin-1"),
            path=stream.request.target.decode("latin-1"),
            action=stream.plan.action,
            protocol="h2",
            stream_id=stream.request.stream_id,
            **stream.plan.detail,
        )

    def _unreadable(self, stream: str, now: float) -> None:
        side = self._sides[stream]
        rest = b"".join(side.raws) + bytes(side.buf)
        side.buf.clear()
        side.block, side.raws = None, []
        self.log_event("http_opaque", stream=stream)
        if stream == UP:
            self.up = self._go(self.up, Ev.UNREADABLE)
            self._emit(Forward(UP, rest, now))
        else:
            self.down = self._go(self.down, Ev.UNREADABLE)
            self._out.append(_Out(rest, now))

    # -- client to server --

    def _upstream_eof(self, now: float) -> None:
        if self.up is not Dir.DONE:
            side = self._sides[UP]
            self._emit(Forward(UP, b"".join(side.raws) + bytes(side.buf), now))
            side.buf.clear()
            self._emit(Eof(UP))
            self.up = self._go(self.up, Ev.END)

    def _downstream_eof(self, now: float) -> None:
        if self.down is not Dir.DONE:
            side = self._sides[DOWN]
            self._out.append(_Out(bytes(side.buf) + b"".join(side.raws), now))
            side.buf.clear()
            self._out.append(_Out(b"", now, eof=True))
            self._pump(now, True)

    def _upstream(self, data: bytes, now: float) -> None:
        if self.up is Dir.DONE:
            return
        if self.up is Dir.OPAQUE:
            return self._emit(Forward(UP, data, now))
        side = self._sides[UP]
        side.buf += data
        if self.up is Dir.PREFACE:
            seen = is_preface(bytes(side.buf))
            if seen is None:
                return
            if not seen:
                return self._unreadable(UP, now)
            self._emit(Forward(UP, PREFACE, now))
            del side.buf[: len(PREFACE)]
            self.up = self._go(self.up, Ev.PREFACE)
        try:
            while self.up is Dir.FRAMES and (got := side.next_frame()) is not None:
                self._client_frame(*got, now)
        except _Unreadable:
            self._unreadable(UP, now)
        self._pump(now, False)
        self._pause_up()

    def _pause_up(self) -> None:
        """Stop reading the client while the queue to it is over :data:`MAX_BUFFER`
        (answers made while a delay holds the queue)."""
        queued = sum(len(o.data) for o in self._out)
        self._up_paused = queued > MAX_BUFFER
        if self._up_paused:
            self._emit(Hold(UP, None))

    def _client_frame(self, frame: Frame, raw: bytes, now: float) -> None:
        side = self._sides[UP]
        if side.block is not None or isinstance(frame, _BLOCK_FRAMES):
            if side.add_to_block(frame, raw):
                self._client_block(now)
            return
        if isinstance(frame, SettingsFrame):
            self._settings(frame, DOWN)
        stream = self.streams.get(frame.stream_id)
        if stream is None or stream.state is St.OPEN:
            return self._emit(Forward(UP, raw, now))
        if isinstance(frame, DataFrame) and frame.flow_controlled_length:
            # The server never sees it: give the client its connection window back.
            update = WindowUpdateFrame(0, window_increment=frame.flow_controlled_length)
            self._made(update.serialize(), now)

    def _client_block(self, now: float) -> None:
        side = self._sides[UP]
        block = side.block
        assert block is not None
        fields, changed = side.decode()
        sid = block.stream_id
        stream = self.streams.get(sid)
        if stream is None and isinstance(block, HeadersFrame) and sid % 2 == 1:
            stream = self._new_stream(sid, fields, now)
        if stream is None or stream.state is St.OPEN:
            self._last_forwarded = max(self._last_forwarded, sid)
            return self._emit(Forward(UP, side.take_block(fields), now))
        side.take_block(fields)  # dropped
        side.reencode = side.reencode or changed

    def _new_stream(self, sid: int, fields: list[tuple[bytes, bytes]], now: float) -> _Stream:
        request = _request(sid, fields)
        plan = (None if self._goaway else self.decide(request)) or StreamPlan()
        stream = self.streams[sid] = _Stream(request, plan)
        if self._goaway:
            event = Ev.GOAWAY
        elif plan.answer is not None:
            event = Ev.ANSWER
            self._answer(sid, plan, now)
        elif plan.hold:
            event = Ev.HOLD
        elif plan.rst is not None:
            event = Ev.RST
            self._made(RstStreamFrame(sid, error_code=plan.rst).serialize(), now)
        elif plan.goaway is not None:
            event = Ev.GOAWAY
            self._goaway = True
            frame = GoAwayFrame(0, last_stream_id=self._last_forwarded, error_code=plan.goaway)
            self._made(frame.serialize(), now)
        else:
            event = Ev.PASS
        stream.state = step(TRANSITIONS, stream.state, event)
        if not plan.on_response:
            self._log(stream)
        return stream

    def _answer(self, sid: int, plan: StreamPlan, now: float) -> None:
        assert plan.answer is not None
        first = HeadersFrame(sid)
        if not plan.body:
            first.flags.add("END_STREAM")
        data = [_block_frames(first, encode(plan.answer))]
        body = plan.body
        while body:
            piece, body = body[:MIN_MAX_FRAME], body[MIN_MAX_FRAME:]
            data.append(
                DataFrame(sid, data=piece, flags=[] if body else ["END_STREAM"]).serialize()
            )
        self._made(b"".join(data), now)

    def _made(self, data: bytes, now: float) -> None:
        """Queue frames made here to the client, after the server's preface."""
        item = _Out(data, now, made=True)
        if self._early is not None:
            self._early.append(item)
        else:
            self._out.append(item)

    def _settings(self, frame: SettingsFrame, bound: str) -> None:
        """A peer's SETTINGS bound what the other peer sends it (the direction *bound*):
        its frame size, and the HPACK table its encoder may use."""
        side = self._sides[bound]
        size = frame.settings.get(SettingsFrame.HEADER_TABLE_SIZE)
        if size is not None:
            side.decoder.max_allowed_table_size = max(side.decoder.max_allowed_table_size, size)
        largest = frame.settings.get(SettingsFrame.MAX_FRAME_SIZE)
        if largest is not None:
            side.max_frame = max(side.max_frame, largest)

    # -- server to client --

    def _downstream(self, data: bytes, now: float) -> None:
        if self.down is Dir.DONE:
            return
        if self.down is Dir.OPAQUE:
            self._out.append(_Out(data, now))
            return self._pump(now, True)
        side = self._sides[DOWN]
        side.buf += data
        try:
            while self.down is Dir.FRAMES and (got := side.next_frame()) is not None:
                self._server_frame(*got, now)
        except _Unreadable:
            self._unreadable(DOWN, now)
        self._pump(now, True)

    def _server_frame(self, frame: Frame, raw: bytes, now: float) -> None:
        side = self._sides[DOWN]
        if side.block is not None or isinstance(frame, _BLOCK_FRAMES):
            if not side.add_to_block(frame, raw):
                return
            first = side.block
            assert first is not None
            fields, _ = side.decode()
            raw, frame = side.take_block(fields), first
        elif isinstance(frame, SettingsFrame):
            self._settings(frame, UP)
        self._out.append(_Out(raw, now, frame))
        if self._early is not None:
            self._out.extend(self._early)
            self._early = None

    # -- the queue to the client --

    def _pump(self, now: float, down: bool) -> None:
        """Send what the plans' times allow, in order. A plan that must wait holds the
        downstream (only its own task may: *down*); the timer resumes it."""
        while self._out and not self._holding and self.down is not Dir.DONE:
            item = self._out[0]
            if item.eof:
                self._emit(Eof(DOWN))
                self.down = self._go(self.down, Ev.END)
            elif item.made:
                self._emit(Inject(DOWN, item.data))
            elif not self._respond(item, now, down):
                return
            elif item.data:
                continue  # a paced DATA frame, part sent
            self._out.popleft()
        if self._up_paused and sum(len(o.data) for o in self._out) <= MAX_BUFFER:
            self._up_paused = False
            self._emit(Resume(UP))

    def _respond(self, item: _Out, now: float, down: bool) -> bool:
        """Send what *item*'s stream's plan lets go of it now; False if it must wait."""
        frame = item.frame
        stream = self.streams.get(frame.stream_id) if frame is not None else None
        if stream is None or not stream.plan.on_response:
            self._emit(Forward(DOWN, item.data, item.t))
            item.data = b""
            return True
        plan = stream.plan
        due = now
        if isinstance(frame, HeadersFrame) and not stream.head_sent:
            due = item.t + (0.0 if plan.delay_body else plan.delay)
        elif isinstance(frame, DataFrame):
            if stream.body_at is None:
                stream.body_at = item.t if plan.delay_body else now
            start = stream.body_at + (plan.delay if plan.delay_body else 0.0)
            due = start + (stream.sent / plan.rate if plan.rate else 0.0)
        if now < due:
            if down:
                self._holding = True
                self._emit(Hold(DOWN, due))
            return False
        self._log(stream)
        if isinstance(frame, HeadersFrame):
            stream.head_sent = True
        if isinstance(frame, DataFrame) and plan.rate and not frame.pad_length:
            return self._pace(item, frame, stream)
        if isinstance(frame, DataFrame):
            stream.sent += len(frame.data)
        self._emit(Forward(DOWN, item.data, item.t))
        item.data = b""
        return True

    def _pace(self, item: _Out, frame: DataFrame, stream: _Stream) -> bool:
        """Send a piece of a paced DATA frame: about 20 writes a second (as the
        HTTP/1.1 session's slow body); the frame keeps the rest, and its flags."""
        size = max(1, stream.plan.rate // 20)
        piece, rest = frame.data[:size], frame.data[size:]
        if rest:
            self._emit(Forward(DOWN, DataFrame(frame.stream_id, data=piece).serialize(), item.t))
            frame.data = rest
            item.data = frame.serialize()  # the rest, still to go
        else:
            self._emit(Forward(DOWN, frame.serialize(), item.t))
            item.data = b""
        stream.sent += len(piece)
        return True
