"""The HTTP/2 session (faultnet.protocols.http2) with no socket: real h2 endpoints (a
client and a server ``H2Connection``) make the bytes, the session sits between them,
and each row checks the commands and what each endpoint then reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import pytest
from hyperframe.frame import DataFrame, Frame

from faultnet.protocols.http import Command, Eof, Forward, Hold, Inject, Resume
from faultnet.protocols.http import Session as Http1Session
from faultnet.protocols.http2 import (
    PREFACE,
    TRANSITIONS,
    H2Request,
    Session,
    St,
    StreamPlan,
    grpc_answer,
    is_preface,
)
from faultnet.protocols.http_front import Front

U, D = "upstream", "downstream"
GRPC = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Echo/Say"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def endpoint(client: bool) -> h2.connection.H2Connection:
    config = h2.config.H2Configuration(client_side=client, header_encoding="utf-8")
    return h2.connection.H2Connection(config)


@dataclass
class Pair:
    """A client and a server endpoint with the session between them."""

    decide: Callable[[H2Request], StreamPlan | None]
    client: h2.connection.H2Connection = field(default_factory=lambda: endpoint(True))
    server: h2.connection.H2Connection = field(default_factory=lambda: endpoint(False))
    log: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    at_client: list[h2.events.Event] = field(default_factory=list)
    at_server: list[h2.events.Event] = field(default_factory=list)
    wire_up: bytearray = field(default_factory=bytearray)
    wire_down: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.session = Session(self.decide, lambda e, **f: self.log.append((e, f)))
        self.client.initiate_connection()
        self.server.initiate_connection()

    def carry(self, cmds: list[Command]) -> list[Command]:
        """Deliver Forward and Inject; return the rest."""
        rest = []
        for cmd in cmds:
            if isinstance(cmd, Forward | Inject) and cmd.stream == U:
                self.wire_up += cmd.data
                self.at_server += self.server.receive_data(cmd.data)
            elif isinstance(cmd, Forward | Inject):
                self.wire_down += cmd.data
                self.at_client += self.client.receive_data(cmd.data)
            else:
                rest.append(cmd)
        return rest

    def up(self, now: float = 0.0) -> list[Command]:
        return self.carry(self.session.receive(U, self.client.data_to_send(), now))

    def down(self, now: float = 0.0) -> list[Command]:
        return self.carry(self.session.receive(D, self.server.data_to_send(), now))

    def handshake(self) -> None:
        """Both prefaces and their ACKs across."""
        sent = self.client.data_to_send()
        assert self.carry(self.session.receive(U, sent, 0)) == []
        assert self.down() == []
        assert self.up() == []
        assert self.down() == []
        self.wire_up.clear()
        self.wire_down.clear()

    def request(self, sid: int, body: bytes = b"", headers: list[tuple[str, str]] = GRPC) -> None:
        self.client.send_headers(sid, headers, end_stream=not body)
        if body:
            self.client.send_data(sid, body, end_stream=True)

    def respond(self, sid: int, body: bytes) -> None:
        self.server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        self.server.send_data(sid, body)
        self.server.send_headers(sid, [("grpc-status", "0")], end_stream=True)

    def kinds(self, side: str) -> list[str]:
        events = self.at_client if side == "client" else self.at_server
        return [type(e).__name__ for e in events if not isinstance(e, h2.events.WindowUpdated)]


def passing(request: H2Request) -> StreamPlan | None:
    return None


def on_path(path: str, plan: StreamPlan) -> Callable[[H2Request], StreamPlan | None]:
    return lambda r: plan if r.target == path.encode() else None


def test_a_session_that_faults_nothing_forwards_every_byte_as_it_came() -> None:
    pair = Pair(passing)
    pair.handshake()
    pair.request(1, b"\0\0\0\0\x02hi")
    client_bytes = pair.client.data_to_send()
    for i in range(len(client_bytes)):  # one byte at a time: every frame cut
        assert pair.carry(pair.session.receive(U, client_bytes[i : i + 1], 0)) == []
    assert bytes(pair.wire_up) == client_bytes
    pair.server.clear_outbound_data_buffer()
    pair.at_server.clear()
    pair.respond(1, b"\0\0\0\0\x02ok")
    server_bytes = pair.server.data_to_send()
    pair.carry(pair.session.receive(D, server_bytes, 0))
    assert bytes(pair.wire_down) == server_bytes
    assert pair.kinds("client")[-3:] == ["DataReceived", "TrailersReceived", "StreamEnded"]
    assert pair.log == []


def test_the_preface_is_known_from_its_first_byte_and_refused_at_its_first_difference() -> None:
    assert is_preface(b"") is None
    assert is_preface(PREFACE[:5]) is None
    assert is_preface(PREFACE) is True
    assert is_preface(b"PRI * HTTP/1.1\r\n") is False
    assert is_preface(b"GET / HTTP/1.1\r\n") is False


def test_an_aborted_grpc_call_is_answered_after_the_servers_settings_and_never_forwarded() -> None:
    plan = StreamPlan("grpc_status", answer=grpc_answer("UNAVAILABLE", "down 100%"))
    pair = Pair(on_path("/pkg.Echo/Say", plan))
    sent = pair.client.data_to_send()
    pair.request(1, b"\0\0\0\0\x02hi")
    sent += pair.client.data_to_send()
    # The call comes before the server spoke: the answer waits for its SETTINGS.
    assert pair.carry(pair.session.receive(U, sent, 0)) == []
    assert pair.at_client == []
    pair.down()
    kinds = pair.kinds("client")
    assert kinds[0] == "RemoteSettingsChanged"
    assert {"ResponseReceived", "StreamEnded"} <= set(kinds), kinds
    response = next(e for e in pair.at_client if isinstance(e, h2.events.ResponseReceived))
    assert dict(response.headers)["grpc-status"] == "14"
    assert dict(response.headers)["grpc-message"] == "down 100%25"
    # The client's DATA never reached the server; its window was given back.
    assert not any(isinstance(e, h2.events.RequestReceived) for e in pair.at_server)
    updates = [e for e in pair.at_client if isinstance(e, h2.events.WindowUpdated)]
    assert [(e.stream_id, e.delta) for e in updates] == [(0, 7)]
    assert [(e, f["action"], f["stream_id"]) for e, f in pair.log] == [
        ("http_fault", "grpc_status", 1)
    ]


def test_after_a_dropped_block_changed_the_table_later_blocks_are_re_encoded() -> None:
    pair = Pair(on_path("/pkg.Echo/Say", StreamPlan("hold", hold=True)))
    pair.handshake()
    pair.request(1)  # its block adds fields to the client's table: the server never sees it
    assert pair.up() == []
    assert pair.session.streams[1].state is St.HELD
    pair.request(3, headers=[*GRPC[:2], (":path", "/pkg.Echo/Other"), *GRPC[3:]])
    sent = pair.client.data_to_send()
    pair.carry(pair.session.receive(U, sent, 0))
    assert bytes(pair.wire_up) != sent  # re-encoded: its indices name entries the server lacks
    received = [e for e in pair.at_server if isinstance(e, h2.events.RequestReceived)]
    assert [(e.stream_id, dict(e.headers)[":path"]) for e in received] == [(3, "/pkg.Echo/Other")]
    assert dict(received[0].headers)["te"] == "trailers"


def test_a_dropped_block_that_changed_no_table_leaves_later_bytes_untouched() -> None:
    pair = Pair(lambda r: StreamPlan("hold", hold=True) if r.stream_id == 3 else None)
    pair.handshake()
    pair.request(1)
    pair.up()
    pair.request(3)  # the same call again: all indexed from the table block 1 filled
    pair.up()
    assert pair.session.streams[3].state is St.HELD
    pair.request(5)
    sent = pair.client.data_to_send()
    pair.wire_up.clear()
    pair.carry(pair.session.receive(U, sent, 0))
    assert bytes(pair.wire_up) == sent


@pytest.mark.parametrize(
    ("plan", "frame", "code"),
    [
        (StreamPlan("rst_stream", rst=7), h2.events.StreamReset, 7),
        (StreamPlan("goaway", goaway=0), h2.events.ConnectionTerminated, 0),
    ],
)
def test_a_reset_or_goaway_reaches_the_client_and_the_request_not_the_server(
    plan: StreamPlan, frame: type[h2.events.Event], code: int
) -> None:
    pair = Pair(on_path("/b", plan))
    pair.handshake()
    pair.request(1, headers=[*GRPC[:2], (":path", "/a"), *GRPC[3:]])
    pair.request(3, headers=[*GRPC[:2], (":path", "/b"), *GRPC[3:]])
    pair.request(5, headers=[*GRPC[:2], (":path", "/c"), *GRPC[3:]])
    pair.up()
    seen = [e.stream_id for e in pair.at_server if isinstance(e, h2.events.RequestReceived)]
    assert seen == ([1] if plan.goaway is not None else [1, 5])
    event = next(e for e in pair.at_client if isinstance(e, frame))
    assert event.error_code == code
    if isinstance(event, h2.events.ConnectionTerminated):
        assert event.last_stream_id == 1
        assert pair.session.streams[5].state is St.REFUSED  # nothing new goes after it
    else:
        assert pair.session.streams[5].state is St.OPEN


def test_a_delay_holds_the_response_headers_until_their_time() -> None:
    pair = Pair(on_path("/pkg.Echo/Say", StreamPlan("delay", delay=0.25)))
    pair.handshake()
    pair.request(1)
    pair.up()
    pair.respond(1, b"\0\0\0\0\x02ok")
    assert pair.down(now=10.0) == [Hold(D, 10.25)]
    assert pair.log == []  # logged when it takes effect
    assert pair.carry(pair.session.timer(D, 10.1)) == [Hold(D, 10.25)]
    assert pair.carry(pair.session.timer(D, 10.25)) == []
    assert pair.kinds("client")[-4:] == [
        "ResponseReceived",
        "DataReceived",
        "TrailersReceived",
        "StreamEnded",
    ]
    assert [f["action"] for _, f in pair.log] == ["delay"]


def test_a_slow_body_paces_the_data_in_pieces_and_keeps_its_flags() -> None:
    pair = Pair(on_path("/pkg.Echo/Say", StreamPlan("slow_body", rate=200)))
    pair.handshake()
    pair.request(1)
    pair.up()
    pair.server.send_headers(1, [(":status", "200")])
    pair.server.send_data(1, b"x" * 25, end_stream=True)
    assert pair.down(now=0.0) == [Hold(D, 0.05)]  # 10 bytes (200/20) went, due at 10/200 s
    assert pair.carry(pair.session.timer(D, 0.05)) == [Hold(D, 0.1)]
    assert pair.carry(pair.session.timer(D, 0.1)) == []
    data = [e for e in pair.at_client if isinstance(e, h2.events.DataReceived)]
    assert [len(e.data) for e in data] == [10, 10, 5]
    assert isinstance(pair.at_client[-1], h2.events.StreamEnded)


def test_bytes_that_are_not_http2_after_the_preface_pass_as_they_come() -> None:
    session = Session(passing, lambda e, **f: None)
    assert session.receive(U, PREFACE + b"\0\0\x05", 0) == [Forward(U, PREFACE, 0)]
    # A frame length over the receiver's frame size (16,384): opaque from here.
    rest = b"\x00\x00\x00\x00\x00\x00\x00"
    assert session.receive(U, b"\0" + rest, 0) == [Forward(U, b"\0\0\x05\0" + rest, 0)]
    assert session.receive(U, b"more", 0) == [Forward(U, b"more", 0)]
    assert session.receive_eof(U, 0) == [Eof(U)]


def test_oversized_frames_turn_the_direction_opaque() -> None:
    session = Session(passing)
    big = DataFrame(1, data=b"x" * 20_000).serialize()
    assert session.receive(U, PREFACE + big, 0) == [Forward(U, PREFACE + big, 0)]


def test_every_stream_state_is_reached_from_new_by_one_event() -> None:
    reached = {to for (state, _), to in TRANSITIONS.items() if state is St.NEW}
    assert reached == set(St) - {St.NEW}


# -- which HTTP: the front -------------------------------------------------------------


def fronted() -> tuple[Front, list[str]]:
    made: list[str] = []

    def one() -> Http1Session:
        made.append("http/1.1")
        return Http1Session(lambda r: None)

    def two() -> Session:
        made.append("h2")
        return Session(passing)

    return Front(one, two), made


def test_the_front_waits_for_the_whole_preface_then_runs_http2() -> None:
    front, made = fronted()
    assert front.receive(U, PREFACE[:10], 0) == []
    assert made == []
    assert front.receive(U, PREFACE[10:], 0) == [Forward(U, PREFACE, 0)]
    assert made == ["h2"]


def test_the_front_runs_http1_at_the_first_byte_that_is_not_the_preface() -> None:
    front, made = fronted()
    got = front.receive(U, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0)
    assert made == ["http/1.1"]
    assert got == [Forward(U, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0)]


def test_a_server_settings_that_comes_first_is_held_until_the_client_speaks() -> None:
    front, made = fronted()
    settings = endpoint(False)
    settings.initiate_connection()
    first = settings.data_to_send()
    assert front.receive(D, first, 0) == [Hold(D, None)]
    assert front.receive(U, PREFACE, 0) == [Forward(U, PREFACE, 0), Resume(D)]
    assert front.timer(D, 0) == [Forward(D, first, 0)]
    assert made == ["h2"]


def test_a_server_that_speaks_http1_first_makes_the_connection_http1() -> None:
    front, made = fronted()
    got = front.receive(D, b"HTTP/1.1 408 Request Timeout\r\n\r\n", 0)
    assert made == ["http/1.1"]
    assert got == [Forward(D, b"HTTP/1.1 408 Request Timeout\r\n\r\n", 0)]
    assert Frame  # hyperframe's parser made the frames above: none are hand-built


def test_a_delay_before_the_body_sends_the_headers_and_holds_the_data() -> None:
    pair = Pair(on_path("/pkg.Echo/Say", StreamPlan("delay", delay=0.5, delay_body=True)))
    pair.handshake()
    pair.request(1)
    pair.up()
    pair.respond(1, b"\0\0\0\0\x02ok")
    assert pair.down(now=3.0) == [Hold(D, 3.5)]
    assert pair.kinds("client")[-1] == "ResponseReceived"
    assert pair.carry(pair.session.timer(D, 3.5)) == []
    assert pair.kinds("client")[-3:] == ["DataReceived", "TrailersReceived", "StreamEnded"]


def test_answers_piling_up_behind_a_delay_stop_the_client_being_read() -> None:
    # A client that sends request after request to be answered while a delay holds the
    # queue to it: past MAX_BUFFER of answers, its stream is not read until they drain.
    def decide(request: H2Request) -> StreamPlan:
        if request.stream_id == 1:
            return StreamPlan("delay", delay=1.0)
        return StreamPlan("abort", answer=[(":status", "503"), ("x-pad", "p" * 5000)])

    pair = Pair(decide)
    pair.handshake()
    pair.request(1)
    pair.up()
    pair.respond(1, b"ok")
    assert pair.down(now=0.0) == [Hold(D, 1.0)]
    held: list[Command] = []
    sid = 3
    while not held:
        pair.request(sid)
        held = pair.up()
        sid += 2
        assert sid < 150, "never stopped reading the client"
    assert held == [Hold(U, None)]
    assert pair.session.buffered <= 2 * 64 * 1024
    drained = pair.carry(pair.session.timer(D, 1.0))
    assert drained == [Resume(U)]
    assert pair.carry(pair.session.timer(U, 1.0)) == []
