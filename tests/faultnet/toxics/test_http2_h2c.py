"""HTTP/2 faults seen by httpx speaking h2c with prior knowledge (``http1=False``,
h2 underneath) to hypercorn (a real HTTP/2 server) through a proxy: an abort is an
HTTP/2 response, a RST_STREAM fails one request, and neither ends the connection the
other requests share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.toxics import Http2Reset, HttpAbort, HttpSlowBody
from tests.faultnet.http_app import BIG, Address, serve_app

Factory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def app(nursery: trio.Nursery) -> Address:
    return await serve_app(nursery)


def base(proxy: Proxy) -> str:
    assert proxy.address is not None
    return f"http://{proxy.address[0]}:{proxy.address[1]}"


def events(log: Path, name: str) -> list[dict[str, object]]:
    return [r for r in read_jsonl(log).records if r["event"] == name]


async def test_an_abort_is_an_http2_response_and_the_connection_serves_the_next(
    faultnet_proxy: Factory, app: Address, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(app, event_log=str(log))
    proxy.add_toxic(
        HttpAbort("a", path="/api/*", status=503, body="gone", headers="Retry-After: 1")
    )
    async with httpx.AsyncClient(http1=False, http2=True, base_url=base(proxy)) as client:
        with trio.fail_after(10):
            faulted = await client.post("/api/x", content=b"payload")
            passed = await client.get("/other")
    assert (faulted.http_version, faulted.status_code, faulted.text) == ("HTTP/2", 503, "gone")
    assert faulted.headers["retry-after"] == "1"
    assert (passed.http_version, passed.status_code, passed.text) == (
        "HTTP/2",
        200,
        "GET /other ok",
    )
    assert len(events(log, "conn_open")) == 1, "one connection for both"
    assert [(r["method"], r["path"], r["protocol"]) for r in events(log, "http_fault")] == [
        ("POST", "/api/x", "h2")
    ]


async def test_a_rst_stream_fails_one_request_and_not_the_connection(
    faultnet_proxy: Factory, app: Address, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(app, event_log=str(log))
    proxy.add_toxic(Http2Reset("r", path="/api/*", error_code="INTERNAL_ERROR"))
    async with httpx.AsyncClient(http1=False, http2=True, base_url=base(proxy)) as client:
        with trio.fail_after(10):
            with pytest.raises(httpx.RemoteProtocolError, match="StreamReset|INTERNAL_ERROR"):
                await client.get("/api/x")
            passed = await client.get("/other")
    assert (passed.http_version, passed.text) == ("HTTP/2", "GET /other ok")
    assert len(events(log, "conn_open")) == 1, "the reset ended the connection"
    assert [r["error_code"] for r in events(log, "http_fault")] == ["INTERNAL_ERROR"]


async def test_a_slow_body_delivers_its_rate_over_http2(
    faultnet_proxy: Factory, app: Address
) -> None:
    proxy = await faultnet_proxy(app)
    proxy.add_toxic(HttpSlowBody("s", path="/big", rate=400_000))
    async with httpx.AsyncClient(http1=False, http2=True, base_url=base(proxy)) as client:
        start = trio.current_time()
        with trio.fail_after(20):
            r = await client.get("/big")
        took = trio.current_time() - start
    assert r.content == BIG
    # 200,000 bytes at 400,000 B/s: 0.5 s, never sooner (the pacing's lower bound).
    assert took >= 0.45, took
