"""The RESP session (faultnet.protocols.resp) as tables: bytes in, pieces or commands
out, no socket and no clock (time is a number in each event)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from faultnet.protocols.http import Forward, Inject
from faultnet.protocols.resp import (
    MAX_ARG,
    MAX_LINE,
    TRANSITIONS,
    Down,
    Plan,
    Request,
    Scanner,
    Session,
    Up,
    error_reply,
)
from tests.faultnet.protocols._playbook import D, U, in_chunks, play, simple


def cmd(*args: bytes) -> bytes:
    """A command as redis-py and redis-cli send it: an array of bulk strings."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


GET = cmd(b"GET", b"k")
GET_B = cmd(b"GET", b"b")
SET = cmd(b"SET", b"k", b"v")
BULK = b"$3\r\nabc\r\n"
OK = b"+OK\r\n"
NIL = b"$-1\r\n"
READONLY = b"-READONLY You can't write against a read only replica.\r\n"


# -- the scanner -------------------------------------------------------------------------


def pieces(scanner: Scanner, *chunks: bytes) -> list[tuple[bytes, bytes, bool, object]]:
    out = []
    for chunk in chunks:
        for s in scanner.feed(chunk):
            shown = "unreadable" if s.unreadable else s.request
            out.append((s.data, s.kind, s.end, shown))
    return out


#: chunks of a client's stream -> the pieces (data, type, value ends, request or None)
COMMAND_ROWS: dict[str, tuple[tuple[bytes, ...], list[tuple[bytes, bytes, bool, object]]]] = {
    "one command": ((GET,), [(GET, b"*", True, Request(b"GET", b"k"))]),
    "pipelined, in one read": (
        (GET + SET,),
        [
            (GET, b"*", True, Request(b"GET", b"k")),
            (SET[:-7], b"*", False, Request(b"SET", b"k")),  # known here
            (b"$1\r\nv\r\n", b"*", True, None),
        ],
    ),
    "a name in any case, no key": (
        (cmd(b"ping"),),
        [(cmd(b"ping"), b"*", True, Request(b"PING", None))],
    ),
    "split inside a header line: given out once whole": (
        (b"*2\r\n$", b"3\r\nGET\r\n$1\r\nk\r\n"),
        [
            (b"*2\r\n", b"*", False, None),
            (b"$3\r\nGET\r\n$1\r\nk\r\n", b"*", True, Request(b"GET", b"k")),
        ],
    ),
    "split inside a bulk string": (
        (b"*2\r\n$3\r\nGE", b"T\r\n$1\r\nk\r\n"),
        [
            (b"*2\r\n$3\r\nGE", b"*", False, None),
            (b"T\r\n$1\r\nk\r\n", b"*", True, Request(b"GET", b"k")),
        ],
    ),
    "inline commands, LF alone too, and an empty line (no reply comes)": (
        (b"PING\r\nget  k\n\r\n",),
        [
            (b"PING\r\n", b" ", True, Request(b"PING", None)),
            (b"get  k\n", b" ", True, Request(b"GET", b"k")),
            (b"\r\n", b" ", True, None),
        ],
    ),
    "empty arrays: no command": (
        (b"*0\r\n*-1\r\n",),
        [(b"*0\r\n", b"*", True, None), (b"*-1\r\n", b"*", True, None)],
    ),
    "an argument that is not a bulk string": (
        (b"*1\r\n+PING\r\n",),
        [(b"*1\r\n+PING\r\n", b"*", False, "unreadable")],
    ),
    "a length that is not a number": (
        (b"*2\r\n$x\r\n",),
        [(b"*2\r\n$x\r\n", b"*", False, "unreadable")],
    ),
    "a null argument": ((b"*1\r\n$-1\r\n",), [(b"*1\r\n$-1\r\n", b"*", False, "unreadable")]),
}


@pytest.mark.parametrize("name", list(COMMAND_ROWS))
def test_the_command_scanner_finds_each_command_and_its_name_and_key(name: str) -> None:
    chunks, expected = COMMAND_ROWS[name]
    assert pieces(Scanner(commands=True), *chunks) == expected


