"""PostgreSQL's v3 wire protocol: a pure session (sans-I/O) that frames one connection's
messages, pairs each request with its answer and applies a plan to each request.

Theory of operation
-------------------

:class:`Session` does no I/O and knows no clock. Events go in (bytes read on a stream,
the end of a stream, a timer, each with the time); commands come out, the vocabulary of
:mod:`faultnet.protocols.http` (:class:`Forward`, :class:`Inject`, :class:`Hold`,
:class:`Eof`, :class:`Close`), carried out by the ``postgres`` toxic's stages. No
library on the project's list parses the protocol, so the framing is here, small and
bounded: a message is a type byte and a 4-byte length (the startup packets, a length
and a code), and only the few messages the session must read are kept whole (the
client's Query, Parse, Bind and Execute, at most :data:`MAX_MESSAGE` bytes; the
server's ReadyForQuery); every other message, and one longer than that, is passed on
piece by piece as it comes, its length only counted. A hostile length field costs
nothing.

The client's first packet is a startup packet: a StartupMessage (protocol 3) is a
request like any other (a startup fault answers it); an SSLRequest or GSSENCRequest is
passed to the server (``ssl="pass"``: a yes, ``S`` or ``G``, turns both streams opaque
and TLS crosses untouched; a no, ``N``, goes on to the StartupMessage) or answered
``N`` at once (``ssl="refuse"``: the client goes on in the clear or gives up, as with a
server without TLS); a CancelRequest, a direct TLS ClientHello or anything else turns
the connection opaque. Authentication crosses untouched.

A request is what the server answers with one ReadyForQuery: the StartupMessage, a
simple Query, an extended-protocol batch (Parse, Bind, Describe, Execute, Close... up
to and including its Sync) or a FunctionCall. Requests are judged (``decide``) when
whole: a batch is held until its Sync, so a batch that flushes first (Flush) or is
longer than :data:`MAX_BATCH` is passed unjudged, as is one holding a message longer
than :data:`MAX_MESSAGE`. A batch's query texts are its Parse's and, for an Execute of
a statement parsed earlier on the connection, that statement's (kept in a bounded table,
:data:`MAX_STATEMENT_BYTES`; a statement pushed out of it is executed unjudged). COPY's
data, terminations and password messages are passed as they come; the server's
notices, notifications and parameter changes cross whatever plan is in force.

Answers come back in request order, so each request forwarded leaves a
:class:`_Pending` in a queue that the server's ReadyForQuery pops; the plan of the head
of the queue says what happens to the server's messages meanwhile. The plans:

=========== ========================================================================
error       ERROR: the server gets a query that fails instead of the request (or
            ``ROLLBACK`` instead of a faulted COMMIT), so its transaction goes where
            a real failure sends it; its answer is swallowed, and the client gets the
            plan's ErrorResponse, then the server's own ReadyForQuery (``E`` inside a
            transaction block, ``I`` outside, ``I`` after a COMMIT).
fatal       FATAL (or PANIC): the request is not forwarded; the client gets the
            ErrorResponse, then the connection closes (FIN both ways), as a server
            ending its backend does; the server rolls back on the close.
delay       the request is forwarded ``delay`` seconds late (the client's stream is
            not read meanwhile, so what it sent after waits too).
hold        never forwarded, nor anything after it: the client waits for its timeout.
close       forwarded; of its answer, what comes before its ``rows``-th DataRow's
            successor crosses, then the connection closes (mid-result).
=========== ========================================================================

Every state of the two streams and every transition is in :data:`TRANSITIONS`.
"""

from __future__ import annotations

import enum
import struct
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from faultnet.protocols._states import step
from faultnet.protocols.http import DOWN, UP, Close, Command, Duplex, Eof, Forward, Hold, Inject

__all__ = [
    "MAX_BATCH",
    "MAX_MESSAGE",
    "MAX_STATEMENT_BYTES",
    "PgPlan",
    "PgRequest",
    "Session",
    "error_response",
    "is_commit",
    "is_transaction_start",
    "parse_error_response",
]

