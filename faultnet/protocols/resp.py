"""Redis's RESP (RESP2 and RESP3): a pure session (sans-I/O) that pairs one connection's
commands with their replies and applies a plan to each command.

Theory of operation
-------------------

No library parses RESP for a proxy (redis-py's parsers build values, and a value can be
512 MB), so :class:`Scanner` here finds the boundaries of values and keeps nothing of
them but a command's first two arguments (its name and, for most commands, its key),
each at most :data:`MAX_ARG` bytes. A bulk string's length is a count of bytes to let
through, never an allocation: a hostile ``$9999999999`` costs nothing. A line (a
type's header, an inline command) is kept until its end, at most :data:`MAX_LINE`
bytes; aggregates nest at most :data:`MAX_DEPTH` deep. Past any bound, or on bytes that
are not RESP, the stream turns *opaque*: forwarded as it comes, never parsed again.

:class:`Session` does no I/O and knows no clock; its events and commands are those of
:mod:`faultnet.protocols.http` (:class:`~faultnet.protocols.http.Forward` the original
bytes, :class:`~faultnet.protocols.http.Inject` an error reply it made,
:class:`~faultnet.protocols.http.Hold` the downstream until a reply's delay is over,
:class:`~faultnet.protocols.http.Eof`, :class:`~faultnet.protocols.http.Close`), so
the HTTP toxics' driver carries them out. Bytes cross as they came: a command no plan
touches is byte-identical on the other side, and is forwarded as soon as its name and
first argument are known (the rest streams behind it).

The client's commands are arrays of bulk strings (``*2\\r\\n$3\\r\\nGET\\r\\n...``) or
inline (a line of words: ``PING\\r\\n``); an empty command (``*0``, ``*-1``, an empty
line) gets no reply from Redis, so none is awaited. Replies come back in command order,
one each, so the session keeps one :class:`_Slot` per command not yet answered; an
error a plan answers with goes out when every earlier reply has. RESP3's push frames
(``>``: client-side caching's invalidations) are no command's reply and pass between
them. A command that turns the connection into a stream of pushes (``SUBSCRIBE``,
``PSUBSCRIBE``, ``SSUBSCRIBE``, ``MONITOR``) makes it opaque once forwarded: the
client's stream at once, the server's once every reply before it has passed; either
way each byte goes on in the order it came, however the reads split them. Opaque is
for good (a ``RESET`` that leaves pub/sub is not followed).

Every state of the two streams and every transition between them is in
:data:`TRANSITIONS` (h11's ``_state.py`` rule: what changes a stream's state is there,
nowhere else).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from faultnet.protocols._states import step
from faultnet.protocols.http import DOWN, UP, Close, Command, Duplex, Eof, Forward, Hold, Inject

__all__ = [
    "MAX_ARG",
    "MAX_DEPTH",
    "MAX_LINE",
    "PUSH_COMMANDS",
    "Plan",
    "Request",
    "Scanner",
    "Segment",
    "Session",
    "error_reply",
]

#: The longest line kept (a type's header line, an inline command): Redis's own
#: inline limit (PROTO_INLINE_MAX_SIZE, 64 KiB), past which it answers a protocol error
#: and closes.
MAX_LINE = 64 * 1024
#: The most bytes of a command's name or first argument kept for matching; a longer
#: first argument is no key a rule can name (``Request.key`` None).
MAX_ARG = 64 * 1024
#: How deep aggregates may nest in a reply (Redis's own replies nest a few levels).
MAX_DEPTH = 128
#: The commands after which a connection carries pushes, not replies.
PUSH_COMMANDS = frozenset({b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"MONITOR"})

#: Types whose value is the rest of their line; types with a length, then that many
#: bytes and a CRLF; aggregates of that many values (a map and an attribute: pairs).
_SIMPLE = frozenset(b"+-:_#,(")
_BULK = frozenset(b"$!=")
_AGGREGATE = frozenset(b"*~>%|")


class Unreadable(ValueError):
    """Bytes that are not RESP, or past a bound."""


# -- the scanner -------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A command as a rule sees it: its name (upper case) and its first argument, or
    None (none, or longer than :data:`MAX_ARG`)."""

    name: bytes
    key: bytes | None