def test_a_command_split_at_every_byte_gives_the_same_bytes_and_requests() -> None:
    stream = GET + b"PING\r\n" + SET + cmd(b"HELLO", b"3") + b"*0\r\n"
    scanner = Scanner(commands=True)
    got = [p for i in range(len(stream)) for p in pieces(scanner, stream[i : i + 1])]
    assert b"".join(p[0] for p in got) == stream
    assert [p[3] for p in got if p[3] is not None] == [
        Request(b"GET", b"k"), Request(b"PING", None), Request(b"SET", b"k"),
        Request(b"HELLO", b"3"),
    ]  # fmt: skip
    assert sum(p[2] for p in got) == 5


#: RESP2 and RESP3 replies, each one value (it ends, whole, in one piece)
REPLIES = [
    OK, READONLY, b":12\r\n", BULK, NIL, b"*-1\r\n", b"*0\r\n",
    b"*3\r\n:1\r\n*2\r\n+a\r\n$-1\r\n$2\r\nhi\r\n",
    b"_\r\n", b"#t\r\n", b",3.14\r\n", b"(3492890328409238509324850943850943825024385\r\n",
    b"!21\r\nSYNTAX invalid syntax\r\n", b"=15\r\ntxt:Some string\r\n",
    b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n", b"~2\r\n+a\r\n+b\r\n",
    b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*1\r\n:2\r\n",  # attribute, value
    b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n",
]  # fmt: skip


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: r[:12].decode(errors="replace"))
def test_each_reply_type_is_one_value(reply: bytes) -> None:
    assert pieces(Scanner(commands=False), reply + OK) == [
        (reply, reply[:1], True, None),
        (OK, b"+", True, None),
    ]
    # And byte by byte: the same bytes, one value ending.
    scanner = Scanner(commands=False)
    got = [p for i in range(len(reply)) for p in pieces(scanner, reply[i : i + 1])]
    assert b"".join(p[0] for p in got) == reply and [p[2] for p in got].count(True) == 1


def test_a_hostile_bulk_length_allocates_nothing() -> None:
    scanner = Scanner(commands=True)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        header = b"*2\r\n$3\r\nSET\r\n$9223372036854775000\r\n"
        scanner.feed(header)
        for _ in range(64):  # 4 MiB of a key that never ends
            scanner.feed(b"x" * 65536)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert scanner.buffered <= MAX_ARG + len(b"SET")
    assert grown < 4 * MAX_ARG, grown  # measured: one MAX_ARG key plus a chunk's slice


def test_past_its_bounds_a_stream_is_unreadable_not_kept() -> None:
    scanner = Scanner(commands=False)
    assert scanner.feed(b"+" + b"x" * (MAX_LINE - 1)) == []  # a line within its bound
    got = scanner.feed(b"xx")
    assert got[-1].unreadable and scanner.buffered == 0
    deep = Scanner(commands=False).feed(b"*1\r\n" * 200)
    assert deep[-1].unreadable
    assert b"".join(s.data for s in deep) == b"*1\r\n" * 200  # every byte given back


def test_a_key_longer_than_max_arg_is_no_key() -> None:
    # Known at the key's header: nothing of it is kept, and the rest streams.
    long = cmd(b"GET", b"k" * (MAX_ARG + 1))
    got = Scanner(commands=True).feed(long)
    assert [p.request for p in got] == [Request(b"GET", None), None]
    assert b"".join(p.data for p in got) == long and got[-1].end
    named = Scanner(commands=True).feed(cmd(b"x" * (MAX_ARG + 1), b"k"))
    assert [p.request for p in named] == [Request(b"", None), None]


# -- the session -------------------------------------------------------------------------


def plan_for(**plans: Plan) -> Callable[[Request], Plan | None]:
    """Plans by key (the key of each command faulted)."""
    return lambda r: plans.get((r.key or b"").decode())


ERROR = Plan("error", error=READONLY)
DELAY = Plan("delay", {"delay_ms": 500}, delay=0.5)
HOLD = Plan("hold", hold=True)
CLOSE = Plan("close", close=True)


@dataclass
class Row:
    """Events ("up"/"down" bytes, "up_eof"/"down_eof", "timer"), each with its time, and
    the commands expected after each one; the faults logged (command key action)."""

    decide: Callable[[Request], Plan | None]
    steps: list[tuple[str, bytes, float, list[tuple[object, ...]]]]
    logged: list[str] = field(default_factory=list)


