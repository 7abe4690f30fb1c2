"""The proxy's whole test module, and the toxics' end-to-end tests, again on the thread
data plane (faultnet.dataplane); plus what only the thread plane has: a bug in the
forwarding thread is contained to its connection.

The imported tests are collected here a second time, and this module's autouse fixture
sets ``FAULTNET_DATAPLANE=thread`` for them, so every Proxy they make forwards on the
thread (tests that ask for a plane by argument keep theirs).
"""

from __future__ import annotations

import pytest
import trio

from faultnet import dataplane
from faultnet.eventlog import read_jsonl
from faultnet.proxy import open_proxy
from faultnet.testing import echo_server, read_exactly, wait_until
from tests.faultnet.test_proxy import *  # noqa: F403
from tests.faultnet.toxics.test_toxics_e2e import *  # noqa: F403


@pytest.fixture(autouse=True)
def _thread_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTNET_DATAPLANE", "thread")


async def test_the_env_picks_the_thread_plane() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        assert proxy.dataplane == "thread"
        s = await trio.open_tcp_stream(*proxy.address)
        await s.send_all(b"x")
        with trio.fail_after(5):
            assert await read_exactly(s, 1) == b"x"
        assert (await _only_link(proxy)).lanes["upstream"].bytes == 1


async def _only_link(proxy) -> dataplane.Link:
    (conn,) = proxy._connections.values()
    assert conn.link is not None
    return conn.link


async def test_a_bug_in_the_forwarding_thread_ends_only_its_connection(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The breakage: the thread's handler raises for one connection's bytes. That
    connection ends (conn_error logged); the thread and other connections go on."""
    log = tmp_path / "events.jsonl"
    handle = dataplane.DataPlane._handle
    doomed: list[dataplane.Link] = []

    def buggy(self, link, reading, writing):
        if link in doomed:
            raise RuntimeError("a bug in the forwarding thread")
        return handle(self, link, reading, writing)

    monkeypatch.setattr(dataplane.DataPlane, "_handle", buggy)
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        victim = await trio.open_tcp_stream(*proxy.address)
        await wait_until(lambda: any(c.link for c in proxy._connections.values()))
        doomed.append(await _only_link(proxy))
        await victim.send_all(b"boom")
        with trio.fail_after(5):
            try:  # ended: the proxy resets it
                got = await victim.receive_some(10)
            except trio.BrokenResourceError:
                got = b""
        assert got == b""
        other = await trio.open_tcp_stream(*proxy.address)
        await other.send_all(b"still forwarding")
        with trio.fail_after(5):
            assert await read_exactly(other, 16) == b"still forwarding"
    errors = [r for r in read_jsonl(log).records if r["event"] == "conn_error"]
    assert len(errors) == 1 and "a bug in the forwarding thread" in errors[0]["error"]