@dataclass
class Segment:
    """A piece of one chunk that belongs to one value."""

    data: bytes
    #: The value's type (``b"*"``, ``b">"``...; ``b" "`` for an inline command).
    kind: bytes
    #: The value ends with this piece.
    end: bool = False
    #: A command's name and first argument are known with this piece (the piece ends
    #: where they did); None for a reply, or an empty command.
    request: Request | None = None
    #: The bytes from here on are not RESP: the scanner read no further.
    unreadable: bool = False


class Scanner:
    """The values of one stream, found in its chunks (see the module docstring).

    *commands*: the client's stream (arrays of bulk strings, or inline lines), whose
    first two arguments are kept; else the server's (any RESP2 or RESP3 value).
    """

    def __init__(self, commands: bool) -> None:
        self.commands = commands
        #: An incomplete line at the end of what was fed: not yet given out in a piece
        #: (a value's type is known only once its line is whole).
        self._line = bytearray()
        #: Values still to come in each open aggregate, outermost first.
        self._stack: list[int] = []
        #: Bytes of a bulk string still to come (its CRLF included).
        self._bulk = 0
        #: Inside a value: its type; b"" between values.
        self._kind = b""
        #: The type of the value being scanned, or the last one (kept past its end).
        self._current = b" "
        # A command: its argument count, the argument being kept (-1: none), what is
        # left of it, and its name and first argument as far as kept.
        self._argc = 0
        self._keeping = -1
        self._keep_left = 0
        self._args: list[bytearray] = []

    @property
    def buffered(self) -> int:
        """Bytes kept now (bounded: a line, and a command's two arguments)."""
        return len(self._line) + sum(len(a) for a in self._args)

    def rest(self) -> bytes:
        """The bytes of an incomplete line not given out yet (emptied): at a stream's
        end, or when it turns opaque, they are passed on as they came."""
        rest = bytes(self._line)
        self._line.clear()
        return rest

    def carry(self, line: bytes) -> None:
        """Keep *line* again, as :meth:`rest` took it: the incomplete line fed last."""
        self._line[:0] = line

    def feed(self, data: bytes) -> list[Segment]:
        """The pieces of *data* (after any incomplete line kept from before), in order,
        each within one value. A line is given out only once whole."""
        out: list[Segment] = []
        head = self.rest()  # given out with the first piece
        start, i, n = 0, 0, len(data)
        try:
            while i < n:
                request: Request | None = None
                if self._bulk:
                    take = min(self._bulk, n - i)
                    if self._keeping >= 0:
                        self._keep(data[i : i + take])
                    self._bulk -= take
                    i += take
                    if not self._bulk:
                        request = self._bulk_done()
                else:
                    j = data.find(b"\n", i)
                    # The carried line is this one's beginning only at the first byte.
                    before = head if start == i else b""
                    if j < 0:
                        if len(before) + n - i > MAX_LINE:
                            raise Unreadable("a line longer than MAX_LINE")
                        if i > start:  # the value's bytes before the line go now
                            out.append(Segment(head + data[start:i], self._current))
                        self._line += before + data[i:]
                        return out
                    line = before + data[i:j]
                    if len(line) > MAX_LINE:
                        raise Unreadable("a line longer than MAX_LINE")
                    i = j + 1
                    request = self._on_line(line[:-1] if line.endswith(b"\r") else line)
                if request is not None or not self._kind:
                    out.append(
                        Segment(head + data[start:i], self._current, not self._kind, request)
                    )
                    head, start = b"", i
        except Unreadable:
            self._line.clear()
            out.append(Segment(head + data[start:], self._current, unreadable=True))
            return out
        if start < n:
            out.append(Segment(head + data[start:], self._current))
        return out

    def whole(self, data: bytes) -> list[tuple[bytes, Request | None, int]]:
        """The whole values *data* begins with, each as (its type, its request, where it
        ends), found with no call per line: what :meth:`feed` would find, for the values
        most traffic is (a command of bulk strings, each kept argument within
        :data:`MAX_ARG`; a reply of one line, or a bulk string). Stops at the first
        other one, or one not whole (the caller feeds the rest); none unless between
        values with nothing carried. Pipelined traffic is made of these: ~12 calls per
        command each way were most of a toxic's cost (issue 34)."""
        out: list[tuple[bytes, Request | None, int]] = []
        if self._kind or self._line:
            return out
        i, n, commands = 0, len(data), self.commands
        while i < n:
            kind = data[i : i + 1]
            end = self._whole_command(data, i) if commands else self._whole_reply(data, i)
            if end is None:
                break
            i, request = end
            out.append((kind, request, i))
            self._current = kind
        return out

    def _whole_command(self, data: bytes, i: int) -> tuple[int, Request | None] | None:
        """Where the command of bulk strings at *i* ends, and its request; None if it is
        not one, or not whole (see :meth:`whole`)."""
        if data[i] != 42:  # b"*": an inline command goes the long way
            return None
        argc, at = _number(data, i)
        if argc is None or argc <= 0 or at > len(data):
            return None
        args: list[bytes] = []
        for index in range(argc):
            if at >= len(data) or data[at] != 36:  # b"$"
                return None
            size, start = _number(data, at)
            if size is None or size < 0 or (index < 2 and size > MAX_ARG):
                return None
            at = start + size + 2
            if at > len(data):
                return None
            if index < 2:
                args.append(data[start : start + size])
        self._argc = argc
        return at, Request(args[0].upper(), args[1] if argc > 1 else None)

    @staticmethod
    def _whole_reply(data: bytes, i: int) -> tuple[int, Request | None] | None:
        """Where the reply at *i* ends, if it is one line or a bulk string, whole."""
        first = data[i]
        if first in _SIMPLE:
            j = data.find(b"\n", i)
            return None if j < 0 or j - i > MAX_LINE else (j + 1, None)
        if first not in _BULK:
            return None
        size, at = _number(data, i, signed=True)
        if size is None or at > len(data):
            return None
        end = at if size < 0 else at + size + 2  # a null has no body
        return None if end > len(data) else (end, None)

    # -- internals --

    def _on_line(self, line: bytes) -> Request | None:
        """A whole line (its CR taken off): a value's header, or an inline command."""
        top = not self._kind
        kind = line[:1]
        if top:
            self._current = b" " if self.commands and kind != b"*" else kind
            if self.commands and kind != b"*":
                return self._inline(line)
            self._kind = kind
        if not kind:
            raise Unreadable("an empty line inside a value")
        if self.commands and not top and kind != b"$":
            raise Unreadable("a command's argument that is not a bulk string")
        if kind[0] in _SIMPLE:
            self._value_done()
            return None
        if kind[0] in _BULK:
            return self._bulk_header(self._size(line))
        if kind[0] in _AGGREGATE:
            self._aggregate_header(kind, self._size(line), top)
            return None
        raise Unreadable(f"no RESP type {kind!r}")

    def _bulk_header(self, size: int) -> Request | None:
        if size < 0:  # a null ($-1)
            if self.commands:
                raise Unreadable("a null argument")
            self._value_done()
            return None
        self._bulk = size + 2
        if self.commands and len(self._stack) == 1:
            return self._argument(self._argc - self._stack[0], size)
        return None

    def _aggregate_header(self, kind: bytes, size: int, top: bool) -> None:
        if top and self.commands:
            self._argc, self._args = size, []
        if size <= 0:  # an empty or null aggregate (a command with no arguments)
            return self._value_done()
        if len(self._stack) >= MAX_DEPTH:
            raise Unreadable("aggregates nested past MAX_DEPTH")
        # A map holds pairs; an attribute, pairs and then the value it is about.
        self._stack.append(size * 2 + 1 if kind == b"|" else size * 2 if kind == b"%" else size)

    @staticmethod
    def _size(line: bytes) -> int:
        text = line[1:]
        # isascii/isdigit first: int() takes "+3", " 3" and "3_0", RESP does not.
        digits = text[1:] if text[:1] == b"-" else text
        if not (digits.isdigit() and len(digits) <= 19):
            raise Unreadable(f"a length that is not a number: {bytes(line[:40])!r}")
        return int(text)

    def _inline(self, line: bytes) -> Request | None:
        words = line.split()
        self._kind = b""
        if not words:
            return None
        key = words[1] if len(words) > 1 and len(words[1]) <= MAX_ARG else None
        return Request(words[0].upper(), key)

    def _argument(self, index: int, size: int) -> Request | None:
        """A command's argument *index* of *size* bytes begins: its name and first are
        kept; one longer than MAX_ARG is not, and the command is known without it (a
        name that long is none, ``b""``; a first argument that long is no key)."""
        if index >= 2 or len(self._args) != index:  # known already, or not kept
            return None
        if size > MAX_ARG:
            name = bytes(self._args[0]).upper() if index else b""
            self._args = [bytearray(), bytearray(), bytearray()]  # nothing more kept
            return Request(name, None)
        self._keeping, self._keep_left = index, size
        self._args.append(bytearray())
        return None

    def _keep(self, data: bytes) -> None:
        """Keep what *data* (a piece of a bulk string: data, then its CRLF) holds of the
        argument being kept (at most MAX_ARG: :meth:`_argument`)."""
        want = min(len(data), self._keep_left)
        self._args[self._keeping] += data[:want]
        self._keep_left -= want

    def _bulk_done(self) -> Request | None:
        index, self._keeping = self._keeping, -1
        self._value_done()
        if index == 1 or (index == 0 and self._argc == 1):
            key = None if index == 0 else bytes(self._args[1])
            request = Request(bytes(self._args[0]).upper(), key)
            self._args = []
            return request
        return None

    def _value_done(self) -> None:
        """A value inside the current one (or the current one) is complete."""
        while self._stack:
            self._stack[-1] -= 1
            if self._stack[-1]:
                return
            self._stack.pop()
        self._kind = b""


