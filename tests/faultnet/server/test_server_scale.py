"""The server at scale, asserted by structure rather than by timing (issue 36): a fault
answer reads nothing per connection, the connection listing pages, a proxy's cost is
not a thread of its own, and the event log is one descriptor, not one per proxy. The figures themselves are the bench's scale section
(``scripts/bench --scale 1000``).

The server runs in the test (the plugin's ``faultnet_server``); connections are real
sockets to a real echo server. Reads of a connection are counted by wrapping
:meth:`Connection.info` and :class:`ConnectionInfo`'s constructor (instrumentation of
the real code, not a mock: both still run).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from faultnet.proxy import ConnectionInfo
from faultnet.proxy._connection import Connection
from faultnet.server import RunningServer, open_server
from faultnet.testing import echo_server, read_exactly

N = 20


@pytest.fixture
async def api(faultnet_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as client:
        yield client


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, int]]:
    async with echo_server() as addr:
        yield addr


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a connection from now on: ``info`` calls and ConnectionInfo built."""
    seen: list[str] = []
    info, init = Connection.info, ConnectionInfo.__init__

    def counted_info(self: Connection) -> ConnectionInfo:
        seen.append("info")
        return info(self)

    def counted_init(self: ConnectionInfo, *args: Any, **kwargs: Any) -> None:
        seen.append("ConnectionInfo")
        init(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "info", counted_info)
    monkeypatch.setattr(ConnectionInfo, "__init__", counted_init)
    return seen


async def proxy_with_connections(
    api: httpx.AsyncClient, up: tuple[str, int], n: int
) -> list[trio.SocketStream]:
    r = await api.post("/proxies", json={"name": "p", "upstream": f"{up[0]}:{up[1]}"})
    assert r.status_code == 201, r.text
    host, _, port = r.json()["listen"].rpartition(":")
    streams = []
    for _ in range(n):
        s = await trio.open_tcp_stream(host, int(port))
        await s.send_all(b"x")  # echoed: the connection is through to the upstream
        with trio.fail_after(5):
            assert await read_exactly(s, 1) == b"x"
        streams.append(s)
    return streams


async def test_a_fault_answer_reads_no_connection(
    api: httpx.AsyncClient, upstream: tuple[str, int], reads: list[str]
) -> None:
    streams = await proxy_with_connections(api, upstream, N)
    del reads[:]
    r = await api.post("/proxies/p/faults", json={"mode": "freeze"})
    assert r.status_code == 200, r.text
    assert r.json()["connections"] == N and r.json()["state"]["connections"] == {"frozen": N}
    assert (await api.get("/proxies/p/faults")).json()["connections"] == {"frozen": N}
    r = await api.post("/proxies/p/faults", json={"mode": "thaw", "connections": [1, 2]})
    assert r.json()["state"]["connections"] == {"frozen": N - 2, "open": 2}
    assert reads == []
    # The instrument sees reads where there are some: the listing reads each one.
    assert len((await api.get("/proxies/p/connections")).json()) == N
    assert reads.count("info") == N
    for s in streams:
        await s.aclose()


async def test_the_connection_listing_pages(
    api: httpx.AsyncClient, upstream: tuple[str, int], reads: list[str]
) -> None:
    streams = await proxy_with_connections(api, upstream, 5)
    everyone = [c["id"] for c in (await api.get("/proxies/p/connections")).json()]
    assert everyone == sorted(everyone) and len(everyone) == 5
    del reads[:]
    pages, after = [], 0
    for _ in range(5):  # bounded: three pages are expected
        r = await api.get("/proxies/p/connections", params={"limit": 2, "after": after})
        assert r.status_code == 200, r.text
        page = [c["id"] for c in r.json()]
        pages.append(page)
        if len(page) < 2:
            break
        after = page[-1]
    assert pages == [everyone[:2], everyone[2:4], everyone[4:]]
    assert reads.count("info") == 5  # each page read its own connections only
    for query in ({"limit": 0}, {"limit": "x"}, {"after": -1}):
        r = await api.get("/proxies/p/connections", params=query)
        assert r.status_code == 400 and "must be an integer" in r.json()["error"], r.text
    for s in streams:
        await s.aclose()


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


async def test_the_thread_count_does_not_grow_with_proxies(
    api: httpx.AsyncClient, upstream: tuple[str, int]
) -> None:
    async def create(name: str) -> None:
        r = await api.post(
            "/proxies", json={"name": name, "upstream": f"{upstream[0]}:{upstream[1]}"}
        )
        assert r.status_code == 201, r.text

    await create("first")  # whatever one proxy starts (a shared plane) is there now
    before = threads()
    for i in range(20):
        await create(f"p{i}")
    # Slack of 2: a worker thread trio's cache may start meanwhile; a thread per proxy
    # is 20.
    assert threads() - before <= 2, f"{threads() - before} threads more for 20 proxies"


def descriptors_of(path: Path) -> int:
    """This process's descriptors open on *path*."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path))


async def test_the_event_log_is_one_descriptor_however_many_proxies(
    tmp_path: Path, upstream: tuple[str, int]
) -> None:
    log = tmp_path / "events.jsonl"
    async with open_server(event_log=str(log)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
            for i in range(10):
                body = {"name": f"p{i}", "upstream": f"{upstream[0]}:{upstream[1]}"}
                assert (await api.post("/proxies", json=body)).status_code == 201
            assert descriptors_of(log) == 1
            assert (await api.get("/events")).json()["dropped"] == 0
    # Every proxy's records reached the one file, each tagged with its proxy.
    records = [json.loads(line) for line in log.read_text().splitlines()]
    listening = {r["proxy"] for r in records if r["event"] == "listening"}
    assert listening == {f"p{i}" for i in range(10)}
