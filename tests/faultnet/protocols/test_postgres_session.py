"""The PostgreSQL session with no socket (faultnet.protocols.postgres): bytes in, commands
out, in tables: startup and SSL negotiation, simple and extended queries paired by
ReadyForQuery, each plan, messages split anywhere, and hostile lengths that cost
nothing."""

from __future__ import annotations

import struct

import pytest

from faultnet.protocols.http import Close, Command, Eof, Forward, Hold, Inject
from faultnet.protocols.postgres import (
    MAX_MESSAGE,
    SUBSTITUTE,
    TRANSITIONS,
    Down,
    PgPlan,
    PgRequest,
    Session,
    Up,
    error_response,
    is_commit,
    is_transaction_start,
    parse_error_response,
)
from tests.faultnet.protocols._playbook import in_chunks

UP, DOWN = "upstream", "downstream"


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def startup(**params: str) -> bytes:
    body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"
    return struct.pack("!II", len(body) + 8, 196608) + body


SSL_REQUEST = struct.pack("!II", 8, 80877103)
GSS_REQUEST = struct.pack("!II", 8, 80877104)
CANCEL = struct.pack("!IIII", 16, 80877102, 42, 7)
STARTUP = startup(user="app", database="db")
AUTH_OK = msg(b"R", struct.pack("!I", 0))


def query(text: str) -> bytes:
    return msg(b"Q", text.encode() + b"\0")


def parse(text: str, name: str = "") -> bytes:
    return msg(b"P", name.encode() + b"\0" + text.encode() + b"\0" + b"\0\0")


def bind(statement: str = "", portal: str = "") -> bytes:
    return msg(b"B", portal.encode() + b"\0" + statement.encode() + b"\0" + b"\0" * 6)


def execute(portal: str = "") -> bytes:
    return msg(b"E", portal.encode() + b"\0" + b"\0\0\0\0")


SYNC, FLUSH = msg(b"S"), msg(b"H")


def ready(status: str) -> bytes:
    return msg(b"Z", status.encode())


ROWS = msg(b"T", b"\0\0") + msg(b"D", b"\0\0") + msg(b"D", b"\0\0") + msg(b"C", b"SELECT 2\0")


class Recorder:
    """A session whose decisions are *plans* (by the first text matching a key, or
    ``startup``), recording every request and every log line."""

    def __init__(self, plans: dict[str, PgPlan] | None = None, refuse_ssl: bool = False):
        self.plans = plans or {}
        self.requests: list[PgRequest] = []
        self.logged: list[dict[str, object]] = []
        self.session = Session(self.decide, self.log, refuse_ssl=refuse_ssl)

    def decide(self, request: PgRequest) -> PgPlan | None:
        self.requests.append(request)
        if request.kind == "startup":
            return self.plans.get("startup")
        for text in request.texts:
            for key, plan in self.plans.items():
                if key in text:
                    return plan
        return None

    def log(self, event: str, **fields: object) -> None:
        self.logged.append({"event": event, **fields})

    def up(self, data: bytes, now: float = 0.0) -> list[Command]:
        return self.session.receive(UP, data, now)

    def down(self, data: bytes, now: float = 0.0) -> list[Command]:
        return self.session.receive(DOWN, data, now)

    def connect(self) -> None:
        """The startup and authentication, passed: the session's status becomes I."""
        assert sent(self.up(STARTUP), UP) == STARTUP
        assert sent(self.down(AUTH_OK + ready("I")), DOWN) == AUTH_OK + ready("I")


def sent(cmds: list[Command], stream: str) -> bytes:
    """The bytes *cmds* send on *stream*, in order (forwarded and injected)."""
    return b"".join(c.data for c in cmds if isinstance(c, Forward | Inject) and c.stream == stream)


ERROR_40001 = error_response("ERROR", "40001", "could not serialize access")
FATAL_57P01 = error_response("FATAL", "57P01", "terminating connection")


