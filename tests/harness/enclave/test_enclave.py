"""The enclave server against raw IRC sessions on real loopback sockets.

Each test runs the server in-process (trio nursery, port 0) with its own state directory
and talks to it with :class:`Raw`, a line-level client that sends exactly what it is
told, so the tests see the wire, not a library's interpretation of it.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from drivers.irc import MAX_LINE, LineBuffer, LineTooLong
from harness.enclave import (
    QUOTA,
    EnclaveServer,
    FloodLimits,
    Registry,
    format_line,
    open_server,
    parse_line,
    read_events,
)
from tests.conftest import run_module

T = 5.0  # bound for any single expected reply on loopback


class Raw:
    """A minimal IRC client: send lines verbatim, read lines, wait for a pattern."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self._buf = b""
        self.eof = False

    async def send(self, *lines: str) -> None:
        await self.stream.send_all(b"".join(line.encode() + b"\r\n" for line in lines))

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            return
        self._buf += data
        *done, self._buf = self._buf.split(b"\r\n")
        self.lines.extend(d.decode("utf-8", "surrogateescape") for d in done)

    async def expect(self, pattern: str, timeout: float = T, *, since: int = 0) -> str:
        """The first line (from index *since*) matching *pattern* (re.search)."""
        rx = re.compile(pattern)
        with trio.fail_after(timeout):
            while True:
                for line in self.lines[since:]:
                    if rx.search(line):
                        return line
                if self.eof:
                    raise AssertionError(f"EOF before {pattern!r}; got {self.lines}")
                await self._fill()

    async def expect_eof(self, timeout: float = T) -> None:
        with trio.fail_after(timeout):
            while not self.eof:
                try:
                    await self._fill()
                except trio.BrokenResourceError:
                    self.eof = True

    def mark(self) -> int:
        return len(self.lines)


@asynccontextmanager
async def server(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[EnclaveServer, list[dict]]]:
    events: list[dict] = []
    async with open_server(tmp_path / "state", events=events.append, **kw) as srv:
        yield srv, events


