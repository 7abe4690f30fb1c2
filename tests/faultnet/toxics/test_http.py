"""HTTP request-level toxics (faultnet.toxics.http) through a real proxy, with real
clients (raw sockets, httpx, curl, requests with urllib3's Retry) against real servers
(hypercorn serving tests/faultnet/http_app.py, and a recording h11 server for byte
identity). Times are lower bounds (a toxic never fires early); "it happened" is the
client's own outcome, awaited with a generous bound."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import requests
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.testing import start_server
from faultnet.toxics import (
    HttpAbort,
    HttpDelay,
    HttpHeader,
    HttpHold,
    HttpReset,
    HttpSlowBody,
    HttpTruncate,
)
from tests.faultnet.http_app import BIG, Address, Recorder, curl, serve_app

Factory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
def plane(each_plane: str) -> str:
    """Every data plane built here (tests/faultnet/conftest.py)."""
    return each_plane


@pytest.fixture
async def app(nursery: trio.Nursery) -> Address:
    return await serve_app(nursery)


@pytest.fixture
async def proxy(faultnet_proxy: Factory, app: Address, plane: str) -> Proxy:
    """A proxy in front of the app, on each data plane."""
    return await faultnet_proxy(app, dataplane=plane)


@pytest.fixture
async def recorder(nursery: trio.Nursery) -> tuple[Recorder, Address]:
    rec = Recorder()
    return rec, await start_server(nursery, rec.handle)


def url(proxy: Proxy, path: str = "/") -> str:
    assert proxy.address is not None
    return f"http://{proxy.address[0]}:{proxy.address[1]}{path}"


def http_faults(log: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(log).records if r["event"] == "http_fault"]


async def exchange(proxy: Proxy, data: bytes, n_responses: int) -> bytes:
    """Send *data* (pipelined requests) on one connection; read *n_responses* whole
    responses (parsed by a separate h11 client) and return their raw bytes."""
    assert proxy.address is not None
    stream = await trio.open_tcp_stream(*proxy.address)
    got = bytearray()
    with trio.fail_after(10):
        await stream.send_all(data)
        done = 0
        while done < n_responses:
            chunk = await stream.receive_some(65536)
            assert chunk, f"EOF after {done} responses"
            got += chunk
            done = _count_responses(bytes(got))
    await stream.aclose()
    return bytes(got)


def _count_responses(data: bytes) -> int:
    # Whole responses in *data*: h11 frames a response by its request, so each is read
    # by a fresh client told a GET (none of the tests' pipelines holds a HEAD).
    n = 0
    while data:
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(data)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return n
            if isinstance(event, h11.EndOfMessage):
                n += 1
                data = conn.trailing_data[0]
                break
    return n


PIPELINED = [
    b"GET /a HTTP/1.1\r\nHost: x\r\nX-Odd:  spaced  \r\n\r\n",
    b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /c HTTP/1.1\r\nhost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n",
    b"GET /chunked-d HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /api/e HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /f?q=1 HTTP/1.1\r\nHost: x\r\n\r\n",
]


async def test_untouched_requests_and_responses_cross_byte_identical(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address], plane: str
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address, dataplane=plane)
    proxy.add_toxic(HttpAbort("never", path="/nowhere/*"))
    proxy.add_toxic(HttpHeader("never2", method="DELETE", add="X-No: 1"))
    sent = b"".join(PIPELINED)
    got = await exchange(proxy, sent, len(PIPELINED))
    assert bytes(rec.received[0]) == sent
    assert got == bytes(rec.sent[0])


async def test_bytes_that_come_one_at_a_time_cross_byte_identical(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address]
) -> None:
    # Every parse state is cut somewhere: a head, a chunk's size line, its CRLF.
    rec, address = recorder
    rec.piece = 1  # the server writes its responses a byte at a time too
    proxy = await faultnet_proxy(address)
    proxy.add_toxic(HttpAbort("never", path="/nowhere"))
    sent = b"".join(PIPELINED)
    assert proxy.address is not None
    stream = await trio.open_tcp_stream(*proxy.address)
    got = bytearray()
    with trio.fail_after(20):
        for i in range(len(sent)):
            await stream.send_all(sent[i : i + 1])
        while _count_responses(bytes(got)) < len(PIPELINED):
            chunk = await stream.receive_some(65536)
            assert chunk
            got += chunk
    await stream.aclose()
    assert bytes(rec.received[0]) == sent
    assert bytes(got) == bytes(rec.sent[0])


async def test_a_chunked_response_written_chunk_by_chunk_arrives_whole(proxy: Proxy) -> None:
    proxy.add_toxic(HttpAbort("never", path="/nowhere"))
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(3):
            r = await client.get(url(proxy, "/chunked"))
            assert r.text == "one two three" and r.headers["transfer-encoding"] == "chunked"


async def test_an_abort_answers_in_order_among_pipelined_requests(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address], plane: str
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address, dataplane=plane)
    proxy.add_toxic(
        HttpAbort("api", path="/api/*", status=503, body="busy", headers="Retry-After: 1")
    )
    got = await exchange(proxy, b"".join(PIPELINED), len(PIPELINED))
    # The server saw every request but the aborted one, byte for byte.
    assert bytes(rec.received[0]) == b"".join(r for r in PIPELINED if b"/api/" not in r)
    # The client got the server's responses, the abort's answer in the aborted one's place.
    answer = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nbusy"
    server = bytes(rec.sent[0])
    cut = server.index(b"HTTP/1.1 200", server.index(b"/chunked-d"))
    assert got == server[:cut] + answer + server[cut:]


async def _faulted_paths(proxy: Proxy, paths: list[tuple[str, str]]) -> list[str]:
    faulted = []
    async with httpx.AsyncClient(timeout=10) as client:
        for method, path in paths:
            r = await client.request(method, url(proxy, path))
            if r.status_code == 503:
                faulted.append(f"{method} {path}")
            else:
                assert r.status_code == 200 and r.text == f"{method} {path} ok", r.text
    return faulted


async def test_a_percent_faults_the_requests_the_seed_draws_and_the_same_again(
    faultnet_proxy: Factory, app: Address, tmp_path: Path
) -> None:
    # "503 for 20 % of GET /api/*": POSTs and other paths are never faulted.
    paths = [("GET", f"/api/{i}") for i in range(60)] + [("GET", "/other")] * 5
    paths += [("DELETE", "/api/x")] * 5
    runs = []
    for run, seed in enumerate((7, 7, 8)):
        log = tmp_path / f"run{run}.jsonl"
        proxy = await faultnet_proxy(app, seed=seed, event_log=str(log))
        proxy.add_toxic(HttpAbort("api", method="GET", path="/api/*", percent=20))
        faulted = await _faulted_paths(proxy, paths)
        records = http_faults(log)
        assert [f"{r['method']} {r['path']}" for r in records] == faulted
        assert all(r["action"] == "abort" and r["status"] == 503 for r in records)
        runs.append(faulted)
    assert runs[0] == runs[1], "the same seed faulted other requests"
    assert runs[0] != runs[2], "another seed faulted the same requests"
    # 20 % of 60, drawn: binomial, 5 and 20 are more than 3 standard deviations out.
    assert 5 <= len(runs[0]) <= 20, runs[0]
    assert all(p.startswith("GET /api/") for p in runs[0] + runs[2])


async def _one_by_one(proxy: Proxy, requests_: list[bytes]) -> list[bytes]:
    """Each request in turn on one keep-alive connection; each raw response."""
    assert proxy.address is not None
    stream = await trio.open_tcp_stream(*proxy.address)
    out = []
    with trio.fail_after(20):
        for request in requests_:
            await stream.send_all(request)
            got = b""
            while _count_responses(got) < 1:
                chunk = await stream.receive_some(65536)
                assert chunk
                got += chunk
            out.append(got)
    await stream.aclose()
    return out


async def test_every_response_the_seed_does_not_draw_arrives_byte_identical(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # The same rule as above, on raw bytes: what the client reads for each request not
    # drawn is exactly what the server wrote for it.
    reqs = [f"GET /api/{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(40)]
    reqs += [b"POST /api/p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"] * 5
    drawn = []
    for _ in range(2):
        rec = Recorder()
        proxy = await faultnet_proxy(await start_server(nursery, rec.handle), seed=11)
        proxy.add_toxic(HttpAbort("api", method="GET", path="/api/*", percent=20))
        got = await _one_by_one(proxy, reqs)
        faulted = [i for i, r in enumerate(got) if r.startswith(b"HTTP/1.1 503 ")]
        assert [r for i, r in enumerate(got) if i not in faulted] == rec.responses
        assert faulted and all(i < 40 for i in faulted)
        drawn.append(faulted)
    assert drawn[0] == drawn[1]


def _session(retry: Retry) -> requests.Session:
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    return session


async def test_urllib3_retry_succeeds_on_the_third_request_when_the_first_two_fail(
    faultnet_proxy: Factory, app: Address, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(app, event_log=str(log))
    proxy.add_toxic(HttpAbort("first2", path="/api/*", count=2))
    retry = Retry(total=3, status_forcelist=[503], backoff_factor=0)

    def get() -> requests.Response:
        with _session(retry) as s:
            return s.get(url(proxy, "/api/item"), timeout=10)

    r = await trio.to_thread.run_sync(get)
    assert (r.status_code, r.text) == (200, "GET /api/item ok")
    assert [r["path"] for r in http_faults(log)] == ["/api/item", "/api/item"]


async def test_urllib3_retry_does_not_retry_a_post_unless_told_to(
    faultnet_proxy: Factory, app: Address
) -> None:
    proxy = await faultnet_proxy(app)
    toxic = HttpAbort("first2", path="/api/*", count=2)
    proxy.add_toxic(toxic)

    def post(retry: Retry) -> int:
        with _session(retry) as s:
            return s.post(url(proxy, "/api/item"), data=b"x", timeout=10).status_code

    # urllib3's default allowed_methods leave POST out: the 503 comes back as it is.
    default = Retry(total=3, status_forcelist=[503], backoff_factor=0)
    assert await trio.to_thread.run_sync(post, default) == 503
    assert toxic.faulted == 1
    told = Retry(total=3, status_forcelist=[503], backoff_factor=0, allowed_methods={"POST"})
    assert await trio.to_thread.run_sync(post, told) == 200
    assert toxic.faulted == 2


async def test_truncate_gives_curl_a_short_body_and_httpx_an_incomplete_one(proxy: Proxy) -> None:
    proxy.add_toxic(HttpTruncate("cut", path="/big", bytes=1000))
    done = await curl(url(proxy, "/big"))
    assert done.returncode == 18, done.stderr  # CURLE_PARTIAL_FILE
    assert done.stdout == BIG[:1000]
    async with httpx.AsyncClient(timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete|closed"):
            await client.get(url(proxy, "/big"))
        r = await client.get(url(proxy, "/small"))  # a new connection, not faulted
        assert r.text == "GET /small ok"


async def test_reset_mid_body_gives_curl_a_connection_reset(proxy: Proxy) -> None:
    proxy.add_toxic(HttpReset("rst", path="/big", bytes=5000))
    done = await curl(url(proxy, "/big"))
    assert done.returncode == 56, done.stderr  # CURLE_RECV_ERROR
    assert b"reset" in done.stderr.lower()
    assert len(done.stdout) <= 5000


async def test_slow_body_never_beats_its_rate(faultnet_proxy: Factory, app: Address) -> None:
    rate = 400_000  # bytes/s: BIG's 200,000 bytes take at least ~0.5 s
    proxy = await faultnet_proxy(app)
    proxy.add_toxic(HttpSlowBody("slow", path="/big", rate=rate))
    async with httpx.AsyncClient(timeout=10) as client:
        t0 = trio.current_time()
        r = await client.get(url(proxy, "/big"))
        elapsed = trio.current_time() - t0
    assert r.content == BIG
    # The last piece (1/20 s worth) leaves at (len - piece) / rate.
    assert elapsed >= (len(BIG) - rate // 20) / rate, elapsed


async def test_delay_holds_the_headers_or_only_the_body(
    faultnet_proxy: Factory, app: Address
) -> None:
    proxy = await faultnet_proxy(app)
    proxy.add_toxic(HttpDelay("d", path="/slow-head", delay=300))
    proxy.add_toxic(HttpDelay("b", path="/slow-body", delay=2000, before="body"))
    async with httpx.AsyncClient(timeout=10) as client:
        t0 = trio.current_time()
        r = await client.get(url(proxy, "/slow-head"))
        assert r.text == "GET /slow-head ok"
        assert trio.current_time() - t0 >= 0.3
        t0 = trio.current_time()
        async with client.stream("GET", url(proxy, "/slow-body")) as r:
            headers_at = trio.current_time() - t0
            body = await r.aread()
            body_at = trio.current_time() - t0
    assert body == b"GET /slow-body ok"
    assert headers_at < 2.0 <= body_at, (headers_at, body_at)


async def test_a_request_side_delay_reaches_the_server_late_a_response_side_one_on_time(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address]
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address)
    proxy.add_toxic(HttpDelay("req", path="/req", delay=300, before="request"))
    proxy.add_toxic(HttpDelay("resp", path="/resp", delay=300))
    async with httpx.AsyncClient(timeout=10) as client:
        for path in ("/req", "/resp"):
            sent = trio.current_time()
            r = await client.get(url(proxy, path))
            answered = trio.current_time()
            assert r.text == f"GET {path}"
            # Both answers are 300 ms late; only the request-side one reached the server so.
            assert answered - sent >= 0.3, (path, answered - sent)
            reached = rec.arrived[-1] - sent
            if path == "/req":
                assert reached >= 0.3, reached
            else:
                assert reached < 0.3, reached  # measured: 1-3 ms; the bound is the delay


async def test_hold_never_answers_and_the_server_never_sees_it(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address], plane: str
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address, dataplane=plane)
    proxy.add_toxic(HttpHold("hold", path="/stuck", count=1))
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.5)) as client:
        assert (await client.get(url(proxy, "/before"))).text == "GET /before"
        with pytest.raises(httpx.ReadTimeout):
            await client.get(url(proxy, "/stuck"))
        # count=1: the next one (a new connection: httpx dropped the timed-out one) passes.
        assert (await client.get(url(proxy, "/stuck"))).text == "GET /stuck"
    seen = b"".join(rec.received)
    assert seen.count(b"GET /stuck") == 1 and seen.count(b"GET /before") == 1


async def test_header_toxic_adds_and_removes_on_the_response_or_the_request(
    faultnet_proxy: Factory, recorder: tuple[Recorder, Address]
) -> None:
    rec, address = recorder
    proxy = await faultnet_proxy(address)
    proxy.add_toxic(
        HttpHeader("resp", path="/r", add="X-Fault: yes\nRetry-After: 2", remove="content-length")
    )
    proxy.add_toxic(HttpHeader("req", path="/q", add="X-Injected: 1", on="request"))
    async with httpx.AsyncClient(timeout=10) as client:
        # No Content-Length left: the body is read to the close (this server keeps the
        # connection: so ask it to close after).
        r = await client.get(url(proxy, "/r"), headers={"connection": "close"})
        assert r.headers["x-fault"] == "yes" and r.headers["retry-after"] == "2"
        assert "content-length" not in r.headers
        r = await client.get(url(proxy, "/q"))
        assert r.text == "GET /q"
    assert b"X-Injected: 1\r\n" in b"".join(rec.received)


async def test_expect_100_continue_passes_and_an_abort_answers_before_the_body(
    faultnet_proxy: Factory, app: Address
) -> None:
    proxy = await faultnet_proxy(app)
    proxy.add_toxic(HttpAbort("no", path="/api/*", status=413))
    body = "x" * 100_000
    ok = await curl("-H", "Expect: 100-continue", "--data-binary", body, url(proxy, "/echo"))
    assert ok.returncode == 0 and ok.stdout == body.encode(), ok.stderr
    no = await curl(
        "-H",
        "Expect: 100-continue",
        "--data-binary",
        body,
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        url(proxy, "/api/up"),
    )
    assert no.stdout == b"413", no.stderr


async def ask_to_upgrade(stream: trio.SocketStream) -> bytes:
    """Send a request to upgrade the connection; return what came back up to the end of
    the answer's head (and any bytes after it)."""
    await stream.send_all(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some(4096)
    return head


async def test_an_upgrade_turns_both_ways_opaque_after_101(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    async def upgrading(stream: trio.SocketStream) -> None:
        # Answers an Upgrade with 101, then echoes whatever comes, byte for byte.
        got = b""
        while b"\r\n\r\n" not in got:
            got += await stream.receive_some(4096)
        await stream.send_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
        )
        rest = got.split(b"\r\n\r\n", 1)[1]
        if rest:
            await stream.send_all(rest)
        while data := await stream.receive_some(4096):
            await stream.send_all(data)

    proxy = await faultnet_proxy(await start_server(nursery, upgrading))
    proxy.add_toxic(HttpAbort("all", status=500))  # matches every HTTP request
    assert proxy.address is not None
    stream = await trio.open_tcp_stream(*proxy.address)
    raw = b"\x00\xffGET / HTTP/1.1\r\n not http \r\n\r\n"
    with trio.fail_after(10):
        head = await ask_to_upgrade(stream)
        assert head.startswith(b"HTTP/1.1 500")
    # The abort answered the upgrade (it was a request like any other). A second
    # connection, the toxic gone, upgrades; then bytes that are not HTTP echo.
    await stream.aclose()
    proxy.remove_toxic("all")
    proxy.add_toxic(HttpAbort("api", path="/api/*"))
    stream = await trio.open_tcp_stream(*proxy.address)
    with trio.fail_after(10):
        head = await ask_to_upgrade(stream)
        assert head.startswith(b"HTTP/1.1 101")
        await stream.send_all(raw)
        echoed = head.split(b"\r\n\r\n", 1)[1]
        while len(echoed) < len(raw):
            echoed += await stream.receive_some(4096)
    assert echoed == raw
    await stream.aclose()


def _writes(commands: list[Any], stream: str) -> list[bytes]:
    """The writes the session's *commands* make on *stream* (its unit tests: no sockets)."""
    from faultnet.protocols.http import Forward, Inject

    return [c.data for c in commands if isinstance(c, Forward | Inject) and c.stream == stream]


def test_the_session_writes_each_chunk_it_reads_in_one_write() -> None:
    # A response's head, body and end are three spans; sent as three writes to a client
    # socket without TCP_NODELAY they met its delayed ACK (45 ms a keep-alive request).
    from faultnet.protocols.http import Session

    session = Session(lambda request: None)
    request = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    up = _writes(session.receive("upstream", request, 0.0), "upstream")
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
    down = _writes(session.receive("downstream", response, 0.0), "downstream")
    assert up == [request] and down == [response]


async def test_a_head_response_is_framed_without_a_body_and_the_next_request_follows(
    faultnet_proxy: Factory, app: Address
) -> None:
    # A HEAD's response carries a Content-Length and no body: framed as a GET's, the
    # session would read the next response as this one's body, and fault nothing in it.
    proxy = await faultnet_proxy(app)
    proxy.add_toxic(HttpHeader("h", path="/after", add="X-Seen: 1"))
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.head(url(proxy, "/big"))
        assert r.headers["content-length"] == str(len(BIG)) and r.content == b""
        r = await client.get(url(proxy, "/after"))
        assert r.text == "GET /after ok" and r.headers["x-seen"] == "1"
        r = await client.head(url(proxy, "/after"))
        assert r.content == b"" and r.headers["x-seen"] == "1"


async def test_an_http_toxic_added_to_an_open_keep_alive_connection_acts_on_its_next_request(
    proxy: Proxy,
) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(url(proxy, "/api/a"))).status_code == 200
        [before] = proxy.connections()
        proxy.add_toxic(HttpAbort("api", path="/api/*", status=429))
        assert (await client.get(url(proxy, "/api/b"))).status_code == 429
        assert (await client.get(url(proxy, "/c"))).text == "GET /c ok"
        [after] = proxy.connections()
        assert after.id == before.id  # the same connection, kept alive throughout
        proxy.remove_toxic("api")
        assert (await client.get(url(proxy, "/api/d"))).status_code == 200


