"""Faults a client picks per request by a header (issue 33, item 5; Envoy's
header-controlled faults): real sockets, an httpx client and a raw one, through a real
proxy to a recording h11 server (tests/faultnet/http_app.py). Times are lower bounds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.testing import start_server
from faultnet.toxics import HttpAbort
from tests.faultnet.http_app import Address, Recorder

Factory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def recorder(nursery: trio.Nursery) -> tuple[Recorder, Address]:
    rec = Recorder()
    return rec, await start_server(nursery, rec.handle)


def _url(proxy: Proxy, path: str) -> str:
    assert proxy.address is not None
    return f"http://{proxy.address[0]}:{proxy.address[1]}{path}"


async def test_a_request_header_picks_abort_delay_or_reset_for_that_request_only(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address], tmp_path: Path
) -> None:
    rec, address = recorder
    log = tmp_path / "log.jsonl"
    proxy = await faultnet_proxy(address, event_log=str(log))
    # The toxic's own fault never fires (percent 0): only the headers fault.
    proxy.add_toxic(HttpAbort("chosen", percent=0, client_faults=1))
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(_url(proxy, "/a"), headers={"X-Faultnet-Abort-Request": "418"})
        assert r.status_code == 418
        start = trio.current_time()
        r = await client.get(_url(proxy, "/b"), headers={"X-Faultnet-Delay-Request": "300"})
        assert r.status_code == 200 and r.text == "GET /b"
        assert trio.current_time() - start >= 0.3
        r = await client.get(_url(proxy, "/c"))  # no header: no fault
        assert r.status_code == 200 and r.text == "GET /c"
    # A reset: the client reads ECONNRESET, no response.
    assert proxy.address is not None
    stream = await trio.open_tcp_stream(*proxy.address)
    await stream.send_all(b"GET /d HTTP/1.1\r\nHost: x\r\nX-Faultnet-Reset-Request: 1\r\n\r\n")
    with trio.fail_after(10), pytest.raises(trio.BrokenResourceError):
        while await stream.receive_some(65536):
            pass
    await stream.aclose()
    seen = b"".join(rec.received)
    assert b"GET /b " in seen and b"GET /c " in seen
    assert b"GET /a " not in seen and b"GET /d " not in seen, "an aborted request went up"
    assert b"x-faultnet" not in seen.lower(), "a fault header went upstream"
    faults = [r for r in read_jsonl(log).records if r["event"] == "http_fault"]
    assert [(r["path"], r["action"], r["by"]) for r in faults] == [
        ("/a", "abort", "header"),
        ("/b", "delay", "header"),
        ("/d", "reset", "header"),
    ]


async def test_fault_headers_are_ordinary_headers_unless_the_toxic_opts_in(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address]
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address)
    proxy.add_toxic(HttpAbort("own", percent=0))
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(_url(proxy, "/a"), headers={"X-Faultnet-Abort-Request": "418"})
    assert r.status_code == 200
    assert b"x-faultnet-abort-request: 418" in b"".join(rec.received).lower()


async def test_a_delay_header_holds_the_request_before_the_server_sees_it(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    arrived: list[float] = []

    async def stamp(stream: trio.SocketStream) -> None:
        # Notes when the request's head arrives, then answers it.
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            got += chunk
        arrived.append(trio.current_time())
        assert b"x-faultnet" not in got.lower(), "the fault header went upstream"
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    address = await start_server(nursery, stamp)
    proxy = await faultnet_proxy(address)
    proxy.add_toxic(HttpAbort("chosen", percent=0, client_faults=1))
    async with httpx.AsyncClient(timeout=10) as client:
        sent = trio.current_time()
        r = await client.get(_url(proxy, "/b"), headers={"X-Faultnet-Delay-Request": "300"})
    assert r.status_code == 200 and r.text == "ok"
    assert len(arrived) == 1 and arrived[0] - sent >= 0.3, arrived[0] - sent