def _number(data: bytes, i: int, signed: bool = False) -> tuple[int | None, int]:
    """The length on the header line at *i* (its type byte, digits, CRLF or LF), as
    :meth:`Scanner._size` reads it, and where the line ends; None when the line is not
    whole or not such a number (the long way then decides)."""
    j = data.find(b"\n", i, i + 24)
    if j < 0:
        return None, len(data) + 1
    text = data[i + 1 : j - 1] if data[j - 1] == 13 else data[i + 1 : j]  # 13: CR
    digits = text[1:] if signed and text[:1] == b"-" else text
    if not (digits.isdigit() and len(digits) <= 19):
        return None, j + 1
    return int(text), j + 1


# -- plans and commands ------------------------------------------------------------------


@dataclass
class Plan:
    """What one toxic does to one command and its reply: data. The default passes both."""

    #: What was done (``error``, ``delay``, ``hold``, ``close``), for the event log.
    action: str = "pass"
    detail: dict[str, object] = field(default_factory=dict)
    #: Answer the command with this error reply (the whole ``-...\\r\\n``) instead.
    error: bytes | None = None
    #: Never forward this command, nor anything after it; nothing answers it.
    hold: bool = False
    #: Hold the reply this long (seconds) from when its first byte reached the proxy.
    delay: float = 0.0
    #: Send the reply's first line without its CRLF, then end the connection (FIN).
    close: bool = False