#: The longest message read whole (a query's text, a Bind's names): an ORM's query of
#: 100 KB fits; a longer one is passed unjudged.
MAX_MESSAGE = 256 * 1024
#: The most bytes of one extended-protocol batch held until its Sync.
MAX_BATCH = 1024 * 1024
#: The bytes of statement texts kept for the Executes that name them (oldest out first).
MAX_STATEMENT_BYTES = 1024 * 1024
#: Faulted requests awaiting their answer at most; past it, requests pass unjudged.
MAX_FAULTED_PENDING = 1024
#: PostgreSQL's own bound on a startup packet (MAX_STARTUP_PACKET_LENGTH).
MAX_STARTUP = 10000
#: Client bytes kept while the server's answer to an SSLRequest is awaited.
MAX_EARLY = 16 * 1024

_SSL_CODE, _GSS_CODE, _CANCEL_CODE = 80877103, 80877104, 80877102
_HEAD = struct.Struct("!cI")
_INT = struct.Struct("!I")
#: The client's extended-protocol messages (a batch, up to its Sync ``S``).
_EXTENDED = frozenset(b"PBDECHS")
#: The client's messages waited for until whole (a Query, a batch's).
_UP_WHOLE = _EXTENDED | frozenset(b"Q")
#: The server's messages that are no part of an answer: notices, notifications,
#: parameter changes (they cross whatever the plan).
_ASYNC = frozenset(b"NAS")
#: What a faulted query is replaced with: it fails in the server (22P02), so the
#: server's transaction ends up where a failure puts it; the log says why.
SUBSTITUTE = "SELECT 'faultnet: an injected fault'::int"


# -- requests and plans ----------------------------------------------------------------


@dataclass(frozen=True)
class PgRequest:
    """One request, as ``decide`` sees it."""

    #: ``startup``, ``query`` (a simple Query, an extended batch) or ``call``.
    kind: str
    #: The statement texts it runs, in order (a batch's Executes'); one for a Query.
    texts: tuple[str, ...] = ()
    #: The transaction status the server last reported (``I``, ``T``, ``E``; ``""``
    #: before the first ReadyForQuery).
    status: str = ""
    #: The startup parameters (user, database...), for a StartupMessage.
    params: tuple[tuple[str, str], ...] = ()


@dataclass
class PgPlan:
    """What to do to one request and its answer (see the module's table)."""

    #: ``error``, ``fatal``, ``delay``, ``hold``, ``close`` or ``pass``.
    action: str = "pass"
    #: The event log's figures (sqlstate, severity, delay_ms, rows...).
    detail: dict[str, object] = field(default_factory=dict)
    #: The ErrorResponse the client gets (error, fatal).
    error: bytes = b""
    #: What the server gets instead (error): a simple Query's text.
    substitute: str = SUBSTITUTE
    delay: float = 0.0
    rows: int = 0


Decide = Callable[[PgRequest], PgPlan | None]
Log = Callable[..., None]


# -- messages --------------------------------------------------------------------------