@asynccontextmanager
async def raw(srv: EnclaveServer) -> AsyncIterator[Raw]:
    assert srv.address is not None
    stream = await trio.open_tcp_stream(*srv.address)
    try:
        yield Raw(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def register(c: Raw, nick: str, *, password: str | None = None) -> None:
    if password is not None:
        await c.send(f"PASS {password}")
    await c.send(f"NICK {nick}", f"USER {nick} 0 * :test {nick}")
    await c.expect(rf"^:enclave 001 {re.escape(nick)} ")


async def sasl_register(c: Raw, nick: str, token: str, caps: str = "sasl") -> None:
    await c.send("CAP LS 302", f"NICK {nick}", f"USER {nick} 0 * :sasl {nick}")
    await c.expect(r"CAP \* LS :.*sasl=PLAIN")
    await c.send(f"CAP REQ :{caps}")
    await c.expect(r"CAP \* ACK :")
    await c.send("AUTHENTICATE PLAIN")
    await c.expect(r"^AUTHENTICATE :?\+$")
    blob = base64.b64encode(f"{nick}\0{nick}\0{token}".encode()).decode()
    await c.send(f"AUTHENTICATE {blob}")
    await c.expect(r" 903 ")
    await c.send("CAP END")
    await c.expect(rf"^:enclave 001 {re.escape(nick)} ")


async def join(c: Raw, nick: str, channel: str = "#enclave") -> None:
    mark = c.mark()
    await c.send(f"JOIN {channel}")
    await c.expect(rf"^:{nick}!\S+ JOIN :?{channel}$", since=mark)
    await c.expect(rf" 366 {nick} {channel} ", since=mark)


# --------------------------------------------------------------------------- protocol


def test_format_always_sends_trailing_parameter() -> None:
    assert format_line("PRIVMSG", "#c", "word") == "PRIVMSG #c :word"
    assert format_line("PRIVMSG", "#c", "two words", prefix="n!u@h") == (
        ":n!u@h PRIVMSG #c :two words"
    )
    assert format_line("PING", "tok") == "PING :tok"
    with pytest.raises(ValueError):
        format_line("PRIVMSG", "bad target", "x")


def test_parse_roundtrip_and_tags() -> None:
    line = parse_line(r"@+a=b\sc;msgid=1 :n!u@h privmsg #chan :hello :world")
    assert line.command == "PRIVMSG"
    assert line.params == ("#chan", "hello :world")
    assert line.tags == {"+a": "b c", "msgid": "1"}
    assert line.nick == "n"
    assert parse_line("PRIVMSG #c word").params == ("#c", "word")
    text = format_line("PRIVMSG", "#c", "a;b c\\d", tags={"+x": "a;b c\\d"})
    back = parse_line(text)
    assert back.tags["+x"] == "a;b c\\d" and back.params[-1] == "a;b c\\d"


def test_format_truncates_to_512_bytes_on_a_character_boundary() -> None:
    body = "é" * 400  # 800 bytes
    line = format_line("PRIVMSG", "#c", body, prefix="nick!user@127.0.0.1")
    data = line.encode() + b"\r\n"
    assert len(data) <= MAX_LINE
    assert parse_line(line).params[-1] == "é" * len(parse_line(line).params[-1])


def test_line_buffer_limits() -> None:
    buf = LineBuffer()
    out = buf.feed(b"PING a\r\nPING b\nPI")
    assert out == ["PING a", "PING b"]
    assert buf.feed(b"NG c\r\n") == ["PING c"]
    long = b"PRIVMSG #c :" + b"x" * 600 + b"\r\nPING after\r\n"
    out = buf.feed(long)
    assert isinstance(out[0], LineTooLong) and out[1] == "PING after"
    # Exactly 512 bytes with CRLF is allowed; tags do not count towards it.
    exact = b"@+t=" + b"y" * 100 + b" PRIVMSG #c :" + b"z" * (510 - 13)
    assert buf.feed(exact + b"\r\n") == [exact.decode()]


# --------------------------------------------------------------------------- sessions


async def test_registration_cap_join_relay_single_word_and_ping(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, events), raw(srv) as a, raw(srv) as b:
        await a.send("CAP LS 302", "NICK alice", "USER alice 0 * :Alice")
        await a.expect(r"^:enclave CAP \* LS :.*echo-message.*message-tags")
        assert not [x for x in a.lines if " 001 " in x]  # CAP LS suspends registration
        await a.send("CAP REQ :echo-message message-tags", "CAP END")
        await a.expect(r"CAP \* ACK :echo-message message-tags")
        await a.expect(r"^:enclave 001 alice :Welcome")
        await a.expect(r"^:enclave 005 alice .*CASEMAPPING=rfc1459")
        await register(b, "bob")
        await join(a, "alice")
        await join(b, "bob")
        await a.expect(r"^:bob!bob@127\.0\.0\.1 JOIN :#enclave$")

        # A one-word body arrives intact, as a trailing parameter.
        await b.send("PRIVMSG #enclave single")
        got = await a.expect(r"PRIVMSG #enclave")
        assert got.startswith("@msgid=")  # alice negotiated message-tags
        assert got.endswith(" :bob!bob@127.0.0.1 PRIVMSG #enclave :single")
        assert parse_line(got).params[-1] == "single"

        mark = b.mark()
        await a.send("@+draft/x=1 PRIVMSG #enclave :two words here")
        got = await b.expect(r"PRIVMSG #enclave :two words here", since=mark)
        assert got == ":alice!alice@127.0.0.1 PRIVMSG #enclave :two words here"  # no tags
        echo = await a.expect(r"^@.*:alice!alice@127\.0\.0\.1 PRIVMSG #enclave :two words here")
        assert "+draft/x=1" in echo and "msgid=" in echo

        # A client's PING is answered with the same token, after what preceded it.
        mark = a.mark()
        await b.send("PRIVMSG #enclave :before the ping", "PING unique-token-42")
        await b.expect(r"^:enclave PONG enclave :unique-token-42$")
        await a.expect(r"before the ping", since=mark)

        # Direct messages and NOTICE.
        mark = b.mark()
        await a.send("PRIVMSG bob :hi bob", "NOTICE bob :note")
        await b.expect(r"^:alice!\S+ PRIVMSG bob :hi bob$", since=mark)
        await b.expect(r"^:alice!\S+ NOTICE bob :note$", since=mark)

        # PART and QUIT are seen by the other member.
        await a.send("PART #enclave :bye now")
        await b.expect(r"^:alice!\S+ PART #enclave :bye now$")
        await join(a, "alice")
        await a.send("QUIT :gone fishing")
        await a.expect(r"^ERROR :Closing Link: 127\.0\.0\.1 \(Quit: gone fishing\)$")
        await a.expect_eof()
        await b.expect(r"^:alice!\S+ QUIT :Quit: gone fishing$")
    kinds = [e["event"] for e in events]
    assert kinds.count("registered") == 2 and "closed" in kinds


#: (who sends, the line, the reply it must get) -- in order, on one connection each, so
#: each reply also proves the server is still reading that client after the error.
ERROR_NUMERICS: list[tuple[str, str, str]] = [
    ("b", "NICK alice", r" 433 bobby alice :Nickname is already in use"),
    ("b", "NICK 9bad", r" 432 bobby 9bad :"),
    ("b", "NICK EnclaveServ", r" 432 bobby EnclaveServ :"),
    ("a", "PRIVMSG nobody :hello", r" 401 alice nobody :No such nick"),
    ("a", "PRIVMSG #nowhere :hello", r" 403 alice #nowhere :"),
    ("a", "PRIVMSG #other :from outside", r" 404 alice #other :Cannot send to channel"),
    ("a", "PRIVMSG", r" 411 alice :No recipient"),
    ("a", "PRIVMSG bobby", r" 412 alice :No text to send"),
    ("a", "PART #other", r" 442 alice #other :"),
    ("a", "FROB x", r" 421 alice FROB :Unknown command"),
    ("a", "PING", r" 409 alice :"),
    ("a", "USER again 0 * :x", r" 462 alice :"),
    ("a", "CAP BOGUS", r" 410 alice BOGUS :"),
    ("a", "CAP REQ :no-such-cap", r"CAP alice NAK :no-such-cap"),
    ("a", "PRIVMSG #other :" + "x" * 600, r" 417 alice :Input line was too long"),
    ("a", "PING still-in-order", r"PONG enclave :still-in-order"),
]


async def test_error_numerics(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, _), raw(srv) as a, raw(srv) as b:
        await a.send("JOIN #enclave")
        await a.expect(r" 451 \* :You have not registered")
        await register(a, "alice")
        await a.send("NICK alice")  # its own nick: harmless
        await register(b, "bobby")
        await join(b, "bobby", "#other")
        clients = {"a": a, "b": b}
        for who, line, reply in ERROR_NUMERICS:
            c = clients[who]
            mark = c.mark()
            await c.send(line)
            await c.expect(reply, since=mark)
        # NOTICE never provokes an error reply: the PONG comes with no 401 before it.
        mark = a.mark()
        await a.send("NOTICE nobody :x", "PING after-notice")
        await a.expect(r"PONG enclave :after-notice", since=mark)
        assert not [x for x in a.lines[mark:] if " 401 " in x]


async def test_nick_change_is_seen_by_channel(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, _), raw(srv) as a, raw(srv) as b:
        await register(a, "alice")
        await register(b, "bob")
        await join(a, "alice")
        await join(b, "bob")
        await a.send("NICK alicia")
        await b.expect(r"^:alice!\S+ NICK :alicia$")
        await b.send("PRIVMSG alicia :found you")
        await a.expect(r"PRIVMSG alicia :found you")


async def test_pass_and_sasl_authentication(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, events):
        token = srv.registry.mint_leader("lead")
        async with raw(srv) as c:
            await sasl_register(c, "lead", token)
            await c.expect(r" 900 \* lead!lead@127\.0\.0\.1 lead :You are now logged in")
        async with raw(srv) as c:
            await register(c, "lead", password=token)
        # A registered nick without credentials, with a wrong token, or by SASL as
        # another account: 464 and the connection is closed.
        async with raw(srv) as c:
            await c.send("NICK lead", "USER lead 0 * :x")
            await c.expect(r" 464 \* :Password incorrect: lead is a registered bot")
            await c.expect(r"^ERROR :Closing Link")
            await c.expect_eof()
        async with raw(srv) as c:
            await c.send("PASS " + "0" * 64, "NICK lead", "USER lead 0 * :x")
            await c.expect(r" 464 \* :Password incorrect: bad token")
            await c.expect_eof()
        async with raw(srv) as c:
            await c.send("CAP REQ :sasl", "AUTHENTICATE PLAIN")
            await c.expect(r"AUTHENTICATE :?\+")
            bad = base64.b64encode(b"lead\0lead\0" + b"f" * 64).decode()
            await c.send(f"AUTHENTICATE {bad}")
            await c.expect(r" 904 \* :SASL authentication failed")
            await c.send("AUTHENTICATE SCRAM-SHA-256")
            await c.expect(r" 908 \* PLAIN :are available SASL mechanisms")
            await c.send("AUTHENTICATE PLAIN", "AUTHENTICATE *")
            await c.expect(r" 906 \* :SASL authentication aborted")
        # PASS for a nick that is not registered is a mistake, not a guest login.
        async with raw(srv) as c:
            await c.send(f"PASS {token}", "NICK stranger", "USER s 0 * :x")
            await c.expect(r" 464 \* :Password incorrect: PASS given for unregistered")
    reasons = [e["reason"] for e in events if e["event"] == "auth_failed"]
    assert "bad token" in reasons


async def test_ghost_is_replaced_by_authenticated_reconnect(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, events):
        token = srv.registry.mint_leader("lead")
        async with raw(srv) as old, raw(srv) as new, raw(srv) as guest, raw(srv) as g2:
            await register(old, "lead", password=token)
            await register(new, "lead", password=token)
            await old.expect(r"^ERROR :Closing Link: .*Ghost replaced")
            await old.expect_eof()
            await new.send("PING still-here")
            await new.expect(r"PONG enclave :still-here")
            # A guest nick in use is refused, not replaced.
            await register(guest, "visitor")
            await g2.send("NICK visitor")
            await g2.expect(r" 433 \* visitor :Nickname is already in use")
    assert any(e["event"] == "ghost_replaced" for e in events)


# --------------------------------------------------------------------------- registry


async def spawn(c: Raw, nick: str, expires: str = "60") -> str:
    mark = c.mark()
    await c.send(f"PRIVMSG EnclaveServ :SPAWN {nick} {expires}")
    return await c.expect(rf"NOTICE \S+ :(SPAWNED|ERROR SPAWN) {re.escape(nick)} ", since=mark)


async def test_quota_three_bots_leader_counting(tmp_path: Path) -> None:
    assert QUOTA == 3
    async with server(tmp_path) as (srv, _), raw(srv) as lead:
        token = srv.registry.mint_leader("lead")
        await register(lead, "lead", password=token)
        ok1 = await spawn(lead, "w1")
        m = re.search(r":EnclaveServ!\S+ NOTICE lead :SPAWNED w1 ([0-9a-f]{64}) (\d+)$", ok1)
        assert m, ok1
        assert int(m.group(2)) >= time.time() + 59
        assert (await spawn(lead, "w2")).endswith(tuple("0123456789"))
        refused = await spawn(lead, "w3")
        assert re.search(r"NOTICE lead :ERROR SPAWN w3 QUOTA_EXCEEDED :.*3 live bots", refused)
        # The worker's token works, and it may not spawn.
        async with raw(srv) as w1:
            await register(w1, "w1", password=m.group(1))
            got = await spawn(w1, "w4")
            assert "ERROR SPAWN w4 NOT_ALLOWED :" in got
        # Revoking one frees a slot; the revoked nick stays burned.
        mark = lead.mark()
        await lead.send("PRIVMSG EnclaveServ :REVOKE w2")
        await lead.expect(r"NOTICE lead :REVOKED w2$", since=mark)
        assert "SPAWNED w3 " in await spawn(lead, "w3")
        assert "ERROR SPAWN w2 NAME_TAKEN :" in await spawn(lead, "w2")
        assert "ERROR SPAWN lead NAME_TAKEN :" in await spawn(lead, "lead")


async def test_service_errors(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, _), raw(srv) as lead, raw(srv) as guest:
        token = srv.registry.mint_leader("lead")
        other_token = srv.registry.mint_leader("boss")
        await register(lead, "lead", password=token)
        await register(guest, "visitor")
        assert "ERROR SPAWN x1 NOT_ALLOWED :" in await spawn(guest, "x1")
        assert "ERROR SPAWN visitor NAME_TAKEN :" in await spawn(lead, "visitor")
        assert "ERROR SPAWN x1 BAD_REQUEST :" in await spawn(lead, "x1", "soon")
        assert "ERROR SPAWN x1 BAD_REQUEST :" in await spawn(lead, "x1", "-5")
        assert "ERROR SPAWN 9x BAD_REQUEST :" in await spawn(lead, "9x")
        assert "SPAWNED x1 " in await spawn(lead, "x1", "30m")

        async def revoke(c: Raw, nick: str) -> str:
            mark = c.mark()
            await c.send(f"PRIVMSG EnclaveServ :REVOKE {nick}")
            return await c.expect(rf"NOTICE \S+ :(REVOKED|ERROR REVOKE) {nick}", since=mark)

        assert "ERROR REVOKE ghost NOT_FOUND :" in await revoke(lead, "ghost")
        assert "ERROR REVOKE lead NOT_ALLOWED :" in await revoke(lead, "lead")
        assert "ERROR REVOKE boss NOT_ALLOWED :" in await revoke(lead, "boss")
        assert "ERROR REVOKE x1 NOT_ALLOWED :" in await revoke(guest, "x1")
        assert "REVOKED x1" in await revoke(lead, "x1")
        assert "ERROR REVOKE x1 NOT_FOUND :" in await revoke(lead, "x1")
        mark = lead.mark()
        await lead.send("PRIVMSG EnclaveServ :FROB x")
        await lead.expect(r"NOTICE lead :ERROR FROB x BAD_REQUEST :", since=mark)
        assert other_token  # the other owner exists but is not connected


async def test_revoke_drops_live_connection_and_burns_nick(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, events), raw(srv) as lead:
        token = srv.registry.mint_leader("lead")
        await register(lead, "lead", password=token)
        await join(lead, "lead")
        wtoken = re.search(r"[0-9a-f]{64}", await spawn(lead, "w1"))
        assert wtoken
        async with raw(srv) as w:
            await register(w, "w1", password=wtoken.group(0))
            await join(w, "w1")
            await lead.send("PRIVMSG EnclaveServ :REVOKE w1")
            await w.expect(r"^ERROR :Closing Link: 127\.0\.0\.1 \(Revoked\)$")
            await w.expect_eof()
            await lead.expect(r"^:w1!\S+ QUIT :Revoked$")
        async with raw(srv) as again:
            await again.send(f"PASS {wtoken.group(0)}", "NICK w1", "USER w1 0 * :x")
            await again.expect(r" 464 \* :Password incorrect: revoked")
        assert "NAME_TAKEN" in await spawn(lead, "w1")
    assert Registry(tmp_path / "state").lookup("w1").revoked_at is not None  # type: ignore[union-attr]
    assert any(e["event"] == "revoked" and e["live"] for e in events)


async def test_expiry_is_enforced_on_live_connection_and_at_auth(tmp_path: Path) -> None:
    async with server(tmp_path) as (srv, events), raw(srv) as lead:
        token = srv.registry.mint_leader("lead")
        await register(lead, "lead", password=token)
        reply = await spawn(lead, "brief", "0.5")
        m = re.search(r"SPAWNED brief ([0-9a-f]{64}) (\d+)$", reply)
        assert m, reply
        expires_at = int(m.group(2))
        async with raw(srv) as w:
            await register(w, "brief", password=m.group(1))
            # Expiry is at most 1.5 s away (0.5 s rounded up to a whole second).
            await w.expect(r"^ERROR :Closing Link: .*\(Token expired\)$", timeout=3.0)
            await w.expect_eof()
            assert time.time() >= expires_at
        async with raw(srv) as w:
            await w.send(f"PASS {m.group(1)}", "NICK brief", "USER b 0 * :x")
            await w.expect(r" 464 \* :Password incorrect: expired")
        # An expired bot no longer counts against the quota (leader + 2 more fit).
        assert "SPAWNED e2 " in await spawn(lead, "e2")
        assert "SPAWNED e3 " in await spawn(lead, "e3")
        assert "QUOTA_EXCEEDED" in await spawn(lead, "e4")
        assert "NAME_TAKEN" in await spawn(lead, "brief")
    assert any(e["event"] == "expired" for e in events)


# --------------------------------------------------------------------------- keepalive


async def test_idle_client_is_pinged_and_a_frozen_one_dropped(tmp_path: Path) -> None:
    async with server(tmp_path, ping_interval=0.3, ping_timeout=0.3) as (srv, events):
        async with raw(srv) as live, raw(srv) as frozen:
            await register(live, "live")
            await register(frozen, "frozen")
            # The live client answers PINGs; the frozen one never reads or writes again.
            with trio.fail_after(T):
                answered = 0
                mark = live.mark()
                while answered < 3:
                    line = await live.expect(r"^PING :", since=mark)
                    mark = live.lines.index(line, mark) + 1
                    await live.send("PONG :" + line.split(":", 1)[1])
                    answered += 1
            await frozen.expect(r"^ERROR :Closing Link: .*\(Ping timeout: \d+ seconds\)$")
            await frozen.expect_eof()
            await live.send("PING alive")
            await live.expect(r"PONG enclave :alive")
    timeouts = [e for e in events if e["event"] == "ping_timeout"]
    assert [e["nick"] for e in timeouts] == ["frozen"]


async def test_unregistered_connection_times_out(tmp_path: Path) -> None:
    async with server(tmp_path, ping_interval=0.2, ping_timeout=0.2) as (srv, _), raw(srv) as c:
        await c.send("NICK halfway")
        await c.expect(r"^ERROR :Closing Link: .*\((Registration|Ping) timeout")
        await c.expect_eof()


async def test_slow_reader_is_dropped_not_waited_for(tmp_path: Path) -> None:
    """A client that never reads cannot stall the server: its send queue overflows."""
    # Flood control off: here the talker's flood is the tool, the sink's queue the subject.
    async with server(tmp_path, flood=FloodLimits(rate=0)) as (srv, events), raw(srv) as talker:
        srv.config.sendq = 64  # applies to connections accepted from now on
        async with raw(srv) as sink:
            await register(talker, "talker")
            await register(sink, "sink")
            chunk = "PRIVMSG sink :" + "x" * 400
            # The kernel buffers a few MB on loopback before the server's queue fills.
            with trio.fail_after(30):
                for _ in range(1000):
                    await talker.send(*([chunk] * 50))
                    if any(e["event"] == "closed" and e["nick"] == "sink" for e in events):
                        break
                    await trio.lowlevel.checkpoint()
            closed = [e for e in events if e["event"] == "closed" and e["nick"] == "sink"]
            assert closed and closed[0]["reason"] == "SendQ exceeded", closed
            await talker.send("PING talker-unaffected")
            await talker.expect(r"PONG enclave :talker-unaffected")


# --------------------------------------------------------------------------- flood control


async def test_a_flooder_is_held_back_and_dropped_not_its_audience(tmp_path: Path) -> None:
    """One client sends 30,000 lines to a channel; a raw reader reading as fast as it can
    and an observer sit in it. Without flood control both members were dropped for SendQ
    (one run: the observer saw 19,361 lines, then EOF). With it the flooder is read at
    its rate, then dropped for Excess Flood, and the members get every line it was let
    say, in order, and stay."""
    from drivers.irc import open_observer

    rate, burst, limit, total = 500.0, 200, 1.0, 30_000
    async with (
        server(tmp_path, flood=FloodLimits(rate, burst, limit)) as (srv, events),
        raw(srv) as reader,
        raw(srv) as flooder,
        open_observer(*srv.address, "obs", "#flood") as obs,  # type: ignore[misc]
    ):
        await register(reader, "reader")
        await join(reader, "reader", "#flood")
        await register(flooder, "flooder")
        await join(flooder, "flooder", "#flood")

        async def keep_reading() -> None:
            while not reader.eof:
                await reader._fill()

        pad = "x" * 300
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_reading)
            t0 = trio.current_time()
            with trio.fail_after(30):  # held, not dropped, would hang here: a failure
                try:
                    for start in range(0, total, 500):
                        lines = (
                            f"PRIVMSG #flood :flood {n} {pad}" for n in range(start, start + 500)
                        )
                        await flooder.send(*lines)
                except trio.BrokenResourceError:
                    pass  # the server dropped the flooder
            dropped_after = trio.current_time() - t0
            nursery.cancel_scope.cancel()

        closed = {e["nick"]: e["reason"] for e in events if e["event"] == "closed"}
        assert closed == {"flooder": "Excess Flood"}, closed
        # Every line the server took reached both members, in order, before their PONG.
        mark = reader.mark()
        await reader.send("PING after-the-flood")
        await reader.expect(r"PONG enclave :after-the-flood", since=mark)
        got = [int(line.split()[4]) for line in reader.lines if " PRIVMSG #flood :" in line]
        assert got == list(range(len(got))), "lost or reordered"
        await obs.send_raw("PING after-the-flood")
        assert await obs.wait_line(lambda ln: ln.command == "PONG", T) is not None
        assert [int(m.text.split()[1]) for m in obs.messages] == got
        await reader.expect(r"^:flooder!\S+ QUIT :Excess Flood$")
        # Held to the rate: the burst, then at most `rate` lines a second.
        assert burst <= len(got) <= burst + rate * dropped_after + 1, (len(got), dropped_after)
    excess = [e for e in events if e["event"] == "excess_flood"]
    assert [e["nick"] for e in excess] == ["flooder"] and excess[0]["held_s"] >= limit