# -- passing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "client, server",
    [
        ([query("SELECT 1")], [ROWS + ready("I")]),
        ([parse("SELECT $1") + bind() + msg(b"D", b"P\0") + execute() + SYNC], [ROWS + ready("T")]),
        ([query("COPY t FROM STDIN"), msg(b"d", b"1\n") + msg(b"c")], [msg(b"G", b"\0\0\0")]),
        ([msg(b"F", b"\0\0\0\1")], [msg(b"V", b"\0\0\0\0") + ready("I")]),
        ([msg(b"p", b"secret\0")], [msg(b"N", b"SNOTICE\0\0")]),
        ([parse("SELECT 1") + FLUSH, bind() + execute() + SYNC], [ROWS + ready("I")]),
    ],
    ids=["simple", "extended", "copy", "function call", "password and notice", "flush"],
)
def test_what_no_plan_faults_crosses_byte_identical(
    client: list[bytes], server: list[bytes]
) -> None:
    r = Recorder()
    r.connect()
    assert [sent(r.up(c), UP) for c in client] == client
    assert [sent(r.down(s), DOWN) for s in server] == server


def test_requests_split_at_every_byte_cross_whole_and_are_judged_once() -> None:
    client = query("SELECT 1") + parse("UPDATE t") + bind() + execute() + SYNC
    for cut in range(len(client) + 1):
        r = Recorder()
        r.connect()
        out = sent(r.up(client[:cut]), UP) + sent(r.up(client[cut:]), UP)
        assert out == client, cut
        assert [q.texts for q in r.requests[1:]] == [("SELECT 1",), ("UPDATE t",)], cut
        answers = ROWS + ready("I") + ROWS + ready("I")
        got = b"".join(sent(r.down(answers[i : i + 1]), DOWN) for i in range(len(answers)))
        assert got == answers, cut


def test_requests_carry_their_texts_and_the_status_the_server_last_reported() -> None:
    r = Recorder()
    r.connect()
    r.up(query("BEGIN"))
    r.down(msg(b"C", b"BEGIN\0") + ready("T"))
    r.up(parse("UPDATE a SET x = $1", "s1") + bind("s1", "p1") + execute("p1") + SYNC)
    r.down(ready("T"))
    r.up(bind("s1") + execute() + bind("s1") + execute() + SYNC)  # the statement reused
    r.up(bind("unknown") + execute() + SYNC)  # a statement never seen
    assert [(q.kind, q.texts, q.status) for q in r.requests] == [
        ("startup", (), ""),
        ("query", ("BEGIN",), "I"),
        ("query", ("UPDATE a SET x = $1",), "T"),
        ("query", ("UPDATE a SET x = $1", "UPDATE a SET x = $1"), "T"),
        ("query", (), "T"),
    ]
    assert r.requests[0].params == (("user", "app"), ("database", "db"))


# -- startup and SSL -------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_, answer, up_after, down_after",
    [
        (SSL_REQUEST, b"N", Up.READY, Down.FRAMED),  # no TLS: the startup follows
        (SSL_REQUEST, b"S", Up.OPAQUE, Down.OPAQUE),  # TLS: opaque both ways
        (GSS_REQUEST, b"G", Up.OPAQUE, Down.OPAQUE),
        (GSS_REQUEST, b"N", Up.READY, Down.FRAMED),
    ],
)
def test_an_encryption_request_is_the_servers_to_answer_by_default(
    request_: bytes, answer: bytes, up_after: Up, down_after: Down
) -> None:
    r = Recorder()
    assert sent(r.up(request_), UP) == request_
    # What the client sends before the answer waits for it.
    follow = STARTUP if answer == b"N" else b"\x16\x03\x01 a ClientHello"
    assert sent(r.up(follow), UP) == b""
    cmds = r.down(answer)
    assert sent(cmds, DOWN) == answer and sent(cmds, UP) == follow
    assert (r.session.up, r.session.down) == (up_after, down_after)


def test_ssl_refuse_answers_n_itself_and_the_startup_goes_on() -> None:
    r = Recorder(refuse_ssl=True)
    cmds = r.up(SSL_REQUEST + STARTUP)
    assert cmds[0] == Inject(DOWN, b"N") and sent(cmds, UP) == STARTUP
    assert r.session.up is Up.READY