_REQUESTS = [
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody",
    b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    b"GET /api/x HTTP/1.1\r\nHost: x\r\n\r\n",
]
_RESPONSES = {
    b"HEAD": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
    b"GET": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n",
    b"other": b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
}


def _response_to(request: bytes) -> bytes:
    method = request.split(b" ", 1)[0]
    return _RESPONSES.get(method, _RESPONSES[b"other"])


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_REQUESTS), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_any_pipeline_cut_anywhere_crosses_byte_identical_with_aborts_in_place(
    requests_: list[bytes], up_cuts: list[int], down_cuts: list[int]
) -> None:
    from faultnet.protocols.http import Session

    toxic = HttpAbort("api", path="/api/*", status=503)

    session = Session(lambda request: toxic.decide(request, 1))
    commands = []
    for piece in _cut(b"".join(requests_), up_cuts):
        commands += session.receive("upstream", piece, 0.0)
    served = b"".join(_response_to(r) for r in requests_ if b"/api/" not in r)
    for piece in _cut(served, down_cuts):
        commands += session.receive("downstream", piece, 0.0)
    upstream = b"".join(_writes(commands, "upstream"))
    downstream = b"".join(_writes(commands, "downstream"))
    answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    assert upstream == b"".join(r for r in requests_ if b"/api/" not in r)
    expected = b"".join(answer if b"/api/" in r else _response_to(r) for r in requests_)
    assert downstream == expected
