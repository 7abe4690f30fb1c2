"""drivers.irc.Observer and the spawn/revoke helpers against the in-process server."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from drivers.irc import IrcError, Message, open_observer, parse
from harness.enclave import EnclaveServError, open_server, revoke_worker, spawn_worker
from harness.enclave._client import spawn_worker_full


def test_parse() -> None:
    line = parse("@time=x :n!u@h PRIVMSG #c :hello world", 1.0, 2.0)
    assert line is not None
    assert (line.command, line.params, line.nick, line.tags) == (
        "PRIVMSG",
        ("#c", "hello world"),
        "n",
        {"time": "x"},
    )
    one = parse(":n!u@h PRIVMSG #c :single")
    assert one is not None and one.params[-1] == "single"
    with pytest.raises(ValueError, match="no command"):
        parse("")
    tagged = parse(r"@+x=a\sb\:c :n PRIVMSG #c :t")
    assert tagged is not None and tagged.tags == {"+x": "a b;c"}


async def test_wait_for_finds_message_and_none_on_timeout(tmp_path: Path) -> None:
    async with open_server(tmp_path, events=lambda r: None) as srv:
        host, port = srv.address  # type: ignore[misc]
        async with (
            open_observer(host, port, "watcher", "#enclave") as obs,
            open_observer(host, port, "talker", "#enclave") as talker,
        ):
            before = time.time()
            await talker.privmsg("#enclave", "early bird")
            # Sent before wait_for is called: still found (it searches the record).
            got = await obs.wait_for("early bird", 5)
            assert isinstance(got, Message)
            assert (got.sender, got.target, got.text, got.kind) == (
                "talker",
                "#enclave",
                "early bird",
                "PRIVMSG",
            )
            assert before <= got.time <= time.time() and got.mono > 0

            async def later() -> None:
                await trio.sleep(0.1)  # the delay IS the scenario: a message that comes later
                await talker.privmsg("#enclave", "single")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(later)
                got = await obs.wait_for("single", 5, since=len(obs.messages))
            assert got is not None and got.text == "single"  # one word, intact

            t0 = trio.current_time()
            assert await obs.wait_for("never sent", 0.3) is None
            waited = trio.current_time() - t0
            assert 0.3 <= waited < 2.0
            # The filter on sender works, and direct messages are recorded too.
            await talker.privmsg("watcher", "just for you")
            dm = await obs.wait_for("just for you", 5, sender="talker")
            assert dm is not None and dm.target == "watcher"
            assert await obs.wait_for("just for you", 0.1, sender="nobody") is None
            assert [m.text for m in obs.messages] == ["early bird", "single", "just for you"]

            await talker.send_raw("NOTICE watcher :heads up 42")
            note = await obs.wait_notice(r"heads up \d+", 5)
            assert note is not None and note.kind == "NOTICE"
            with pytest.raises(ValueError):
                await obs.send_raw("PRIVMSG #enclave :a\r\nQUIT")


async def test_observer_answers_pings_and_stays(tmp_path: Path) -> None:
    """With a 0.2 s ping interval, an idle observer survives 1.5 s; a client that does
    not answer (the control) is dropped in the same span."""
    async with open_server(
        tmp_path, ping_interval=0.2, ping_timeout=0.3, events=lambda r: None
    ) as srv:
        host, port = srv.address  # type: ignore[misc]
        silent = await trio.open_tcp_stream(host, port)
        try:
            await silent.send_all(b"NICK mute\r\nUSER mute 0 * :x\r\n")
            async with open_observer(host, port, "watcher", "#enclave") as obs:
                received = b""
                with trio.fail_after(5):
                    while b"Ping timeout" not in received:
                        chunk = await silent.receive_some(4096)
                        assert chunk, received
                        received += chunk
                # The observer was idle just as long, and is still connected.
                await trio.sleep(max(0.0, 1.5 - 0.5))  # idling IS the scenario
                assert not obs.closed.is_set(), obs.close_reason
                assert obs.pings_answered >= 3
                await obs.send_raw("PING after-idle")
                pong = await obs.wait_line(
                    lambda ln: ln.command == "PONG" and ln.params[-1] == "after-idle", 5
                )
                assert pong is not None
        finally:
            await silent.aclose()


async def test_observer_sees_server_close(tmp_path: Path) -> None:
    async with open_server(tmp_path, events=lambda r: None) as srv:
        host, port = srv.address  # type: ignore[misc]
        async with open_observer(host, port, "watcher", None) as obs:
            await obs.send_raw("QUIT :leaving")
            with trio.fail_after(5):
                await obs.closed.wait()
            assert obs.close_reason is not None and "Quit: leaving" in obs.close_reason
            assert await obs.wait_for("anything", 5) is None  # returns at once when closed


async def test_spawn_and_revoke_helpers(tmp_path: Path) -> None:
    async with open_server(tmp_path, events=lambda r: None) as srv:
        host, port = srv.address  # type: ignore[misc]
        token = srv.registry.mint_leader("lead")
        async with open_observer(host, port, "lead", "#enclave", sasl=("lead", token)) as lead:
            t1, expires = await spawn_worker_full(lead, "w1", 120)
            assert len(t1) == 64 and expires >= time.time() + 119
            t2 = await spawn_worker(lead, "w2", 0.5)
            with pytest.raises(EnclaveServError) as exc:
                await spawn_worker(lead, "w3", 60)
            assert exc.value.code == "QUOTA_EXCEEDED" and exc.value.nick == "w3"
            async with open_observer(host, port, "w1", "#enclave", password=t1) as w1:
                await w1.privmsg("#enclave", "worker one reporting")
                assert await lead.wait_for("worker one reporting", 5, sender="w1")
                await revoke_worker(lead, "w1")
                with trio.fail_after(5):
                    await w1.closed.wait()
                assert "Revoked" in (w1.close_reason or "")
            with pytest.raises(EnclaveServError) as exc:
                await spawn_worker(lead, "w1", 60)
            assert exc.value.code == "NAME_TAKEN"
            with pytest.raises(EnclaveServError) as exc:
                await revoke_worker(lead, "nobody")
            assert exc.value.code == "NOT_FOUND"
            # A revoked token is refused at registration, with the server's words.
            with pytest.raises(IrcError, match="revoked"):
                async with open_observer(host, port, "w1", None, password=t1):
                    pass
            with pytest.raises(IrcError, match="904"):
                async with open_observer(host, port, "w2", None, sasl=("w2", "f" * 64)):
                    pass
            assert t2


async def test_registration_errors(tmp_path: Path) -> None:
    async with open_server(tmp_path, events=lambda r: None) as srv:
        host, port = srv.address  # type: ignore[misc]
        async with open_observer(host, port, "taken", None):
            with pytest.raises(IrcError, match="433"):
                async with open_observer(host, port, "taken", None):
                    pass
        with pytest.raises(IrcError, match="403"):
            async with open_observer(host, port, "joiner", "nochan"):
                pass
        with pytest.raises(IrcError, match="NAK"):
            async with open_observer(host, port, "capper", None, caps=("no-such-cap",)):
                pass
        async with open_observer(host, port, "timed", "#t", caps=("server-time",)) as a:
            async with open_observer(host, port, "other", "#t") as b:
                await b.privmsg("#t", "stamped message")
                got = await a.wait_for("stamped message", 5)
                assert got is not None and got.tags.get("time", "").endswith("Z")


async def test_a_stock_irc_client_interoperates(tmp_path: Path) -> None:
    """jaraco's ``irc`` library, unmodified, logs in with SASL PLAIN, joins, and
    exchanges channel messages (a one-word one included) with the observer."""
    irc_client = pytest.importorskip("irc.client")
    async with open_server(tmp_path, events=lambda r: None) as srv:
        host, port = srv.address  # type: ignore[misc]
        token = srv.registry.mint_leader("stock")
        reactor = irc_client.Reactor()
        state: dict[str, object] = {"joined": False, "texts": [], "account": None}

        def on_welcome(conn: Any, event: Any) -> None:
            conn.join("#enclave")

        def on_join(conn: Any, event: Any) -> None:
            if event.source.nick == "stock":
                state["joined"] = True

        def on_pubmsg(conn: Any, event: Any) -> None:
            state["texts"].append(event.arguments[0])  # type: ignore[union-attr]

        def on_loggedin(conn: Any, event: Any) -> None:
            state["account"] = event.arguments[-2] if len(event.arguments) > 1 else True

        reactor.add_global_handler("welcome", on_welcome)
        reactor.add_global_handler("join", on_join)
        reactor.add_global_handler("pubmsg", on_pubmsg)
        reactor.add_global_handler("loggedin", on_loggedin)

        def pump_until(cond: Callable[[], object], limit: float = 10.0) -> bool:
            deadline = time.monotonic() + limit
            while not cond() and time.monotonic() < deadline:
                reactor.process_once(0.02)
            return bool(cond())

        conn = reactor.server().connect(host, port, "stock", password=token, sasl_login="stock")
        try:
            assert await trio.to_thread.run_sync(pump_until, lambda: state["joined"])
            assert state["account"] == "stock"
            async with open_observer(host, port, "watcher", "#enclave") as obs:
                await obs.privmsg("#enclave", "single")
                await obs.privmsg("#enclave", "two words")
                assert await trio.to_thread.run_sync(
                    pump_until,
                    lambda: len(state["texts"]) >= 2,  # type: ignore[arg-type]
                )
                assert state["texts"] == ["single", "two words"]
                conn.privmsg("#enclave", "hello from a stock client")
                got = await obs.wait_for("hello from a stock client", 5, sender="stock")
                assert got is not None
        finally:
            conn.close()