@pytest.mark.parametrize(
    "first",
    [CANCEL, b"\x16\x03\x01\x02\x00", struct.pack("!II", 8, 0x00020000), struct.pack("!I", 3)],
    ids=["cancel", "direct tls", "protocol 2", "short length"],
)
def test_a_first_packet_that_is_no_startup_turns_the_connection_opaque(first: bytes) -> None:
    r = Recorder()
    assert sent(r.up(first + b"more"), UP) == first + b"more"
    assert (r.session.up, r.session.down) == (Up.OPAQUE, Down.OPAQUE)
    assert sent(r.down(b"anything"), DOWN) == b"anything"
    assert r.requests == []


def test_a_startup_fault_answers_and_closes_the_server_never_sees_it() -> None:
    fatal = error_response("FATAL", "53300", "sorry, too many clients already")
    r = Recorder({"startup": PgPlan("error", {"sqlstate": "53300"}, error=fatal)})
    cmds = r.up(STARTUP)
    assert cmds == [Inject(DOWN, fatal), Close()]
    assert r.logged[0]["event"] == "pg_fault" and r.logged[0]["kind"] == "startup"


#: A session turning opaque (TLS accepted, a cancel, a direct ClientHello) or changing
#: mode (an SSL no, COPY's data) mid-read: each stream's reads in causal order, each
#: read given at every chunk size.
HELLO, SERVER_HELLO = b"\x16\x03\x01\x00\x05hello", b"\x16\x03\x03\x00\x06server"
SWITCH_ROWS: dict[str, list[tuple[str, bytes]]] = {
    "TLS accepted, the ClientHello early": [(UP, SSL_REQUEST + HELLO), (DOWN, b"S" + SERVER_HELLO)],
    "GSS accepted": [(UP, GSS_REQUEST), (DOWN, b"G" + SERVER_HELLO), (UP, HELLO)],
    "an SSL no, the startup early": [
        (UP, SSL_REQUEST + STARTUP), (DOWN, b"N" + AUTH_OK + ready("I")),
        (UP, query("SELECT 1")), (DOWN, ROWS + ready("I")),
    ],
    "a cancel": [(UP, CANCEL + b"more"), (DOWN, b"whatever the server says")],
    "a cancel, a server that spoke first": [
        (DOWN, b"E\0\0"), (UP, CANCEL + b"more"), (DOWN, b"\0\x09 says"),
    ],
    "a direct ClientHello": [(UP, HELLO + HELLO), (DOWN, SERVER_HELLO)],
    "COPY in": [
        (UP, STARTUP), (DOWN, AUTH_OK + ready("I")),
        (UP, query("COPY t FROM STDIN")), (DOWN, msg(b"G", b"\0\0\0")),
        (UP, msg(b"d", b"1\n") + msg(b"d", b"22\n") + msg(b"c") + query("SELECT 1")),
        (DOWN, msg(b"C", b"COPY 2\0") + ready("I") + ROWS + ready("I")),
    ],
    "COPY out": [
        (UP, STARTUP + query("COPY t TO STDOUT") + query("SELECT 1")),
        (DOWN, AUTH_OK + ready("I") + msg(b"H", b"\0\0\0") + msg(b"d", b"1\n") + msg(b"c")
         + msg(b"C", b"COPY 1\0") + ready("I") + ROWS + ready("I")),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", list(SWITCH_ROWS))
def test_a_stream_switching_mid_read_keeps_every_byte_in_order_at_every_chunk_size(
    name: str,
) -> None:
    reads = SWITCH_ROWS[name]
    for size in range(1, max(len(data) for _, data in reads) + 1):
        r = Recorder()
        came = {UP: b"", DOWN: b""}
        out = {UP: b"", DOWN: b""}
        for stream, data in reads:
            for chunk in in_chunks(data, size):
                came[stream] += chunk
                cmds = r.session.receive(stream, chunk, 0.0)
                out[UP] += sent(cmds, UP)
                out[DOWN] += sent(cmds, DOWN)
                # Opaque: all that came has gone on, nothing kept behind.
                if r.session.up is Up.OPAQUE:
                    assert out[UP] == came[UP], (size, stream)
                if r.session.down is Down.OPAQUE:
                    assert out[DOWN] == came[DOWN], (size, stream)
        assert out == came, size


# -- the plans -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_, status",
    [
        (query("UPDATE t SET v = 1"), "E"),  # inside a transaction block
        (parse("UPDATE t SET v = $1") + bind() + execute() + SYNC, "E"),
        (query("UPDATE t SET v = 1"), "I"),  # outside
    ],
    ids=["simple", "extended", "outside a transaction"],
)
def test_an_error_swaps_the_request_and_answers_before_the_servers_own_ready(
    request_: bytes, status: str
) -> None:
    r = Recorder({"UPDATE": PgPlan("error", {}, error=ERROR_40001)})
    r.connect()
    cmds = r.up(request_)
    assert sent(cmds, UP) == query(SUBSTITUTE)
    server_error = error_response("ERROR", "22P02", "invalid input syntax")
    cmds = r.down(msg(b"N", b"Sa notice\0\0") + server_error + ready(status))
    # The server's own answer is swallowed, a notice still crosses, its ready ends it.
    assert sent(cmds, DOWN) == msg(b"N", b"Sa notice\0\0") + ERROR_40001 + ready(status)
    assert r.session.status == status
    # The next request is judged afresh and passed.
    assert sent(r.up(query("SELECT 1")), UP) == query("SELECT 1")
    assert sent(r.down(ROWS + ready(status)), DOWN) == ROWS + ready(status)


def test_a_commit_fault_sends_rollback_upstream() -> None:
    plan = PgPlan("error", {}, error=ERROR_40001, substitute="ROLLBACK")
    r = Recorder({"COMMIT": plan})
    r.connect()
    assert sent(r.up(query("COMMIT")), UP) == query("ROLLBACK")
    cmds = r.down(msg(b"C", b"ROLLBACK\0") + ready("I"))
    assert sent(cmds, DOWN) == ERROR_40001 + ready("I")


def test_a_fatal_answers_at_once_and_closes_the_request_never_forwarded() -> None:
    r = Recorder({"SELECT 2": PgPlan("fatal", {}, error=FATAL_57P01)})
    r.connect()
    cmds = r.up(query("SELECT 2") + query("SELECT 3"))
    assert cmds == [Inject(DOWN, FATAL_57P01), Close()]
    assert (r.session.up, r.session.down) == (Up.DONE, Down.DONE)
    assert r.up(query("SELECT 4")) == [] and r.down(b"late") == []


def test_a_delay_holds_the_request_and_what_follows_then_forwards_them_in_order() -> None:
    r = Recorder({"slow": PgPlan("delay", {}, delay=0.25)})
    r.connect()
    cmds = r.up(query("SELECT 1") + query("slow") + query("SELECT 3"), now=10.0)
    assert sent(cmds, UP) == query("SELECT 1") and cmds[-1] == Hold(UP, 10.25)
    assert r.session.timer(UP, 10.1) == [Hold(UP, 10.25)]  # too early: still held
    cmds = r.session.timer(UP, 10.25)
    assert sent(cmds, UP) == query("slow") + query("SELECT 3")


def test_a_hold_forwards_nothing_more_and_ends_when_both_sides_have() -> None:
    r = Recorder({"stuck": PgPlan("hold")})
    r.connect()
    assert sent(r.up(query("stuck") + query("SELECT 2")), UP) == b""
    assert sent(r.up(query("SELECT 3")), UP) == b""
    assert r.session.receive_eof(UP, 1.0) == []  # the client gave up: the server not told
    assert r.session.receive_eof(DOWN, 2.0) == [Close()]


@pytest.mark.parametrize(
    "rows, expected",
    [
        (0, msg(b"T", b"\0\0")),
        (1, msg(b"T", b"\0\0") + msg(b"D", b"\0\0")),
        (2, msg(b"T", b"\0\0") + msg(b"D", b"\0\0") * 2),  # all the rows, never the end
        (9, msg(b"T", b"\0\0") + msg(b"D", b"\0\0") * 2),
    ],
)
def test_close_cuts_the_result_after_its_rows(rows: int, expected: bytes) -> None:
    r = Recorder({"SELECT": PgPlan("close", {"rows": rows}, rows=rows)})
    r.connect()
    assert sent(r.up(query("SELECT 2 rows")), UP) == query("SELECT 2 rows")
    cmds = r.down(ROWS + ready("I"))
    assert sent(cmds, DOWN) == expected and cmds[-1] == Close()


def test_pipelined_requests_pair_with_their_answers_in_order() -> None:
    r = Recorder({"bad": PgPlan("error", {}, error=ERROR_40001)})
    r.connect()
    client = query("SELECT 1") + query("bad") + parse("SELECT 3") + bind() + execute() + SYNC
    r.up(client)
    answers = ROWS + ready("I") + error_response("ERROR", "22P02", "x") + ready("I")
    answers += ROWS + ready("I")
    assert sent(r.down(answers), DOWN) == ROWS + ready("I") + ERROR_40001 + ready("I") + ROWS + (
        ready("I")
    )


def test_a_faulted_request_is_logged_once_with_its_statement() -> None:
    plan = PgPlan("error", {"sqlstate": "40001", "severity": "ERROR"}, error=ERROR_40001)
    r = Recorder({"UPDATE": plan})
    r.connect()
    r.up(query("UPDATE t SET v = 1"))
    assert r.logged == [
        {
            "event": "pg_fault",
            "action": "error",
            "kind": "query",
            "query": "UPDATE t SET v = 1",
            "sqlstate": "40001",
            "severity": "ERROR",
        }
    ]


# -- bounds ----------------------------------------------------------------------------


def test_a_hostile_length_allocates_nothing_and_streams() -> None:
    r = Recorder()
    r.connect()
    huge = b"Q" + struct.pack("!I", 0x7FFFFFF0) + b"x" * 1000
    assert sent(r.up(huge), UP) == huge
    assert r.session.buffered < 100
    more = b"y" * 5000
    assert sent(r.up(more), UP) == more  # the rest of it, counted, not kept
    down = b"D" + struct.pack("!I", 0x7FFFFFF0) + b"z" * 1000
    assert sent(r.down(down), DOWN) == down and r.session.buffered < 100


def test_a_query_longer_than_the_bound_passes_unjudged() -> None:
    r = Recorder({"x": PgPlan("error", {}, error=ERROR_40001)})
    r.connect()
    long = query("x" * MAX_MESSAGE)
    out = sent(r.up(long[:1000]), UP) + sent(r.up(long[1000:]), UP)
    assert out == long and len(r.requests) == 1  # the startup only
    assert sent(r.down(ready("I")), DOWN) == ready("I")


def test_a_batch_past_its_bound_streams_unjudged() -> None:
    r = Recorder({"x": PgPlan("error", {}, error=ERROR_40001)})
    r.connect()
    big = parse("x" * 200_000) * 6 + bind() + execute() + SYNC
    assert sent(r.up(big), UP) == big and len(r.requests) == 1
    assert r.session.buffered <= 2 * 1024 * 1024


# -- the table and the helpers ---------------------------------------------------------


def test_every_state_can_end_and_every_transition_is_to_a_state_of_its_stream() -> None:
    from faultnet.protocols.postgres import Ev

    for (state, _), to in TRANSITIONS.items():
        assert type(state) is type(to)
    for state in [*Up, *Down]:
        assert (state, Ev.END) in TRANSITIONS and (state, Ev.ENDED) in TRANSITIONS


@pytest.mark.parametrize(
    "text, commit, start",
    [
        ("COMMIT", True, False),
        ("commit;", True, False),
        ("END TRANSACTION", True, False),
        ("COMMIT PREPARED 'x'", False, False),
        ("BEGIN ISOLATION LEVEL SERIALIZABLE", False, True),
        ("start transaction", False, True),
        ("SELECT 1", False, False),
        ("", False, False),
    ],
)
def test_commit_and_transaction_start(text: str, commit: bool, start: bool) -> None:
    assert (is_commit(text), is_transaction_start(text)) == (commit, start)


def test_an_error_response_reads_back_field_by_field() -> None:
    data = error_response("FATAL", "57P01", "bye ünïcode")
    assert data[:1] == b"E" and struct.unpack("!I", data[1:5])[0] == len(data) - 1
    assert parse_error_response(data) == {
        "S": "FATAL",
        "V": "FATAL",
        "C": "57P01",
        "M": "bye ünïcode",
    }


def test_the_end_of_each_stream_is_passed_on() -> None:
    r = Recorder()
    r.connect()
    assert r.session.receive_eof(UP, 0.0)[-1] == Eof(UP)
    assert r.session.receive_eof(DOWN, 0.0)[-1] == Eof(DOWN)
