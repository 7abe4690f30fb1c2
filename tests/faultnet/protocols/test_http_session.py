"""The HTTP/1.1 session (faultnet.protocols.http) as a table: events in, commands out,
no socket and no clock (time is a number in each event)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import pytest

from faultnet.protocols.http import (
    MAX_BUFFER,
    TRANSITIONS,
    Answer,
    Close,
    Down,
    Forward,
    Plan,
    Reset,
    Session,
    Up,
    rewrite_head,
)
from faultnet.toxics.http import HttpDelay, client_plan
from tests.faultnet.protocols._playbook import D, U, play, simple

GET = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
GET_B = b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
HEAD = b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
BODY = b"hello"
UPGRADE = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
EXPECT = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass
class Row:
    """Events ("up"/"down" bytes, "up_eof"/"down_eof", "timer" of a stream), each with
    its time, and the commands expected after each one."""

    plan: Callable[[h11.Request], Plan | None]
    steps: list[tuple[str, object, float, list[tuple[object, ...]]]]
    logged: list[str] = field(default_factory=list)


def run(row: Row) -> list[str]:
    log: list[str] = []

    def record(event: str, **fields: object) -> None:
        log.append(f"{event} {fields.get('path', fields.get('stream'))} {fields.get('action', '')}")

    play(Session(row.plan, record), row.steps)
    return [line.strip() for line in log]


def passing(request: h11.Request) -> Plan | None:
    return None


def on_path(path: bytes, plan: Plan) -> Callable[[h11.Request], Plan | None]:
    return lambda request: plan if request.target == path else None


def abort(status: int = 503, body: bytes = b"") -> Plan:
    return Plan("abort", answer=Answer(status, body))


ANSWER_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
ANSWER_418 = b"HTTP/1.1 418 I'm a Teapot\r\nContent-Length: 0\r\n\r\n"
GET_C = b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
POST_P = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
GET_ABORT_418 = b"GET /c HTTP/1.1\r\nHost: x\r\nX-Faultnet-Abort-Request: 418\r\n\r\n"
GET_RESET = b"GET /c HTTP/1.1\r\nX-Faultnet-Reset-Request: 1\r\nHost: x\r\n\r\n"
GET_DELAY_250 = b"GET /c HTTP/1.1\r\nx-faultnet-delay-request: 250\r\nHost: x\r\n\r\n"
GET_DELAY_BAD = b"GET /c HTTP/1.1\r\nHost: x\r\nX-Faultnet-Delay-Request: soon\r\n\r\n"
GET_DELAY_SUP = b"GET /c HTTP/1.1\r\nHost: x\r\nX-Faultnet-Delay-Request: \xb2\r\n\r\n"
ANSWER_503_CLOSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)

ROWS: dict[str, Row] = {
    "pipelined requests and responses cross as they came": Row(
        passing,
        [
            ("up", GET + GET_B, 0, [("fwd", U, GET + GET_B)]),
            # A head is forwarded whole (h11 reads it whole): its first bytes wait.
            ("down", OK + OK[:5], 0, [("fwd", D, OK)]),
            ("down", OK[5:], 0, [("fwd", D, OK)]),
        ],
    ),
    "an abort answers in its place among pipelined requests": Row(
        on_path(b"/b", abort()),
        [
            ("up", GET + GET_B + GET, 0, [("fwd", U, GET + GET)]),
            ("down", OK, 0, [("fwd", D, OK), ("inject", D, ANSWER_503)]),
            ("down", OK, 0, [("fwd", D, OK)]),
        ],
        ["http_fault /b abort"],
    ),
    "an upgrade keeps the client's next bytes until the 101, then both are opaque": Row(
        passing,
        [
            ("up", UPGRADE + b"\x00raw", 0, [("fwd", U, UPGRADE)]),
            ("up", b"more", 0, []),
            (
                "down",
                SWITCHED + b"srv",
                0,
                [("fwd", U, b"\x00rawmore"), ("resume", U), ("fwd", D, SWITCHED + b"srv")],
            ),
            ("up", b"GET / HTTP/9\r\n", 0, [("fwd", U, b"GET / HTTP/9\r\n")]),
        ],
    ),
    "a refused upgrade reads the kept bytes as the next request": Row(
        passing,
        [
            ("up", UPGRADE + GET, 0, [("fwd", U, UPGRADE)]),
            ("down", OK, 0, [("fwd", U, GET), ("resume", U), ("fwd", D, OK)]),
        ],
    ),
    "a HEAD's response has no body, whatever its length says": Row(
        on_path(b"/b", Plan("delay", delay=1.0)),
        [
            ("up", HEAD + GET_B, 0, [("fwd", U, HEAD + GET_B)]),
            ("down", OK_HEAD + OK, 2, [("fwd", D, OK_HEAD), ("hold", D, 3.0)]),
            ("timer", D, 3, [("fwd", D, OK)]),
        ],
        ["http_fault /b delay"],
    ),
    "100 Continue passes, then the body, then the response": Row(
        passing,
        [
            ("up", EXPECT, 0, [("fwd", U, EXPECT)]),
            ("down", CONTINUE, 0, [("fwd", D, CONTINUE)]),
            ("up", b"abc", 0, [("fwd", U, b"abc")]),
            ("down", OK, 0, [("fwd", D, OK)]),
        ],
    ),
    "an abort before a 100-continue body answers at once and closes, saying so": Row(
        lambda request: abort(),
        [("up", EXPECT, 0, [("inject", D, ANSWER_503_CLOSE), ("close",)])],
        ["http_fault /p abort"],
    ),
    "a body delimited by the close ends with the close": Row(
        passing,
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            (
                "down",
                b"HTTP/1.1 200 OK\r\n\r\nto the",
                0,
                [("fwd", D, b"HTTP/1.1 200 OK\r\n\r\nto the")],
            ),
            ("down", b" end", 0, [("fwd", D, b" end")]),
            ("down_eof", None, 0, [("eof", D)]),
        ],
    ),
    "an HTTP/1.0 request's abort closes after the answer": Row(
        lambda request: abort(),
        [("up", b"GET /x HTTP/1.0\r\n\r\n", 0, [("inject", D, ANSWER_503_CLOSE), ("close",)])],
        ["http_fault /x abort"],
    ),
    "an HTTP/1.0 request passes untouched, and its response to the close": Row(
        passing,
        [
            ("up", b"GET /x HTTP/1.0\r\n\r\n", 0, [("fwd", U, b"GET /x HTTP/1.0\r\n\r\n")]),
            (
                "down",
                b"HTTP/1.0 200 OK\r\n\r\nbody",
                0,
                [("fwd", D, b"HTTP/1.0 200 OK\r\n\r\nbody")],
            ),
            ("down_eof", None, 0, [("eof", D)]),
        ],
    ),
    "a 204 abort sends no body and no length": Row(
        lambda request: abort(204, b"oops"),
        [("up", GET, 0, [("inject", D, b"HTTP/1.1 204 No Content\r\n\r\n")])],
        ["http_fault /a abort"],
    ),
    "a CONNECT's 2xx turns both streams opaque": Row(
        passing,
        [
            (
                "up",
                b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n\x16\x03",
                0,
                [("fwd", U, b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")],
            ),
            (
                "down",
                b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x03",
                0,
                [
                    ("fwd", U, b"\x16\x03"),
                    ("resume", U),
                    ("fwd", D, b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x03"),
                ],
            ),
        ],
    ),
    "an abort behind a delayed response waits its turn": Row(
        lambda request: Plan("delay", delay=0.5) if request.target == b"/a" else abort(),
        [
            ("up", GET + GET_B, 0, [("fwd", U, GET)]),
            ("down", OK, 1, [("hold", D, 1.5)]),
            ("up", GET_B, 1.2, []),
            (
                "timer",
                D,
                1.5,
                [("fwd", D, OK), ("inject", D, ANSWER_503), ("inject", D, ANSWER_503)],
            ),
        ],
        ["http_fault /b abort", "http_fault /b abort", "http_fault /a delay"],
    ),
    "an early hint passes at once; the delay holds the final head": Row(
        lambda request: Plan("delay", delay=0.5),
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            (
                "down",
                b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n" + OK,
                1,
                [
                    ("fwd", D, b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n"),
                    ("hold", D, 1.5),
                ],
            ),
            ("timer", D, 1.5, [("fwd", D, OK)]),
        ],
        ["http_fault /a delay"],
    ),
    # -- a fault at each state --
    "a hold forwards nothing more, and ends once both sides have gone": Row(
        on_path(b"/b", Plan("hold", hold=True)),
        [
            ("up", GET + GET_B + GET, 0, [("fwd", U, GET)]),
            ("up_eof", None, 0, []),
            ("down", OK, 0, [("fwd", D, OK)]),
            ("down_eof", None, 0, [("close",)]),
        ],
        ["http_fault /b hold"],
    ),
    "a delay holds the head from when it was read": Row(
        lambda request: Plan("delay", delay=0.5),
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            ("down", OK, 1, [("hold", D, 1.5)]),
            ("timer", D, 1.5, [("fwd", D, OK)]),
        ],
        ["http_fault /a delay"],
    ),
    "a delay before the body sends the head at once": Row(
        lambda request: Plan("delay", delay=0.5, delay_body=True),
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            ("down", OK_HEAD, 1, [("fwd", D, OK_HEAD)]),
            ("down", BODY, 2, [("hold", D, 2.5)]),
            ("timer", D, 2.5, [("fwd", D, BODY)]),
        ],
        ["http_fault /a delay"],
    ),
    "a slow body paces its bytes": Row(
        lambda request: Plan("slow_body", rate=40),  # 2-byte pieces, 20 a second
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            ("down", OK_HEAD + BODY, 0, [("fwd", D, OK_HEAD + b"he"), ("hold", D, 0.05)]),
            ("timer", D, 0.05, [("fwd", D, b"ll"), ("hold", D, 0.1)]),
            ("timer", D, 0.1, [("fwd", D, b"o")]),
        ],
        ["http_fault /a slow_body"],
    ),
    "a truncate at 0 sends the head and closes": Row(
        lambda request: Plan("truncate", cut=Close, cut_after=0),
        [("up", GET, 0, [("fwd", U, GET)]), ("down", OK, 0, [("fwd", D, OK[:-2]), ("close",)])],
        ["http_fault /a truncate"],
    ),
    "a reset sends the head and its bytes of body, then the RST": Row(
        lambda request: Plan("reset", cut=Reset, cut_after=3),
        [
            ("up", GET, 0, [("fwd", U, GET)]),
            ("down", OK_HEAD + BODY, 0, [("fwd", D, OK_HEAD + b"hel"), ("reset",)]),
            ("down", OK, 0, []),
        ],
        ["http_fault /a reset"],
    ),
    "a header plan rewrites the request's head": Row(
        lambda request: Plan("header", request_head=lambda h: rewrite_head(h, [("X", "1")], set())),
        [("up", GET, 0, [("fwd", U, GET[:-2] + b"X: 1\r\n\r\n")])],
        ["http_fault /a header"],
    ),
    "a response-side fault on a response that never comes is not logged": Row(
        lambda request: Plan("delay", delay=1.0),
        [("up", GET, 0, [("fwd", U, GET)]), ("up_eof", None, 0, [("eof", U)])],
        [],
    ),
    "a session begun mid-response passes the rest, then faults the next request": Row(
        lambda request: Plan("delay", delay=1.0),
        [
            ("down", b"the rest of a body", 0, [("fwd", D, b"the rest of a body")]),
            ("up", GET, 0, [("fwd", U, GET)]),
            ("down", OK, 1, [("hold", D, 2.0)]),
            ("timer", D, 2, [("fwd", D, OK)]),
        ],
        ["http_fault /a delay"],
    ),
    "bytes h11 refuses turn the stream opaque, forwarded as they came": Row(
        passing,
        [
            ("up", b"\x00\x01 not http\r\n\r\n", 0, [("fwd", U, b"\x00\x01 not http\r\n\r\n")]),
            ("up", b"more", 0, [("fwd", U, b"more")]),
        ],
        ["http_opaque upstream"],
    ),
    "a reset plan resets when its request comes; nothing of it is forwarded": Row(
        on_path(b"/b", Plan("reset", reset=True)),
        [("up", GET + GET_B + GET, 0, [("fwd", U, GET), ("reset",)])],
        ["http_fault /b reset"],
    ),
    "a client's abort header answers with its status; the server never sees it": Row(
        client_plan,
        [
            ("up", GET_ABORT_418 + GET, 0, [("inject", D, ANSWER_418), ("fwd", U, GET)]),
            ("down", OK, 0, [("fwd", D, OK)]),
        ],
        ["http_fault /c abort"],
    ),
    "a client's reset header resets the connection": Row(
        client_plan,
        [("up", GET_RESET, 0, [("reset",)])],
        ["http_fault /c reset"],
    ),
    "a client's delay header holds the request back; the header never goes upstream": Row(
        client_plan,
        [
            # What came behind it in the same read waits with it, in order.
            ("up", GET_DELAY_250 + GET, 1, [("hold", U, 1.25)]),
            ("timer", U, 1.1, [("hold", U, 1.25)]),  # woken early: held on
            ("timer", U, 1.25, [("fwd", U, GET_C + GET)]),
            ("down", OK + OK, 2, [("fwd", D, OK + OK)]),
        ],
        ["http_fault /c delay"],
    ),
    "a delayed request's body and the client's end follow it when the time comes": Row(
        on_path(b"/p", Plan("delay", delay_request=0.5)),
        [
            ("up", POST_P[:-2], 0, [("hold", U, 0.5)]),
            ("up", POST_P[-2:], 0.1, []),
            ("up_eof", None, 0.2, []),
            ("timer", U, 0.5, [("fwd", U, POST_P), ("eof", U)]),
            ("down", OK, 1, [("fwd", D, OK)]),
        ],
        ["http_fault /p delay"],
    ),
    "a request-side delay toxic holds the request; its response then passes at once": Row(
        lambda request: HttpDelay(delay=500, before="request").plan(request),
        [
            ("up", GET, 1, [("hold", U, 1.5)]),
            ("timer", U, 1.5, [("fwd", U, GET)]),
            ("down", OK, 1.6, [("fwd", D, OK)]),
        ],
        ["http_fault /a delay"],
    ),
    "a response-side delay toxic forwards the request at once and holds the response": Row(
        lambda request: HttpDelay(delay=500).plan(request),
        [
            ("up", GET, 1, [("fwd", U, GET)]),
            ("down", OK, 1.1, [("hold", D, 1.6)]),
            ("timer", D, 1.6, [("fwd", D, OK)]),
        ],
        ["http_fault /a delay"],
    ),
    "a fault header a client sent unreadable faults nothing and is removed": Row(
        client_plan,
        [
            ("up", GET_DELAY_BAD, 0, [("fwd", U, GET_C)]),
            ("down", OK, 1, [("fwd", D, OK)]),
            # A latin-1 superscript two: a digit to str.isdigit, not to int().
            ("up", GET_DELAY_SUP, 1, [("fwd", U, GET_C)]),
            ("down", OK, 2, [("fwd", D, OK)]),
        ],
    ),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_the_session_table(name: str) -> None:
    row = ROWS[name]
    assert run(row) == row.logged


def test_bytes_behind_an_unanswered_upgrade_are_bounded_and_the_client_held() -> None:
    # Issue 33, 5: they were kept without limit (+308 MB, the client never slowed).
    session = Session(passing)
    session.receive(U, UPGRADE, 0)
    got = session.receive(U, b"x" * (MAX_BUFFER + 1), 0)
    assert [simple(c) for c in got] == [("hold", U, None)]
    assert [simple(c) for c in session.timer(U, 0)] == [("hold", U, None)]
    assert session.buffered <= MAX_BUFFER + 1
    got = session.receive(D, SWITCHED, 0)
    assert [simple(c) for c in got] == [
        ("fwd", U, b"x" * (MAX_BUFFER + 1)),
        ("resume", U),
        ("fwd", D, SWITCHED),
    ]
    assert session.buffered == 0


def test_an_unfinished_head_costs_at_most_max_head_and_nothing_after_the_end() -> None:
    # Issue 33, 5: an unfinished 1 MB head cost 2.4 MB a connection, kept after close.
    session = Session(passing)
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1024 * 1024)
    forwarded = b""
    for i in range(0, len(head), 65536):
        for cmd in session.receive(U, head[i : i + 65536], 0):
            assert isinstance(cmd, Forward)
            forwarded += cmd.data
        # At most one head's bound plus the chunk just read (MAX_HEAD is 64 KiB).
        assert session.buffered <= 64 * 1024 + 65536
    assert forwarded == head  # past MAX_HEAD: opaque, forwarded untouched
    assert session.up is Up.OPAQUE and session.buffered == 0
    session.receive_eof(U, 0)
    session.receive_eof(D, 0)
    assert session.buffered == 0


def test_every_state_has_a_way_out_of_it_in_the_table() -> None:
    # Each stream can end from every state (its end, or the connection's).
    froms = {state for state, _ in TRANSITIONS}
    assert froms == set(Up) | set(Down)
    assert all(
        TRANSITIONS[(s, e)] in (Up.DONE, Down.DONE)
        for s, e in TRANSITIONS
        if e.name in ("END", "ENDED")
    )