def error_response(severity: str, sqlstate: str, message: str) -> bytes:
    """An ErrorResponse: severity (localized and not), SQLSTATE and message, as a
    server sends them."""
    body = b"".join(
        key + value.encode("utf-8", "replace") + b"\0"
        for key, value in ((b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", message))
    )
    return b"E" + _INT.pack(len(body) + 5) + body + b"\0"


def parse_error_response(data: bytes) -> dict[str, str]:
    """The fields of one ErrorResponse or NoticeResponse (code letter -> text)."""
    fields: dict[str, str] = {}
    for part in data[5:].split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return fields


def _words(text: str, n: int) -> list[str]:
    # The first *n* words, lower case, a statement's terminator dropped.
    return text.strip().rstrip(";").lower().split()[:n]


def is_commit(text: str) -> bool:
    """Whether *text* is one statement ending a transaction by committing it (``COMMIT``,
    ``END``, ``COMMIT WORK``...; not ``COMMIT PREPARED``)."""
    words = _words(text, 2)
    return bool(words) and words[0] in ("commit", "end") and words[1:] != ["prepared"]


def is_transaction_start(text: str) -> bool:
    """Whether *text* starts with ``BEGIN`` or ``START TRANSACTION``."""
    words = _words(text, 2)
    return words[:1] == ["begin"] or words == ["start", "transaction"]


def _cstrings(body: bytes, n: int) -> list[str]:
    """The first *n* NUL-terminated strings of *body* (fewer if it has fewer)."""
    parts = body.split(b"\0", n)[:n]
    return [p.decode("utf-8", "replace") for p in parts]


@dataclass
class _Piece:
    """A message, or a piece of one too long to keep: its type (``b""`` for a startup
    packet) and bytes."""

    kind: bytes
    data: bytes
    first: bool = True
    whole: bool = True


class _Framer:
    """One stream's typed messages, bytes in, pieces out. A message already whole in what
    came is one piece; one of a type in *whole* no longer than :data:`MAX_MESSAGE` waits
    to be whole; any other comes out as it arrives, piece by piece (its length counted,
    never allocated)."""

    def __init__(self, whole: frozenset[int]) -> None:
        self.whole = whole
        self.buffer = bytearray()
        self._kind = b""
        self._left = 0  # bytes of a message passed piece by piece still to come

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def next(self) -> _Piece | None:
        """The next message or piece, or None until more bytes come."""
        if self._left:
            if not self.buffer:
                return None
            piece = bytes(self.buffer[: self._left])
            del self.buffer[: len(piece)]
            self._left -= len(piece)
            return _Piece(self._kind, piece, first=False, whole=False)
        if len(self.buffer) < 5:
            return None
        kind, length = _HEAD.unpack_from(self.buffer)
        size = max(length, 4) + 1  # a length below 4 is malformed: its header alone
        if len(self.buffer) >= size:
            message = bytes(self.buffer[:size])
            del self.buffer[:size]
            return _Piece(kind, message)
        if kind[0] in self.whole and size <= MAX_MESSAGE:
            return None
        piece = bytes(self.buffer)
        self.buffer.clear()
        self._kind, self._left = kind, size - len(piece)
        return _Piece(kind, piece, whole=False)

    def take(self) -> bytes:
        rest = bytes(self.buffer)
        self.buffer.clear()
        return rest


# -- the states, all in one place ------------------------------------------------------


class Up(enum.Enum):
    """The client-to-server stream."""

    STARTUP = "startup"  # its first packet (or the one after an SSL no) awaited
    NEGOTIATING = "negotiating"  # an SSLRequest's answer awaited; the client's bytes kept
    READY = "ready"  # typed messages, between requests
    BATCH = "batch"  # an extended-protocol batch held until its Sync
    STREAMING = "streaming"  # a batch passed unjudged, until its Sync
    DELAYING = "delaying"  # a request held back for its time: not read meanwhile
    HELD = "held"  # a held request: nothing more is forwarded
    OPAQUE = "opaque"  # TLS, a cancel, or bytes not understood: passed as they come
    DONE = "done"


class Down(enum.Enum):
    """The server-to-client stream."""

    FRAMED = "framed"  # typed messages
    ANSWERING = "answering"  # the one-byte answer to an SSLRequest or GSSENCRequest
    OPAQUE = "opaque"
    DONE = "done"


class Ev(enum.Enum):
    STARTED = "started"  # a StartupMessage forwarded or answered
    NEGOTIATE = "negotiate"  # an SSLRequest or GSSENCRequest forwarded
    REFUSED = "refused"  # the server (or ssl="refuse") said N
    ACCEPTED = "accepted"  # the server said S or G: TLS from here on
    BATCH = "batch"
    STREAM = "stream"
    SYNC = "sync"  # a batch's end
    DELAYED = "delayed"
    DELAY_OVER = "delay over"
    HELD = "held"
    UNREADABLE = "unreadable"
    END = "end"  # the stream's end passed on
    ENDED = "ended"  # the connection ended (a plan's close)


#: (state, event) -> next state, for each stream. A pair not here is a bug (KeyError).
TRANSITIONS: dict[tuple[Up | Down, Ev], Up | Down] = {
    (Up.STARTUP, Ev.STARTED): Up.READY,
    (Up.STARTUP, Ev.NEGOTIATE): Up.NEGOTIATING,
    (Up.STARTUP, Ev.REFUSED): Up.STARTUP,  # ssl="refuse": the next packet is a startup
    (Up.NEGOTIATING, Ev.REFUSED): Up.STARTUP,
    (Up.NEGOTIATING, Ev.ACCEPTED): Up.OPAQUE,
    (Up.STARTUP, Ev.DELAYED): Up.DELAYING,
    (Up.STARTUP, Ev.HELD): Up.HELD,
    (Up.READY, Ev.BATCH): Up.BATCH,
    (Up.READY, Ev.STREAM): Up.STREAMING,
    (Up.BATCH, Ev.STREAM): Up.STREAMING,
    (Up.BATCH, Ev.SYNC): Up.READY,
    (Up.STREAMING, Ev.SYNC): Up.READY,
    (Up.READY, Ev.DELAYED): Up.DELAYING,
    (Up.BATCH, Ev.DELAYED): Up.DELAYING,
    (Up.DELAYING, Ev.DELAY_OVER): Up.READY,
    (Up.READY, Ev.HELD): Up.HELD,
    (Up.BATCH, Ev.HELD): Up.HELD,
    **{(s, Ev.UNREADABLE): Up.OPAQUE for s in (Up.STARTUP, Up.NEGOTIATING)},
    **{(s, Ev.END): Up.DONE for s in Up},
    **{(s, Ev.ENDED): Up.DONE for s in Up},
    (Down.FRAMED, Ev.NEGOTIATE): Down.ANSWERING,
    (Down.ANSWERING, Ev.REFUSED): Down.FRAMED,
    (Down.ANSWERING, Ev.ACCEPTED): Down.OPAQUE,
    (Down.FRAMED, Ev.UNREADABLE): Down.OPAQUE,
    (Down.ANSWERING, Ev.UNREADABLE): Down.OPAQUE,
    **{(s, Ev.END): Down.DONE for s in Down},
    **{(s, Ev.ENDED): Down.DONE for s in Down},
}


@dataclass
class _Pending:
    """Requests forwarded whose ReadyForQuery is awaited: *count* of them, all passed
    (plan None), or one with its plan."""

    plan: PgPlan | None
    count: int = 1
    rows: int = 0  # DataRows of a close plan's answer forwarded so far


# -- the session -----------------------------------------------------------------------


class Session(Duplex):
    """One connection's PostgreSQL traffic through one toxic (see the module docstring).
    *decide* says what to do with each request (None: pass it); *log* is told each fault
    when it takes effect (``pg_fault``); *refuse_ssl* answers an SSLRequest ``N``."""

    def __init__(self, decide: Decide, log: Log = lambda e, **f: None, refuse_ssl: bool = False):
        super().__init__()
        self.decide = decide
        self.log_event = log
        self.refuse_ssl = refuse_ssl
        self.up = Up.STARTUP
        self.down = Down.FRAMED
        #: The transaction status the server last reported.
        self.status = ""
        self._up = _Framer(_UP_WHOLE)
        self._down = _Framer(frozenset(b"Z"))
        self._batch: list[_Piece] = []
        self._batch_bytes = 0
        self._early = bytearray()  # client bytes behind an SSLRequest's answer
        self._pending: deque[_Pending] = deque()
        self._faulted = 0  # faulted entries in _pending
        self._statements: OrderedDict[str, str] = OrderedDict()
        self._statement_bytes = 0
        self._portals: dict[str, str] = {}
        self._delayed = b""
        self._delayed_until = 0.0
        self._up_eof = self._down_eof = False

    # -- events in, commands out --

    def timer(self, stream: str, now: float) -> list[Command]:
        """A :class:`Hold` of *stream* came due."""
        if stream == UP and self.up is Up.DELAYING:
            if now < self._delayed_until:
                self._emit(Hold(UP, self._delayed_until))
            else:
                data, self._delayed = self._delayed, b""
                self._go_up(Ev.DELAY_OVER)
                self._forward_request(data, None, now)
                self._parse_up(now)
        return self._take()

    @property
    def buffered(self) -> int:
        """Bytes the session holds now (bounded: one message of :data:`MAX_MESSAGE`, a
        batch of :data:`MAX_BATCH`, :data:`MAX_EARLY`, the statement table)."""
        return (
            len(self._up.buffer)
            + len(self._down.buffer)
            + self._batch_bytes
            + len(self._early)
            + len(self._delayed)
            + self._statement_bytes
        )

    # -- internals --

    def _upstream_eof(self, now: float) -> None:
        self._up_eof = True
        if self.up is Up.HELD and self._down_eof:
            self._end()  # both ends gone: nothing is left to wait for
        elif self.up not in (Up.HELD, Up.DONE, Up.DELAYING):
            self._emit(Forward(UP, self._held_bytes(), now))
            self._emit(Eof(UP))
            self._go_up(Ev.END)

    def _downstream_eof(self, now: float) -> None:
        self._down_eof = True
        if self.up is Up.HELD and self._up_eof:
            self._end()
        elif self.down is not Down.DONE:
            self._emit(Forward(DOWN, self._down.take(), now))
            self._emit(Eof(DOWN))
            self._go_down(Ev.END)

    def _go_up(self, event: Ev) -> None:
        self.up = step(TRANSITIONS, self.up, event)

    def _go_down(self, event: Ev) -> None:
        self.down = step(TRANSITIONS, self.down, event)

    def _held_bytes(self) -> bytes:
        batch = b"".join(p.data for p in self._batch)
        self._batch, self._batch_bytes = [], 0
        early, self._early = bytes(self._early), bytearray()
        return batch + early + self._up.take()

    def _end(self) -> None:
        self._emit(Close())
        self._go_up(Ev.ENDED)
        self._go_down(Ev.ENDED)
        self._held_bytes()
        self._down.take()
        self._pending.clear()

    def _log(self, plan: PgPlan, request: PgRequest) -> None:
        text = request.texts[0] if request.texts else ""
        self.log_event(
            "pg_fault", action=plan.action, kind=request.kind, query=text[:200], **plan.detail
        )

    # -- client to server --

    def _upstream(self, data: bytes, now: float) -> None:
        if self.up in (Up.HELD, Up.DONE):
            return
        if self.up is Up.OPAQUE:
            return self._emit(Forward(UP, data, now))
        if self.up is Up.NEGOTIATING:
            self._early += data
            if len(self._early) > MAX_EARLY:  # a client that did not wait: opaque
                self._opaque_up(now)
            return
        self._up.feed(data)
        if self.up is not Up.DELAYING:
            self._parse_up(now)

    def _parse_up(self, now: float) -> None:
        while self.up in (Up.STARTUP, Up.READY, Up.BATCH, Up.STREAMING):
            if self.up is Up.STARTUP:
                if not self._startup(now):
                    return
                continue
            piece = self._up.next()
            if piece is None:
                return
            self._message(piece, now)

    def _startup(self, now: float) -> bool:
        """Read the client's startup packet; False until it is whole."""
        buffer = self._up.buffer
        if buffer[:1] == b"\x16":  # a direct TLS ClientHello (sslnegotiation=direct)
            return self._opaque_up(now)
        if len(buffer) < 8:
            return False
        length, code = struct.unpack_from("!II", buffer)
        if not 8 <= length <= MAX_STARTUP:
            return self._opaque_up(now)
        if len(buffer) < length:
            return False
        packet = bytes(buffer[:length])
        del buffer[:length]
        if code in (_SSL_CODE, _GSS_CODE):
            return self._negotiate(packet, now)
        if code >> 16 != 3:  # a CancelRequest, protocol 2, or no PostgreSQL at all
            self._up.buffer[:0] = packet
            return self._opaque_up(now)
        params = _cstrings(packet[8:], 64)
        pairs = tuple((k, v) for k, v in zip(params[0::2], params[1::2], strict=False) if k)
        request = PgRequest("startup", params=pairs)
        self._go_up(Ev.STARTED)
        self._request(packet, request, now)
        return True

    def _negotiate(self, packet: bytes, now: float) -> bool:
        if self.refuse_ssl:
            self._emit(Inject(DOWN, b"N"))
            self._go_up(Ev.REFUSED)
            return True
        self._emit(Forward(UP, packet, now))
        self._go_up(Ev.NEGOTIATE)
        self._go_down(Ev.NEGOTIATE)
        self._early += self._up.take()
        return False

    def _opaque_up(self, now: float) -> bool:
        self._go_up(Ev.UNREADABLE)
        self._emit(Forward(UP, self._held_bytes(), now))
        if self.down is not Down.DONE:
            self._go_down(Ev.UNREADABLE)
            self._emit(Forward(DOWN, self._down.take(), now))
        return False

    def _message(self, piece: _Piece, now: float) -> None:
        kind = piece.kind[0]
        if self.up is Up.STREAMING:
            self._emit(Forward(UP, piece.data, now))
            if kind == ord("S") and piece.first:
                self._passed()
                self._go_up(Ev.SYNC)
            return
        if kind in _EXTENDED:
            return self._extended(piece, now)
        if kind == ord("Q") and piece.whole:
            text = _cstrings(piece.data[5:], 1)[0] if len(piece.data) > 5 else ""
            return self._request(piece.data, PgRequest("query", (text,), self.status), now)
        if piece.first and kind in b"QF":  # a query too long to judge; a function call
            self._passed()
        self._emit(Forward(UP, piece.data, now))

    def _extended(self, piece: _Piece, now: float) -> None:
        if self.up is Up.READY:
            self._go_up(Ev.BATCH)
        self._batch.append(piece)
        self._batch_bytes += len(piece.data)
        kind = piece.kind[0]
        if kind == ord("S") and piece.whole:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            texts = tuple(t for t in map(self._note, batch) if t is not None)
            data = b"".join(p.data for p in batch)
            return self._request(data, PgRequest("query", texts, self.status), now)
        # A Flush (the client wants answers before its Sync), a message too long to
        # keep, a batch past its bound: passed as it is, unjudged.
        if kind == ord("H") or not piece.whole or self._batch_bytes > MAX_BATCH:
            self._stream_batch(now)

    def _stream_batch(self, now: float) -> None:
        """Pass the batch held so far, and the rest of it until its Sync, unjudged."""
        for p in self._batch:
            self._note(p)
        self._emit(Forward(UP, b"".join(p.data for p in self._batch), now))
        self._batch, self._batch_bytes = [], 0
        self._go_up(Ev.STREAM)

    def _note(self, piece: _Piece) -> str | None:
        """Keep what a Parse or Bind names; an Execute's statement text (None for the
        others, or a statement not known)."""
        if not piece.whole:
            return None
        kind, body = piece.kind, piece.data[5:]
        if kind == b"P":
            name, text = (_cstrings(body, 2) + ["", ""])[:2]
            self._remember(name, text)
            return None
        if kind == b"B":
            portal, statement = (_cstrings(body, 2) + ["", ""])[:2]
            known = self._statements.get(statement)
            self._portals.pop(portal, None)  # whatever it ran before, it runs this now
            if known is not None:
                self._statements.move_to_end(statement)
                self._portals[portal] = known
                if len(self._portals) > 64:  # portals a client never closed
                    self._portals.pop(next(iter(self._portals)))
            return None
        if kind == b"E":
            return self._portals.get(_cstrings(body, 1)[0] if body else "")
        return None

    def _remember(self, name: str, text: str) -> None:
        old = self._statements.pop(name, None)
        if old is not None:
            self._statement_bytes -= len(old)
        self._statements[name] = text
        self._statement_bytes += len(text)
        while self._statement_bytes > MAX_STATEMENT_BYTES and self._statements:
            _, gone = self._statements.popitem(last=False)
            self._statement_bytes -= len(gone)

    def _passed(self) -> None:
        """A request forwarded unjudged: one more ReadyForQuery to pass."""
        last = self._pending[-1] if self._pending else None
        if last is not None and last.plan is None:
            last.count += 1
        else:
            self._pending.append(_Pending(None))

    def _request(self, data: bytes, request: PgRequest, now: float) -> None:
        """A whole request: judged, then done to as its plan says."""
        plan = None
        if request.kind == "startup" or self.status in ("I", "T"):
            if self._faulted < MAX_FAULTED_PENDING:
                plan = self.decide(request)
        if plan is None or plan.action == "pass":
            return self._forward_request(data, None, now)
        self._log(plan, request)
        if plan.action == "fatal" or plan.action == "error" and request.kind == "startup":
            self._emit(Inject(DOWN, plan.error))
            return self._end()
        if plan.action == "hold":
            self._go_up(Ev.HELD)
            self._held_bytes()
            return
        if plan.action == "delay":
            self._go_up(Ev.DELAYED)
            self._delayed = data
            self._delayed_until = now + plan.delay
            return self._emit(Hold(UP, self._delayed_until))
        if plan.action == "close" and request.kind == "startup":
            return self._end()
        if plan.action == "error":
            text = plan.substitute.encode() + b"\0"
            data = b"Q" + _INT.pack(len(text) + 4) + text
        self._forward_request(data, plan, now)

    def _forward_request(self, data: bytes, plan: PgPlan | None, now: float) -> None:
        self._emit(Forward(UP, data, now))
        if plan is None:
            return self._passed()
        self._pending.append(_Pending(plan))
        self._faulted += 1

    # -- server to client --

    def _downstream(self, data: bytes, now: float) -> None:
        if self.down is Down.DONE:
            return
        if self.down is Down.OPAQUE:
            return self._emit(Forward(DOWN, data, now))
        if self.down is Down.ANSWERING:
            return self._answered(data, now)
        self._down.feed(data)
        while self.down is Down.FRAMED:
            piece = self._down.next()
            if piece is None:
                return
            self._answer(piece, now)

    def _answered(self, data: bytes, now: float) -> None:
        """The server's one-byte answer to an SSLRequest or GSSENCRequest."""
        answer, rest = data[:1], data[1:]
        self._emit(Forward(DOWN, answer, now))
        early, self._early = bytes(self._early), bytearray()
        if answer == b"N":
            self._go_down(Ev.REFUSED)
            self._go_up(Ev.REFUSED)
            self._up.feed(early)
            self._parse_up(now)
            if rest:
                self._downstream(rest, now)
            return
        self._go_down(Ev.ACCEPTED if answer in (b"S", b"G") else Ev.UNREADABLE)
        self._go_up(Ev.ACCEPTED if answer in (b"S", b"G") else Ev.UNREADABLE)
        self._emit(Forward(UP, early, now))
        self._emit(Forward(DOWN, rest, now))

    def _answer(self, piece: _Piece, now: float) -> None:
        kind = piece.kind[0]
        head = self._pending[0] if self._pending else None
        plan = head.plan if head is not None else None
        if kind == ord("Z") and piece.whole:
            self.status = chr(piece.data[5]) if len(piece.data) > 5 else ""
            if plan is not None and plan.action == "error":
                self._emit(Inject(DOWN, plan.error))
            self._emit(Forward(DOWN, piece.data, now))
            if head is not None:
                head.count -= 1
                if head.count <= 0:
                    self._pending.popleft()
                    self._faulted -= plan is not None
            return
        if plan is None or kind in _ASYNC:
            return self._emit(Forward(DOWN, piece.data, now))
        if plan.action == "error":
            return  # the substitute's answer: swallowed
        if plan.action == "close" and piece.first and self._cut(head, kind):
            return self._end()
        self._emit(Forward(DOWN, piece.data, now))

    @staticmethod
    def _cut(head: _Pending | None, kind: int) -> bool:
        """Whether a close plan's answer ends before this message (its rows given)."""
        assert head is not None and head.plan is not None
        if kind == ord("D"):
            head.rows += 1
            return head.rows > head.plan.rows
        return kind in b"CEIs"  # the result's end: the client must not see it