def error_reply(text: str) -> bytes:
    """An error reply of *text* (``READONLY You can't...``; a leading ``-`` is kept
    once). ValueError for a CR or LF, which would end the reply early."""
    if "\r" in text or "\n" in text:
        raise ValueError("an error reply is one line: no CR or LF")
    return b"-" + text.removeprefix("-").encode() + b"\r\n"


Decide = Callable[[Request], Plan | None]
Log = Callable[..., None]


# -- the states, all in one place --------------------------------------------------------


class _Member(enum.Enum):
    """An enum whose members hash by identity, in C: Enum's own ``__hash__`` is Python,
    and a transition's lookup hashed two members (~10 calls per pipelined command)."""

    __hash__ = object.__hash__


class Up(_Member):
    """The client-to-server stream."""

    IDLE = "idle"  # between commands
    COMMAND = "command"  # a command begun, its name and first argument awaited: kept
    SENDING = "sending"  # a forwarded command's rest
    DROPPING = "dropping"  # an answered command's rest: read, not forwarded
    HELD = "held"  # a held command: nothing more is forwarded
    OPAQUE = "opaque"  # pushes entered, or not RESP: forwarded as it comes
    DONE = "done"


class Down(_Member):
    """The server-to-client stream."""

    UNSYNCED = "unsynced"  # the session began mid-stream: pass until a command is seen
    IDLE = "idle"  # between replies
    REPLYING = "replying"  # a reply (or push frame) crossing
    OPAQUE = "opaque"
    DONE = "done"


