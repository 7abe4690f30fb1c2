"""The enclave's command engine by tables: lines in, lines, closes and events out.

No sockets and no event loop: each row feeds :class:`~harness.enclave._engine.Engine`
the lines of one or more connections and names what one connection must get back. The
registry is a real one in a temporary directory (the engine is handed it, as the server
does).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.irc import LineTooLong
from harness.enclave import Registry
from harness.enclave._engine import Close, Engine, Event, Output, Send

WALL = 1_700_000_000.0  # a fixed wall clock: 2023-11-14T22:13:20Z


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path)
    yield reg
    reg.close()


def make_engine(registry: Registry) -> Engine:
    eng = Engine(registry, clock=lambda: WALL, started_wall=WALL)
    for conn in (1, 2, 3):
        eng.connect(conn, "127.0.0.1", 40000 + conn)
    return eng


def feed(eng: Engine, script: list[tuple[int, str]]) -> list[Output]:
    out: list[Output] = []
    for conn, line in script:
        out += eng.receive(conn, line)
    return out


def lines_to(out: list[Output], conn: int) -> list[str]:
    return [o.line for o in out if isinstance(o, Send) and o.conn == conn]


def guest(conn: int, nick: str) -> list[tuple[int, str]]:
    return [(conn, f"NICK {nick}"), (conn, f"USER {nick} 0 * :{nick} here")]


def sasl(conn: int, nick: str, token: str) -> list[tuple[int, str]]:
    blob = base64.b64encode(f"{nick}\0{nick}\0{token}".encode()).decode()
    return [
        (conn, "CAP LS 302"),
        (conn, "CAP REQ :sasl"),
        (conn, f"NICK {nick}"),
        (conn, f"USER {nick} 0 * :{nick}"),
        (conn, "AUTHENTICATE PLAIN"),
        (conn, f"AUTHENTICATE {blob}"),
        (conn, "CAP END"),
    ]


# (what it shows, the script, whose lines, lines that must be among them in this order;
# [] means the script's last line gives that connection nothing)
ROWS: list[tuple[str, list[tuple[int, str]], int, list[str]]] = [
    (
        "a guest registers with NICK and USER and is welcomed",
        guest(1, "alice"),
        1,
        [":enclave 001 alice :Welcome to the enclave network, alice!alice@127.0.0.1"],
    ),
    (
        "a command before registration gets 451",
        [(1, "JOIN #c")],
        1,
        [":enclave 451 * :You have not registered"],
    ),
    (
        "an unknown command gets 421",
        [*guest(1, "alice"), (1, "FROB x")],
        1,
        [":enclave 421 alice FROB :Unknown command"],
    ),
    (
        "PING is answered with its token",
        [(1, "PING tok")],
        1,
        [":enclave PONG enclave :tok"],
    ),
    (
        "PING without an origin gets 409",
        [(1, "PING")],
        1,
        [":enclave 409 * :No origin specified"],
    ),
    (
        "a nick in use is refused to a guest",
        [*guest(1, "alice"), (2, "NICK Alice")],
        2,
        [":enclave 433 * Alice :Nickname is already in use"],
    ),
    (
        "a channel message reaches the other members, not the sender",
        [
            *guest(1, "alice"),
            *guest(2, "bob"),
            (1, "JOIN #c"),
            (2, "JOIN #c"),
            (1, "PRIVMSG #c :hi all"),
        ],
        2,
        [":bob!bob@127.0.0.1 JOIN :#c", ":alice!alice@127.0.0.1 PRIVMSG #c :hi all"],
    ),
    (
        "echo-message sends the sender its own message back",
        [
            (1, "CAP REQ :echo-message"),
            (1, "CAP END"),
            *guest(1, "alice"),
            (1, "JOIN #c"),
            (1, "PRIVMSG #c :me too"),
        ],
        1,
        [":alice!alice@127.0.0.1 PRIVMSG #c :me too"],
    ),
    (
        "server-time and message-tags stamp what a capable client receives",
        [
            *guest(1, "alice"),
            (2, "CAP REQ :server-time message-tags"),
            (2, "CAP END"),
            *guest(2, "bob"),
            (1, "JOIN #c"),
            (2, "JOIN #c"),
            (1, "@+x=1 PRIVMSG #c :tagged"),
        ],
        2,
        [
            "@+x=1;msgid=enc-1;time=2023-11-14T22:13:20.000Z :alice!alice@127.0.0.1 PRIVMSG #c :tagged"
        ],
    ),
    (
        "a message to a channel one is not on gets 404",
        [*guest(1, "alice"), *guest(2, "bob"), (2, "JOIN #c"), (1, "PRIVMSG #c :let me in")],
        1,
        [":enclave 404 alice #c :Cannot send to channel"],
    ),
    (
        "a NOTICE to nobody provokes no reply",
        [*guest(1, "alice"), (1, "NOTICE nobody :psst")],
        1,
        [],
    ),
    (
        "a private message reaches its nick",
        [*guest(1, "alice"), *guest(2, "bob"), (1, "PRIVMSG bob :psst")],
        2,
        [":alice!alice@127.0.0.1 PRIVMSG bob :psst"],
    ),
    (
        "QUIT tells the channel's other members",
        [*guest(1, "alice"), *guest(2, "bob"), (1, "JOIN #c"), (2, "JOIN #c"), (1, "QUIT :bye")],
        2,
        [":alice!alice@127.0.0.1 QUIT :Quit: bye"],
    ),
    (
        "EnclaveServ refuses SPAWN from a guest",
        [*guest(1, "alice"), (1, "PRIVMSG EnclaveServ :SPAWN w1 60")],
        1,
        [
            ":EnclaveServ!service@enclave NOTICE alice :ERROR SPAWN w1 NOT_ALLOWED :only an authenticated leader may spawn or revoke"
        ],
    ),
]


@pytest.mark.parametrize(
    ("script", "conn", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_engine_table(
    registry: Registry, script: list[tuple[int, str]], conn: int, expected: list[str]
) -> None:
    eng = make_engine(registry)
    before = feed(eng, script[:-1])
    last = feed(eng, script[-1:])
    got = lines_to(before + last, conn)
    if not expected:  # the last line provokes nothing for *conn*
        assert lines_to(last, conn) == []
        return
    # The expected lines appear in this order (other lines may come between them).
    it = iter(got)
    for want in expected:
        assert any(g == want for g in it), f"{want!r} not in order in {got!r}"


def test_an_over_long_line_gets_417(registry: Registry) -> None:
    eng = make_engine(registry)
    out = eng.receive(1, LineTooLong(9000))
    assert lines_to(out, 1) == [":enclave 417 * :Input line was too long"]


def test_a_leader_spawns_and_the_worker_logs_in_with_sasl(registry: Registry) -> None:
    token = registry.mint_leader("lead")
    eng = make_engine(registry)
    out = feed(eng, [*sasl(1, "lead", token), (1, "PRIVMSG EnclaveServ :SPAWN w1 60")])
    spawned = [ln for ln in lines_to(out, 1) if " :SPAWNED w1 " in ln]
    assert len(spawned) == 1, lines_to(out, 1)
    worker_token = spawned[0].split()[-2]
    out = feed(eng, sasl(2, "w1", worker_token))
    assert any(ln.startswith(":enclave 903 ") for ln in lines_to(out, 2))
    assert any(ln.startswith(":enclave 001 w1 ") for ln in lines_to(out, 2))
    registered = [o for o in out if isinstance(o, Event) and o.name == "registered"]
    assert registered and registered[0].fields["auth"] == "sasl"


def test_a_registered_nick_without_credentials_is_refused_and_closed(registry: Registry) -> None:
    registry.mint_leader("lead")
    eng = make_engine(registry)
    out = feed(eng, guest(1, "lead"))
    assert any(ln.startswith(":enclave 464 * :Password incorrect") for ln in lines_to(out, 1))
    assert (
        "ERROR :Closing Link: 127.0.0.1 (Bad credentials: lead is a registered bot"
        in (lines_to(out, 1)[-1])
    )
    assert Close(1, True) in out
    assert eng.sessions[1].closing


def test_revoking_a_worker_closes_its_live_connection(registry: Registry) -> None:
    token = registry.mint_leader("lead")
    eng = make_engine(registry)
    out = feed(eng, [*sasl(1, "lead", token), (1, "PRIVMSG EnclaveServ :SPAWN w1 60")])
    worker_token = next(ln for ln in lines_to(out, 1) if " :SPAWNED " in ln).split()[-2]
    feed(eng, sasl(2, "w1", worker_token))
    out = feed(eng, [(1, "PRIVMSG EnclaveServ :REVOKE w1")])
    assert any(ln.endswith(":REVOKED w1") for ln in lines_to(out, 1))
    assert lines_to(out, 2) == ["ERROR :Closing Link: 127.0.0.1 (Revoked)"]
    assert Close(2, True) in out


def test_a_ghost_is_replaced_by_its_authenticated_owner(registry: Registry) -> None:
    token = registry.mint_leader("lead")
    eng = make_engine(registry)
    feed(eng, sasl(1, "lead", token))
    out = feed(eng, sasl(2, "lead", token))
    assert lines_to(out, 1)[-1].startswith("ERROR :Closing Link: 127.0.0.1 (Ghost replaced")
    assert eng.by_nick["lead"] is eng.sessions[2]


def test_a_closing_session_takes_no_more_lines(registry: Registry) -> None:
    eng = make_engine(registry)
    feed(eng, [*guest(1, "alice"), (1, "QUIT")])
    assert eng.receive(1, "PING again") == []
    assert eng.close_conn(1, "again") == []  # idempotent