async def test_a_burst_past_the_allowance_is_delayed_not_dropped(tmp_path: Path) -> None:
    """300 lines against a burst of 100 at 200 lines/s: the last 200 wait about a second
    in all, under the 3 s limit, so all arrive and the sender stays."""
    flood = FloodLimits(rate=200.0, burst=100, limit_s=3.0)
    async with server(tmp_path, flood=flood) as (srv, events), raw(srv) as a, raw(srv) as b:
        await register(a, "alice")
        await register(b, "bob")
        await a.send(*(f"PRIVMSG bob :burst {n}" for n in range(300)), "PING burst-done")
        await a.expect(r"PONG enclave :burst-done")
        await b.expect(r"PRIVMSG bob :burst 299$")
        assert [ln.split()[-1] for ln in b.lines if " PRIVMSG " in ln] == [
            str(n) for n in range(300)
        ]
    assert not [e for e in events if e["event"] == "excess_flood"]


# --------------------------------------------------------------------------- process


def enclave(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m harness.enclave ARGS`` to completion (bounded)."""
    return run_module("harness.enclave", *args)


def test_server_process_port_file_log_and_mint_leader(tmp_path: Path) -> None:
    state = tmp_path / "state"
    mint = enclave("mint-leader", "--state", str(state), "--nick", "boss")
    assert mint.returncode == 0, mint.stderr
    token = mint.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    again = enclave("mint-leader", "--state", str(state), "--nick", "boss")
    assert again.returncode == 1 and "NAME_TAKEN" in again.stderr
    assert "Traceback" not in again.stderr

    port_file = tmp_path / "port"
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.enclave",
            "--state",
            str(state),
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--ping-interval",
            "5",
            "--flood-burst",
            "7",
        ],
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.02)  # polling a file another process writes; bounded above
        port = int(port_file.read_text())

        async def session() -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            c = Raw(stream)
            await sasl_register(c, "boss", token)
            await c.send("QUIT :done")
            await c.expect_eof()
            await stream.aclose()
            # A client still connected at SIGTERM is told why before the close.
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            c = Raw(stream)
            await register(c, "stayer")
            proc.terminate()
            await c.expect(r"^ERROR :Closing Link: .*\(Server shutting down\)$")
            await c.expect_eof()
            await stream.aclose()

        trio.run(session)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert re.search(rf"^LISTENING 127\.0\.0\.1 {port}$", text, re.M)
    records = read_events(tmp_path / "server.log")
    listening = next(e for e in records if e["event"] == "listening")
    assert listening["flood"] == {"rate": 100.0, "burst": 7, "limit_s": 10.0}
    kinds = [e["event"] for e in records]
    for kind in ("listening", "accepted", "registered", "closed", "signal", "stopped"):
        assert kind in kinds, kinds


def test_bad_usage_is_one_line_exit_2(tmp_path: Path) -> None:
    # Refused before binding: the server never listens beyond loopback.
    r = enclave("--state", str(tmp_path), "--host", "0.0.0.0")
    assert r.returncode == 2 and "non-loopback" in r.stderr and "Traceback" not in r.stderr
    r = enclave("--help")
    assert r.returncode == 0 and "--ping-interval" in r.stdout and "--flood-rate" in r.stdout
    r = enclave("--state", str(tmp_path), "--flood-rate", "-1")
    assert r.returncode == 2 and "--flood-rate" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("port", ["99999", "-1", "65536", "http"])
def test_a_port_out_of_range_is_one_line_exit_2(tmp_path: Path, port: str) -> None:
    """Issue 24 item 5: --port 99999 was an OverflowError in an ExceptionGroup, exit 1."""
    r = enclave("--state", str(tmp_path), "--port", port)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0], r.stderr


async def test_client_behind_frozen_proxy_is_given_up_on(tmp_path: Path) -> None:
    """A real blackhole-like freeze (faultnet proxy): the server's keepalive drops the
    client, and its channel peers see the QUIT."""
    from faultnet import open_proxy

    async with server(tmp_path, ping_interval=0.2, ping_timeout=0.3) as (srv, events):
        async with open_proxy(upstream=srv.address) as proxy, raw(srv) as peer:
            stream = await trio.open_tcp_stream(*proxy.address)
            try:
                victim = Raw(stream)
                await register(victim, "victim")
                await join(victim, "victim")
                await register(peer, "peer")
                await join(peer, "peer")
                t0 = trio.current_time()
                await proxy.freeze(stream="both")
                # The peer keeps answering PINGs while it waits for the victim's QUIT.
                mark = peer.mark()
                with trio.fail_after(T):
                    while True:
                        line = await peer.expect(r"^PING :|QUIT :Ping timeout", since=mark)
                        mark = peer.lines.index(line, mark) + 1
                        if "QUIT" in line:
                            break
                        await peer.send("PONG :" + line.split(":", 1)[1])
                assert line.startswith(":victim!")
                waited = trio.current_time() - t0
                assert 0.3 <= waited < 0.2 + 0.3 + 2.0, waited
            finally:
                await trio.aclose_forcefully(stream)
    assert [e["nick"] for e in events if e["event"] == "ping_timeout"] == ["victim"]


def test_spawn_duration_forms() -> None:
    from harness.enclave._engine import parse_duration

    assert parse_duration("30") == 30 and parse_duration("1.5") == 1.5
    assert parse_duration("30m") == 1800 and parse_duration("2h") == 7200
    assert parse_duration("1d") == 86400 and parse_duration("1e-05") == 1e-05
    with pytest.raises(ValueError):
        parse_duration("soon")