class Ev(_Member):
    """What moves a stream from one state to another."""

    BEGIN = "begin"  # a value's first bytes
    FORWARDED = "forwarded"  # its plan forwards it
    ANSWERED = "answered"  # its plan answers it
    HELD = "held"  # its plan holds it
    EMPTY = "empty"  # an empty command ended
    VALUE_END = "value end"
    OPAQUE = "opaque"
    END = "end"  # the stream's end passed on
    ENDED = "ended"  # the connection ended (a plan's close)


#: (state, event) -> next state, for each stream. A pair not here is a bug (KeyError).
TRANSITIONS: dict[tuple[Up | Down, Ev], Up | Down] = {
    # client to server
    (Up.IDLE, Ev.BEGIN): Up.COMMAND,
    (Up.COMMAND, Ev.FORWARDED): Up.SENDING,
    (Up.COMMAND, Ev.ANSWERED): Up.DROPPING,
    (Up.COMMAND, Ev.HELD): Up.HELD,
    (Up.COMMAND, Ev.EMPTY): Up.IDLE,
    (Up.SENDING, Ev.VALUE_END): Up.IDLE,
    (Up.DROPPING, Ev.VALUE_END): Up.IDLE,
    **{(s, Ev.OPAQUE): Up.OPAQUE for s in (Up.IDLE, Up.COMMAND, Up.SENDING, Up.DROPPING)},
    **{(s, Ev.END): Up.DONE for s in Up},
    **{(s, Ev.ENDED): Up.DONE for s in Up},
    # server to client
    (Down.UNSYNCED, Ev.BEGIN): Down.IDLE,  # the client's first command: in step
    (Down.IDLE, Ev.BEGIN): Down.REPLYING,
    (Down.REPLYING, Ev.VALUE_END): Down.IDLE,
    **{(s, Ev.OPAQUE): Down.OPAQUE for s in (Down.IDLE, Down.REPLYING, Down.OPAQUE)},
    **{(s, Ev.END): Down.DONE for s in Down},
    **{(s, Ev.ENDED): Down.DONE for s in Down},
}


# -- the session -------------------------------------------------------------------------


@dataclass
class _Slot:
    """One command waiting for its reply, in order."""

    plan: Plan
    request: Request | None
    #: The error reply the plan answers with (the command was not forwarded).
    answer: bytes | None = None
    #: Its reply, and all after, are opaque (a push command, or bytes not RESP).
    opaque: bool = False
    logged: bool = False
    #: When the first byte of its reply reached the proxy.
    reply_at: float | None = None
    #: No plan touched it (decide said None) and it enters no pushes: its reply passes
    #: as it comes, nothing logged, nothing after it.
    plain: bool = False


class _Part(enum.Enum):
    REPLY, RAW, ANSWER, EOF = range(4)


@dataclass
class _Out:
    """Something waiting to go to the client, in order."""

    part: _Part
    data: bytes
    slot: _Slot | None
    t: float