ROWS: dict[str, Row] = {
    "no plan: each byte crosses as it came": Row(
        plan_for(),
        [
            ("up", GET + SET, 0, [("fwd", U, GET + SET)]),
            ("down", BULK + OK, 0, [("fwd", D, BULK + OK)]),
            ("up_eof", b"", 0, [("eof", U)]),
            ("down_eof", b"", 0, [("eof", D)]),
        ],
    ),
    "an error in its place among pipelined replies": Row(
        plan_for(b=ERROR),
        [
            ("up", GET + GET_B + SET, 0, [("fwd", U, GET + SET)]),
            ("down", BULK, 0, [("fwd", D, BULK), ("inject", D, READONLY)]),
            ("down", OK, 0, [("fwd", D, OK)]),
        ],
        ["redis_fault GET b error"],
    ),
    "an error first goes out at once; the server never sees the command": Row(
        plan_for(b=ERROR),
        [("up", GET_B, 0, [("inject", D, READONLY)]), ("up", GET, 0, [("fwd", U, GET)])],
        ["redis_fault GET b error"],
    ),
    "an error waits for the reply it follows, split across reads": Row(
        plan_for(b=ERROR),
        [
            ("up", GET + GET_B, 0, [("fwd", U, GET)]),
            ("down", b"$3\r\na", 0, [("fwd", D, b"$3\r\na")]),
            ("down", b"bc\r\n", 0, [("fwd", D, b"bc\r\n"), ("inject", D, READONLY)]),
        ],
        ["redis_fault GET b error"],
    ),
    "an answered command's rest is read, not forwarded": Row(
        plan_for(k=ERROR),
        [
            ("up", b"*3\r\n$3\r\nSET\r\n$1\r\n", 0, []),  # known only with the key
            ("up", b"k\r\n$1\r\n", 0, [("inject", D, READONLY)]),
            ("up", b"v\r\n" + GET_B, 0, [("fwd", U, GET_B)]),
        ],
        ["redis_fault SET k error"],
    ),
    "a delayed reply, and the replies behind it": Row(
        plan_for(k=DELAY),
        [
            ("up", GET + GET_B, 1.0, [("fwd", U, GET + GET_B)]),
            ("down", BULK + NIL, 1.25, [("hold", D, 1.75)]),
            ("timer", b"", 1.5, [("hold", D, 1.75)]),
            ("timer", b"", 1.75, [("fwd", D, BULK + NIL)]),
        ],
        ["redis_fault GET k delay"],
    ),
    "a held command: neither it nor what follows crosses; earlier replies do": Row(
        plan_for(k=HOLD),
        [
            ("up", GET_B + GET + SET, 0, [("fwd", U, GET_B)]),
            ("down", NIL, 0, [("fwd", D, NIL)]),
            ("up", GET_B, 0, []),
            ("up_eof", b"", 0, []),
            ("down_eof", b"", 0, [("close",)]),
        ],
        ["redis_fault GET k hold"],
    ),
    "close: the reply's first line without its CRLF, then the end": Row(
        plan_for(k=CLOSE),
        [
            ("up", GET + GET_B, 0, [("fwd", U, GET + GET_B)]),
            ("down", BULK + NIL, 0, [("fwd", D, b"$3"), ("close",)]),
            ("down", OK, 0, []),
        ],
        ["redis_fault GET k close"],
    ),
    "close after earlier replies": Row(
        plan_for(k=CLOSE),
        [
            ("up", GET_B + GET, 0, [("fwd", U, GET_B + GET)]),
            ("down", NIL + b"+O", 0, [("fwd", D, NIL)]),
            ("down", b"K\r\n", 0, [("fwd", D, b"+OK"), ("close",)]),
        ],
        ["redis_fault GET k close"],
    ),
    "RESP3 push frames pass between replies, pairing none": Row(
        plan_for(b=ERROR),
        [
            ("up", cmd(b"HELLO", b"3") + GET + GET_B, 0, [("fwd", U, cmd(b"HELLO", b"3") + GET)]),
            ("down", b"%0\r\n", 0, [("fwd", D, b"%0\r\n")]),
            (
                "down",
                b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n",
                0,
                [("fwd", D, b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n")],
            ),
            ("down", BULK, 0, [("fwd", D, BULK), ("inject", D, READONLY)]),
        ],
        ["redis_fault GET b error"],
    ),
    "SUBSCRIBE: the client's stream opaque at once, the server's after earlier replies": Row(
        plan_for(b=ERROR, k=DELAY),
        [
            (
                "up",
                GET_B + cmd(b"SUBSCRIBE", b"c", b"d") + GET,
                0,
                [("inject", D, READONLY), ("fwd", U, cmd(b"SUBSCRIBE", b"c", b"d") + GET)],
            ),
            (
                "down",
                b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n*3\r\n$9\r\nsubs",
                0,
                [("fwd", D, b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n*3\r\n$9\r\nsubs")],
            ),
            ("down", b"cribe\r\n", 0, [("fwd", D, b"cribe\r\n")]),
            ("up", GET + b"garbage", 0, [("fwd", U, GET + b"garbage")]),
        ],
        ["redis_fault GET b error"],
    ),
    "MONITOR after a reply in flight": Row(
        plan_for(),
        [
            ("up", GET + cmd(b"MONITOR"), 0, [("fwd", U, GET + cmd(b"MONITOR"))]),
            ("down", b"$3\r\nab", 0, [("fwd", D, b"$3\r\nab")]),
            (
                "down",
                b'c\r\n+OK\r\n+1.0 [0 x] "GET"\r\n',
                0,
                [("fwd", D, b'c\r\n+OK\r\n+1.0 [0 x] "GET"\r\n')],
            ),
        ],
    ),
    # The server's read: the reply owed, SUBSCRIBE's, a push's first line and part of its
    # next (once sent ahead of SUBSCRIBE's reply: ...$7*3\r\n$9\r\nsubscribe...).
    "SUBSCRIBE entered mid-read: a push's line begun goes after": Row(
        plan_for(),
        [
            ("up", GET + cmd(b"SUBSCRIBE", b"c"), 0, [("fwd", U, GET + cmd(b"SUBSCRIBE", b"c"))]),
            (
                "down",
                BULK + b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n>3\r\n$7",
                0,
                [("fwd", D, BULK + b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n>3\r\n$7")],
            ),
            ("down", b"\r\nmessage\r\n", 0, [("fwd", D, b"\r\nmessage\r\n")]),
        ],
    ),
    "...and behind an aggregate, which only the long way takes": Row(
        plan_for(),
        [
            ("up", GET + cmd(b"MONITOR"), 0, [("fwd", U, GET + cmd(b"MONITOR"))]),
            ("down", b"*1\r\n:1\r\n+OK\r\n+1.0", 0, [("fwd", D, b"*1\r\n:1\r\n+OK\r\n+1.0")]),
        ],
    ),
    "a push command's client stream: a line begun goes on at once": Row(
        plan_for(),
        [("up", cmd(b"SUBSCRIBE", b"c") + b"PI", 0, [("fwd", U, cmd(b"SUBSCRIBE", b"c") + b"PI")])],
    ),
    "bytes that are not RESP: opaque both ways, after the replies owed": Row(
        plan_for(b=ERROR),
        [
            ("up", GET + b"*1\r\n+X\r\n" + GET_B, 0, [("fwd", U, GET + b"*1\r\n+X\r\n" + GET_B)]),
            (
                "down",
                BULK + b"-ERR Protocol error\r\n",
                0,
                [("fwd", D, BULK + b"-ERR Protocol error\r\n")],
            ),
        ],
    ),
    "an empty command awaits no reply": Row(
        plan_for(b=ERROR),
        [
            ("up", b"\r\n*0\r\n" + GET_B, 0, [("fwd", U, b"\r\n*0\r\n"), ("inject", D, READONLY)]),
        ],
        ["redis_fault GET b error"],
    ),
    "a reply before any command (the session began mid-stream) passes": Row(
        plan_for(k=CLOSE),
        [("down", b"$3\r\nab", 0, [("fwd", D, b"$3\r\nab")]), ("up", GET, 0, [("fwd", U, GET)])],
    ),
    "the client's unfinished command passes at its end": Row(
        plan_for(k=ERROR),
        [
            ("up", b"*2\r\n$3\r\nGET\r\n$1", 0, []),
            ("up_eof", b"", 0, [("fwd", U, b"*2\r\n$3\r\nGET\r\n$1"), ("eof", U)]),
        ],
    ),
}


def run(row: Row) -> list[str]:
    log: list[str] = []

    def record(event: str, **fields: object) -> None:
        log.append(f"{event} {fields['command']} {fields['key']} {fields['action']}")

    play(Session(row.decide, record), row.steps, timer=D)
    return log


@pytest.mark.parametrize("name", list(ROWS))
def test_the_session_does_what_each_row_says(name: str) -> None:
    row = ROWS[name]
    assert run(row) == row.logged


@pytest.mark.parametrize(
    "breakage",
    ["a reply out of order", "an error with the wrong prefix"],
)
def test_the_table_tells_a_broken_session_from_a_good_one(breakage: str) -> None:
    row = ROWS["an error in its place among pipelined replies"]
    if breakage == "a reply out of order":
        bad = Row(
            row.decide,
            [row.steps[0], ("down", BULK, 0, [("inject", D, READONLY), ("fwd", D, BULK)])],
        )
    else:
        wrong = Plan("error", error=error_reply("ERR You can't write"))
        bad = Row(plan_for(b=wrong), row.steps[:2])
    with pytest.raises(AssertionError):
        run(bad)


def test_every_state_is_in_the_table() -> None:
    states = {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values())
    assert states == set(Up) | set(Down)
    assert all(isinstance(TRANSITIONS[(s, e)], type(s)) for s, e in TRANSITIONS)


def test_a_pipelined_stream_split_at_every_byte_pairs_the_same() -> None:
    """Every split of the same bytes: the same bytes out, the error in the same place."""
    up = GET + GET_B + SET
    down = BULK + OK
    whole = run_split(up, down, len(up), len(down))
    assert whole == (GET + SET, BULK + READONLY + OK)
    for cut in range(1, len(up)):
        assert run_split(up, down, cut, len(down)) == whole, cut
    for cut in range(1, len(down)):
        assert run_split(up, down, len(up), cut) == whole, cut


def run_split(up: bytes, down: bytes, up_cut: int, down_cut: int) -> tuple[bytes, bytes]:
    session = Session(plan_for(b=ERROR))
    cmds = session.receive(U, up[:up_cut], 0) + session.receive(U, up[up_cut:], 0)
    cmds += session.receive(D, down[:down_cut], 0) + session.receive(D, down[down_cut:], 0)
    sent = {U: b"", D: b""}
    for c in cmds:
        if isinstance(c, Forward | Inject):
            sent[c.stream] += c.data
    return sent[U], sent[D]


def test_the_session_keeps_no_more_than_its_bounds() -> None:
    session = Session(plan_for())
    session.receive(U, b"*2\r\n$3\r\nSET\r\n$100000000\r\n", 0)
    for _ in range(32):
        cmds = session.receive(U, b"x" * 65536, 0)
        assert [simple(c)[0] for c in cmds] == ["fwd"]  # streamed, not kept
    assert session.buffered <= 2 * MAX_ARG + MAX_LINE


def test_an_error_reply_is_one_line() -> None:
    assert error_reply("-OOM x") == error_reply("OOM x") == b"-OOM x\r\n"
    with pytest.raises(ValueError, match="one line"):
        error_reply("ERR a\r\n+OK")


def test_down_state_unsynced_ends_at_the_first_command() -> None:
    session = Session(plan_for())
    assert session.down is Down.UNSYNCED
    session.receive(U, GET, 0)
    assert session.down is Down.IDLE and session.up is Up.IDLE


# -- the shortcut for whole values (issue 34) -------------------------------------------


#: bytes -> what Scanner.whole finds: (type, request, end) of each whole value it takes.
WHOLE_ROWS: dict[str, tuple[bool, bytes, list[tuple[bytes, object, int]]]] = {
    "pipelined commands": (
        True,
        GET + SET,
        [(b"*", Request(b"GET", b"k"), len(GET)), (b"*", Request(b"SET", b"k"), len(GET + SET))],
    ),
    "a name alone, any case, LF only": (
        True,
        b"*1\n$4\nping\r\n",
        [(b"*", Request(b"PING", None), 12)],
    ),
    "stops at an inline command": (
        True,
        GET + b"PING\r\n" + GET,
        [(b"*", Request(b"GET", b"k"), len(GET))],
    ),
    "stops at one not whole": (True, GET + SET[:-1], [(b"*", Request(b"GET", b"k"), len(GET))]),
    "an empty command goes the long way": (True, b"*0\r\n" + GET, []),
    "a null argument goes the long way": (True, b"*1\r\n$-1\r\n", []),
    "a name past MAX_ARG goes the long way": (True, cmd(b"x" * (MAX_ARG + 1)), []),
    "replies of a line and bulk strings": (
        False,
        OK + BULK + NIL + READONLY,
        [(b"+", None, 5), (b"$", None, 14), (b"$", None, 19), (b"-", None, 19 + len(READONLY))],
    ),
    "stops at an aggregate": (False, OK + b"*1\r\n" + OK, [(b"+", None, 5)]),
    "stops at a length that is not a number": (False, OK + b"$+3\r\nabc\r\n", [(b"+", None, 5)]),
}


@pytest.mark.parametrize("name", list(WHOLE_ROWS))
def test_the_scanner_takes_whole_common_values_at_once(name: str) -> None:
    commands, data, expected = WHOLE_ROWS[name]
    assert Scanner(commands).whole(data) == expected


def test_the_shortcut_takes_nothing_inside_a_value() -> None:
    scanner = Scanner(commands=True)
    scanner.feed(GET[:5])
    assert scanner.whole(GET[5:] + GET) == []


class LongWay(Scanner):
    """A scanner without its shortcut: every value goes through ``feed``."""

    def whole(self, data: bytes) -> list[tuple[bytes, Request | None, int]]:
        return []


def each_way(
    decide: Callable[[Request], Plan | None], events: list[tuple[str, bytes, float]]
) -> list[object]:
    """The commands after each event and the faults logged, with the shortcut and the
    long way."""
    outs: list[object] = []
    for scanner in (Scanner, LongWay):
        log: list[dict[str, object]] = []
        session = Session(decide, lambda event, _log=log, **fields: _log.append(fields))
        session._commands, session._replies = scanner(True), scanner(False)
        got = []
        for kind, data, now in events:
            if kind in (U, D):
                cmds = session.receive(kind, data, now)
            elif kind == "timer":
                cmds = session.timer(D, now)
            else:
                cmds = session.receive_eof(kind.removesuffix("_eof"), now)
            got.append([simple(c) for c in cmds])
        outs.append((got, log, session.up, session.down))
    return outs


#: A client's pipelined commands and the server's replies (one more than asked for, and
#: a push command's, at the end), for plans on keys b, d, h, c.
PIPE_UP = GET + GET_B + cmd(b"GET", b"d") + SET + cmd(b"GET", b"c") + cmd(b"GET", b"h") + GET
PIPE_DOWN = BULK + NIL + OK + READONLY + BULK + OK + b":1\r\n" + BULK


@pytest.mark.parametrize(
    "plans",
    [{}, {"b": ERROR}, {"d": DELAY}, {"c": CLOSE}, {"h": HOLD}, {"b": ERROR, "d": DELAY}],
    ids=["none", "error", "delay", "close", "hold", "error+delay"],
)
def test_the_shortcut_does_what_the_long_way_does_at_every_chunk_size(
    plans: dict[str, Plan],
) -> None:
    for size in range(1, max(len(PIPE_UP), len(PIPE_DOWN)) + 1):
        events: list[tuple[str, bytes, float]] = []
        for at in range(0, max(len(PIPE_UP), len(PIPE_DOWN)), size):
            events += [(U, PIPE_UP[at : at + size], at), (D, PIPE_DOWN[at : at + size], at)]
        events += [("timer", b"", 1000.0), ("upstream_eof", b"", 1000.0)]
        events += [("downstream_eof", b"", 1000.0)]
        fast, slow = each_way(plan_for(**plans), events)
        assert fast == slow, size


@pytest.mark.parametrize("name", list(ROWS))
def test_the_shortcut_does_what_the_long_way_does_in_each_row(name: str) -> None:
    row = ROWS[name]
    kinds = {"up": U, "down": D, "up_eof": "upstream_eof", "down_eof": "downstream_eof"}
    events = [(kinds.get(k, k), d, t) for k, d, t, _ in row.steps]
    fast, slow = each_way(row.decide, events)
    assert fast == slow


# -- pushes entered mid-chunk: every byte in the server's order --------------------------


SUB = cmd(b"SUBSCRIBE", b"c")
#: A RESP3 message on channel c, and the replies that enter each kind of pushes.
MESSAGE = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n"
SUB_REPLY = b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n"
LIST = b"*1\r\n$3\r\nabc\r\n"  # an aggregate: the shortcut leaves it to the long way

#: the client's pipelined commands -> the server's stream: a reply owed, the push
#: command's reply, pushes (plans: GET b answered with READONLY, in its place).
PUSH_ROWS: dict[str, tuple[bytes, bytes]] = {
    "SUBSCRIBE after a bulk reply": (GET + SUB, BULK + SUB_REPLY + MESSAGE + MESSAGE),
    "SUBSCRIBE after an aggregate": (cmd(b"LRANGE", b"k") + SUB, LIST + SUB_REPLY + MESSAGE),
    "SUBSCRIBE after an answered command": (GET + GET_B + SUB, BULK + SUB_REPLY + MESSAGE),
    "PSUBSCRIBE": (
        GET + cmd(b"PSUBSCRIBE", b"c*"),
        BULK
        + b"*3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:1\r\n"
        + b">4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$1\r\nc\r\n$2\r\nhi\r\n",
    ),
    "SSUBSCRIBE": (
        cmd(b"LRANGE", b"k") + cmd(b"SSUBSCRIBE", b"c"),
        LIST
        + b"*3\r\n$10\r\nssubscribe\r\n$1\r\nc\r\n:1\r\n"
        + b">3\r\n$8\r\nsmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n",
    ),
    "MONITOR": (GET + cmd(b"MONITOR"), BULK + OK + b'+1.0 [0 x] "GET" "k"\r\n' * 2),
    "not RESP": (GET + b"*1\r\n+X\r\n", BULK + b"-ERR Protocol error\r\n+x\r\n"),
}


def through(scanner: type[Scanner], up: bytes, down: bytes, size: int) -> tuple[bytes, bytes]:
    """*up*, then *down*, in reads of *size* bytes: what each side receives, in order.
    Once a stream is opaque, all of it that came has gone on (nothing kept behind)."""
    session = Session(plan_for(b=ERROR))
    session._commands, session._replies = scanner(True), scanner(False)
    sent = {U: b"", D: b""}
    for stream, data in ((U, up), (D, down)):
        came = b""
        for chunk in in_chunks(data, size):
            came += chunk
            for c in session.receive(stream, chunk, 0):
                if isinstance(c, Forward | Inject):
                    sent[c.stream] += c.data
            state = session.up if stream == U else session.down
            if state in (Up.OPAQUE, Down.OPAQUE):
                want = came.replace(GET_B, b"") if stream == U else came_down(came, up)
                assert sent[stream] == want, (stream, size)
    return sent[U], sent[D]


def came_down(came: bytes, up: bytes) -> bytes:
    """What the client gets of the server's *came*: READONLY after GET k's reply if GET
    b was sent (the rows' answered command)."""
    if GET_B not in up or not came.startswith(BULK):
        return came
    return BULK + READONLY + came[len(BULK) :]


@pytest.mark.parametrize("name", list(PUSH_ROWS))
@pytest.mark.parametrize("scanner", [Scanner, LongWay], ids=["shortcut", "long way"])
def test_pushes_entered_mid_chunk_keep_the_servers_order_at_every_chunk_size(
    name: str, scanner: type[Scanner]
) -> None:
    up, down = PUSH_ROWS[name]
    for size in range(1, max(len(up), len(down)) + 1):
        sent_up, sent_down = through(scanner, up + b"PING\r\n", down, size)
        assert sent_up == (up + b"PING\r\n").replace(GET_B, b""), size
        assert sent_down == came_down(down, up), size