class Session(Duplex):
    """One connection's RESP traffic through one toxic (see the module docstring).

    *decide* says what to do with each command (None: pass it); *log* is told each
    fault when it takes effect (``redis_fault``).
    """

    def __init__(self, decide: Decide, log: Log = lambda event, **fields: None) -> None:
        super().__init__()
        self.decide = decide
        self.log_event = log
        self.up = Up.IDLE
        self.down = Down.UNSYNCED
        self.slots: deque[_Slot] = deque()
        self._commands = Scanner(commands=True)
        self._replies = Scanner(commands=False)
        self._kept = bytearray()  # a command's bytes before its plan (bounded: MAX_ARG x 2)
        self._pushes = False  # the command crossing turns the connection into pushes
        self._up_eof = False
        self._down_eof = False
        self._out: deque[_Out] = deque()
        self._holding = False

    # -- events in, commands out --

    def timer(self, stream: str, now: float) -> list[Command]:
        """A :class:`~faultnet.protocols.http.Hold` of *stream* came due."""
        if stream == DOWN:
            self._holding = False
            self._pump(now)
        return self._take()

    @property
    def buffered(self) -> int:
        """Bytes the session holds now (bounded: the scanners', a command's first two
        arguments, one read chunk in the queue to the client)."""
        held = len(self._kept) + self._commands.buffered + self._replies.buffered
        return held + sum(len(o.data) for o in self._out)

    # -- internals --

    def _go_up(self, event: Ev) -> None:
        self.up = step(TRANSITIONS, self.up, event)

    def _go_down(self, event: Ev) -> None:
        self.down = step(TRANSITIONS, self.down, event)

    # (A method, not ``is`` in place: mypy narrows a state across the calls that change it.)
    def _up_is(self, *states: Up) -> bool:
        return self.up in states

    def _down_is(self, state: Down) -> bool:
        return self.down is state

    def _end(self) -> None:
        self._emit(Close())
        self._go_up(Ev.ENDED)
        self._go_down(Ev.ENDED)
        self._out.clear()
        self._kept.clear()
        self.slots.clear()

    def _log(self, slot: _Slot) -> None:
        if slot.logged or slot.plan.action == "pass" or slot.request is None:
            return
        slot.logged = True
        key = slot.request.key
        self.log_event(
            "redis_fault",
            command=slot.request.name.decode("latin-1"),
            key=None if key is None else key.decode("latin-1"),
            action=slot.plan.action,
            **slot.plan.detail,
        )

    # -- client to server --

    def _upstream(self, data: bytes, now: float) -> None:
        if self.up in (Up.HELD, Up.DONE):
            return
        if self.up is Up.OPAQUE:
            return self._emit(Forward(UP, self._commands.rest() + data, now))
        if self.up is Up.IDLE:
            data = self._whole_commands(data, now)
            if not data or self._up_is(Up.HELD, Up.DONE):
                return
        for seg in self._commands.feed(data):
            if self._up_is(Up.OPAQUE):  # behind a push command: as it came
                self._emit(Forward(UP, seg.data, now))
            elif self._up_is(Up.HELD, Up.DONE):
                return
            else:
                self._command_piece(seg, now)
        if self._up_is(Up.OPAQUE):  # the line it ends with is no command's: on it goes
            self._emit(Forward(UP, self._commands.rest(), now))

    def _whole_commands(self, data: bytes, now: float) -> bytes:
        """The whole commands *data* begins with (:meth:`Scanner.whole`), each as
        :meth:`_command_piece` takes a command in one piece; what is left of *data* (from
        the first other one, or once a command leaves the stream other than idle)."""
        start = passed = 0  # plain commands from *passed* to *start* go in one Forward
        for _, request, end in self._commands.whole(data):
            assert request is not None
            if self.down is Down.UNSYNCED:
                self._go_down(Ev.BEGIN)
            plan = self.decide(request)
            if plan is None and request.name not in PUSH_COMMANDS:
                # Idle to idle (BEGIN, FORWARDED, VALUE_END), its reply owed in order.
                self.slots.append(_Slot(Plan(), request, plain=True))
                start = end
                continue
            self._emit(Forward(UP, data[passed:start], now))
            self._go_up(Ev.BEGIN)
            self._kept += data[start:end]
            start = passed = end
            self._on_command(request, now, plan)
            if not self._up_is(Up.SENDING, Up.DROPPING):
                break  # held, or the connection ended
            self._go_up(Ev.VALUE_END)
            if self._pushes:
                self._go_up(Ev.OPAQUE)
                break
        self._emit(Forward(UP, data[passed:start], now))
        self._sync(now)
        return data[start:]

    def _command_piece(self, seg: Segment, now: float) -> None:
        if seg.unreadable:
            return self._up_opaque(seg.data, now)
        if self.up is Up.IDLE:
            self._go_up(Ev.BEGIN)
            if self.down is Down.UNSYNCED:
                self._go_down(Ev.BEGIN)
        if self.up is Up.COMMAND:
            self._kept += seg.data
            if seg.request is not None:
                self._on_command(seg.request, now)
            elif seg.end:  # an empty command: no reply comes
                self._go_up(Ev.EMPTY)
                self._emit(Forward(UP, bytes(self._kept), now))
                self._kept.clear()
                return
        elif self.up is Up.SENDING:
            self._emit(Forward(UP, seg.data, now))
        if seg.end and self._up_is(Up.SENDING, Up.DROPPING):
            self._go_up(Ev.VALUE_END)
            if self._pushes:
                self._go_up(Ev.OPAQUE)

    def _on_command(self, request: Request, now: float, plan: Plan | None = None) -> None:
        """*request* known, with its plan if decided already (None: ask ``decide``)."""
        plan = plan or self.decide(request) or Plan()
        slot = _Slot(plan, request)
        kept, self._kept = bytes(self._kept), bytearray()
        if plan.hold:
            self._log(slot)
            self._go_up(Ev.HELD)
            if self._down_eof:
                self._end()  # both ends gone: nothing is left to wait for
            return
        if plan.error is not None:
            slot.answer = plan.error
            self._log(slot)
            self._go_up(Ev.ANSWERED)
        else:
            slot.opaque = self._pushes = request.name in PUSH_COMMANDS
            self._go_up(Ev.FORWARDED)
            self._emit(Forward(UP, kept, now))
        self.slots.append(slot)
        self._sync(now)

    def _up_opaque(self, data: bytes, now: float) -> None:
        """Not RESP from here on: the client's bytes pass as they come, and the server's
        once the replies owed before them have."""
        if self.up is Up.DROPPING:
            data = b""  # the rest of an answered command: never forwarded
        data, self._kept = bytes(self._kept) + data, bytearray()
        self._go_up(Ev.OPAQUE)
        self._emit(Forward(UP, data, now))
        self.slots.append(_Slot(Plan(), None, opaque=True))
        self._sync(now)

    def _upstream_eof(self, now: float) -> None:
        self._up_eof = True
        if self.up is Up.DONE:
            return
        if self.up is Up.HELD:
            if self._down_eof:
                self._end()
            return  # held: the server never hears of it
        # A command the client never finished: pass what came, as it came.
        self._emit(Forward(UP, bytes(self._kept) + self._commands.rest(), now))
        self._kept.clear()
        self._emit(Eof(UP))
        self._go_up(Ev.END)

    # -- server to client --

    def _downstream(self, data: bytes, now: float) -> None:
        if self.down is Down.DONE:
            return
        if self.down is Down.IDLE and not self._out:
            data = self._whole_replies(data, now)
            if not data or self._down_is(Down.DONE):
                return
        if self.down in (Down.OPAQUE, Down.UNSYNCED):
            self._out.append(_Out(_Part.RAW, self._replies.rest() + data, None, now))
            return self._pump(now)
        segments = self._replies.feed(data)
        # The incomplete line the chunk ends with comes after all its pieces: out of the
        # scanner while they are queued, or turning opaque among them (_sync) would send
        # it ahead of the replies still to queue.
        line = self._replies.rest()
        for seg in segments:
            if self._down_is(Down.DONE):  # a close plan ended the connection
                return
            if self._down_is(Down.OPAQUE):
                self._out.append(_Out(_Part.RAW, seg.data, None, now))
            elif seg.unreadable:
                self._go_down(Ev.OPAQUE)
                self._out.append(_Out(_Part.RAW, seg.data, None, now))
            else:
                self._reply_piece(seg, now)
        if not self._down_is(Down.OPAQUE):
            self._replies.carry(line)
        elif line:
            self._out.append(_Out(_Part.RAW, line, None, now))
        self._pump(now)

    def _whole_replies(self, data: bytes, now: float) -> bytes:
        """The whole replies *data* begins with (:meth:`Scanner.whole`) while nothing
        waits to go to the client, each as :meth:`_reply_piece` and :meth:`_pump` take a
        reply in one piece; what is left of *data* (from the first reply whose plan
        delays or closes, or once something waits or the stream is not idle)."""
        start = passed = 0  # plain replies from *passed* to *start* go in one Forward
        for _, _, end in self._replies.whole(data):
            slot = self._head()
            if slot is not None and slot.plain:  # REPLYING and back: nothing else to do
                self.slots.popleft()
                start = end
                continue
            self._emit(Forward(DOWN, data[passed:start], now))
            passed = start
            self._sync(now)  # what the plain replies' ends would have queued
            if self._out or not self._down_is(Down.IDLE):
                break
            slot = self._head()
            if slot is not None and (slot.plan.delay or slot.plan.close):
                break
            self._go_down(Ev.BEGIN)
            if slot is not None:
                if slot.reply_at is None:
                    slot.reply_at = now
                self._log(slot)
                self.slots.popleft()
            self._emit(Forward(DOWN, data[start:end], now))
            start = passed = end
            self._go_down(Ev.VALUE_END)
            self._sync(now)
            if self._out or not self._down_is(Down.IDLE):
                break
        if passed < start:
            self._emit(Forward(DOWN, data[passed:start], now))
            self._sync(now)
        return data[start:]

    def _reply_piece(self, seg: Segment, now: float) -> None:
        if self.down is Down.IDLE:
            self._go_down(Ev.BEGIN)
        slot = None if seg.kind == b">" else self._head()
        if slot is None:  # a push frame, or a reply nobody asked for: passed
            self._out.append(_Out(_Part.RAW, seg.data, None, now))
        else:
            if slot.reply_at is None:
                slot.reply_at = now
            self._out.append(_Out(_Part.REPLY, seg.data, slot, now))
        if seg.end:
            self._go_down(Ev.VALUE_END)
            if slot is not None:
                self.slots.popleft()
            self._sync(now)

    def _head(self) -> _Slot | None:
        """The slot the next reply answers (answers made here queued first)."""
        return self.slots[0] if self.slots else None

    def _sync(self, now: float) -> None:
        """Between replies: queue the plans' answers now at the head of the slots, and
        turn opaque at a push command's (or unreadable bytes') slot."""
        if self.down is not Down.IDLE:
            return
        while self.slots and self.slots[0].answer is not None:
            slot = self.slots.popleft()
            assert slot.answer is not None
            self._out.append(_Out(_Part.ANSWER, slot.answer, slot, now))
        if self.slots and self.slots[0].opaque:
            self.slots.clear()
            self._go_down(Ev.OPAQUE)
            if self._replies.buffered:
                # What the scanner kept of a value begun (its line) is the server's too,
                # the last it sent (none while a chunk's pieces are queued: _downstream).
                self._out.append(_Out(_Part.RAW, self._replies.rest(), None, now))
        self._pump(now)

    def _downstream_eof(self, now: float) -> None:
        self._down_eof = True
        if self.down is Down.DONE:
            return
        if self.up is Up.HELD and self._up_eof:
            return self._end()
        self._out.append(_Out(_Part.RAW, self._replies.rest(), None, now))
        self._out.append(_Out(_Part.EOF, b"", None, now))
        self._pump(now)

    # -- the queue to the client --

    def _pump(self, now: float) -> None:
        """Send what the plans' times allow, in order; a delayed reply holds the
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
                self._emit(Inject(DOWN, item.data))
            else:
                assert slot is not None and slot.reply_at is not None
                plan = slot.plan
                if plan.delay and now < slot.reply_at + plan.delay:
                    self._emit(Hold(DOWN, slot.reply_at + plan.delay))
                    self._holding = True
                    return
                self._log(slot)
                if plan.close:
                    return self._cut(item)
                self._emit(Forward(DOWN, item.data, item.t))
            self._out.popleft()

    def _cut(self, item: _Out) -> None:
        """A close plan: the reply's first line goes without its CRLF, then the end."""
        at = item.data.find(b"\n")
        if at < 0:
            self._emit(Forward(DOWN, item.data, item.t))  # the line goes on
            self._out.popleft()
            return
        self._emit(Forward(DOWN, item.data[:at].removesuffix(b"\r"), item.t))
        self._end()
