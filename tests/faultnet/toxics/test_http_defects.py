"""The HTTP toxics' defects of issue 33, each seen by a real client on a real socket
through a real proxy: what a client reads, and how the connection ends (a FIN, an RST,
or nothing within a bound)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.testing import receive_until, start_server, wait_until
from faultnet.toxics import HttpAbort, HttpDelay, HttpHold, HttpReset
from tests.faultnet.http_app import BIG, Address, serve_app

Factory = Callable[..., Awaitable[Proxy]]


async def read_to_end(proxy: Proxy, request: bytes, bound: float = 5) -> tuple[bytes, str]:
    """Send *request* on a new connection; read until the connection ends. Returns the
    bytes read and how it ended: ``"eof"`` (a FIN), ``"reset"`` or ``"open"`` (still
    open after *bound* seconds)."""
    assert proxy.address is not None
    sock = trio.socket.socket()
    await sock.connect(proxy.address)
    got = bytearray()
    how = "open"
    with trio.move_on_after(bound):
        await sock.send(request)
        try:
            while data := await sock.recv(65536):
                got += data
            how = "eof"
        except ConnectionResetError:
            how = "reset"
    sock.close()
    return bytes(got), how


def head_of(data: bytes) -> bytes:
    return data[: data.index(b"\r\n\r\n") + 4]


async def test_reset_sends_the_head_then_its_bytes_of_body_then_the_rst(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 1: the head and body were coalesced and the reset discarded them, so the
    # client read 0 bytes and an RST, a failure before any response (urllib3 retried it).
    proxy = await faultnet_proxy(await serve_app(nursery))
    for limit in (0, 5000):
        proxy.add_toxic(HttpReset("rst", path="/big", bytes=limit))
        got, how = await read_to_end(proxy, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        proxy.remove_toxic("rst")
        assert how == "reset"
        assert got.startswith(b"HTTP/1.1 200 "), got[:100]
        head = head_of(got)
        assert got[len(head) :] == BIG[:limit]


async def test_an_abort_of_an_http_1_0_request_answers_then_closes(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 2: HTTP/1.0 (no keep-alive) and `Connection: close` wait for the close
    # after their answer (ab timed out waiting).
    proxy = await faultnet_proxy(await serve_app(nursery))
    proxy.add_toxic(HttpAbort("api", path="/api/*", status=503, body="busy"))
    for request in (
        b"GET /api/a HTTP/1.0\r\n\r\n",
        b"GET /api/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ):
        got, how = await read_to_end(proxy, request)
        assert how == "eof", (request, got)
        assert got.startswith(b"HTTP/1.1 503 ") and got.endswith(b"\r\n\r\nbusy")
        assert b"\r\nConnection: close\r\n" in head_of(got)


async def test_an_abort_before_a_100_continue_body_says_connection_close(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 2: the abort closes (the body the client may still send cannot be
    # read as a request), so it must say so: pooled clients reused the connection.
    proxy = await faultnet_proxy(await serve_app(nursery))
    proxy.add_toxic(HttpAbort("api", path="/api/*", status=413))
    request = (
        b"POST /api/up HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    got, how = await read_to_end(proxy, request)
    assert how == "eof"
    assert got.startswith(b"HTTP/1.1 413 ")
    assert b"\r\nConnection: close\r\n" in head_of(got)


async def test_an_abort_with_204_or_304_sends_no_body_and_the_next_response_is_whole(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 2: a 204 or 304 has no body whatever its headers say; the abort's body
    # was sent and read by the client as the start of the next response.
    proxy = await faultnet_proxy(await serve_app(nursery))
    for status in (204, 304):
        proxy.add_toxic(HttpAbort("api", path="/api/*", status=status, body="oops"))
        request = (
            b"GET /api/a HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        got, how = await read_to_end(proxy, request)
        proxy.remove_toxic("api")
        assert how == "eof"
        head = head_of(got)
        assert head.startswith(f"HTTP/1.1 {status} ".encode())
        if status == 204:
            assert b"content-length" not in head.lower()
        assert got[len(head) :].startswith(b"HTTP/1.1 200 "), got
        assert got.endswith(b"GET /b ok")


async def test_a_held_request_leaves_no_socket_once_client_and_server_are_gone(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 3: the held client's FIN was never passed on and nothing ended the
    # connection, so its sockets stayed (CLOSE-WAIT) until the proxy was deleted.
    go = trio.Event()

    async def server(stream: trio.SocketStream) -> None:
        await go.wait()  # the server goes when told: a hung upstream that gives up
        await stream.aclose()

    proxy = await faultnet_proxy(await start_server(nursery, server))
    proxy.add_toxic(HttpHold("hold", path="/stuck"))
    assert proxy.address is not None
    client = await trio.open_tcp_stream(*proxy.address)
    await client.send_all(b"GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
    await client.aclose()
    go.set()
    # Polled: a connection's end has no event a test can wait on.
    await wait_until(lambda: not proxy.connections(), 5, "the connection ended")


async def _slow_then_fast(
    go: trio.Event, stream: trio.SocketStream
) -> None:  # pragma: no cover - a server
    # The first response's head and half its body, then (when told) the rest; later
    # requests answered at once.
    buf = b""
    first = True
    while True:
        buf = await receive_until(stream, b"\r\n\r\n", buf)
        if b"\r\n\r\n" not in buf:
            return
        buf = buf.split(b"\r\n\r\n", 1)[1]
        if first:
            first = False
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
            await go.wait()
            await stream.send_all(b"world")
        else:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_a_delay_added_mid_response_delays_the_next_request_and_logs_only_that(
    faultnet_proxy: Factory, nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Issue 33, 4: the session began on the rest of a body, read it as a response,
    # turned opaque: the next request was logged as delayed and was not.
    go = trio.Event()
    log = tmp_path / "events.jsonl"
    address: Address = await start_server(nursery, lambda s: _slow_then_fast(go, s))
    proxy = await faultnet_proxy(address, event_log=str(log))
    assert proxy.address is not None
    client = await trio.open_tcp_stream(*proxy.address)
    with trio.fail_after(10):
        await client.send_all(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"hello"):
            got += await client.receive_some(65536)
        proxy.add_toxic(HttpDelay("d", delay=300))
        go.set()
        while not got.endswith(b"world"):
            got += await client.receive_some(65536)
        t0 = trio.current_time()
        await client.send_all(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"ok"):
            got += await client.receive_some(65536)
        elapsed = trio.current_time() - t0
    await client.aclose()
    assert elapsed >= 0.3
    faults = [r for r in read_jsonl(log).records if r["event"] == "http_fault"]
    assert [(r["path"], r["action"]) for r in faults] == [("/second", "delay")]


async def test_bytes_sent_behind_an_unanswered_upgrade_wait_then_cross_whole(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    # Issue 33, 5: past 64 KiB the proxy stops reading the client (they were kept
    # without limit); once the 101 comes, every byte crosses, in order.
    go = trio.Event()
    upgrade = b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
    switched = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
    payload = bytes(i % 253 for i in range(300_000))

    async def server(stream: trio.SocketStream) -> None:
        got = b""
        while b"\r\n\r\n" not in got:
            got += await stream.receive_some(65536)
        await go.wait()
        await stream.send_all(switched + got.split(b"\r\n\r\n", 1)[1])
        while data := await stream.receive_some(65536):
            await stream.send_all(data)

    proxy = await faultnet_proxy(await start_server(nursery, server))
    proxy.add_toxic(HttpAbort("api", path="/api/*"))
    assert proxy.address is not None
    client = await trio.open_tcp_stream(*proxy.address)
    got = b""
    with trio.fail_after(10):
        await client.send_all(upgrade + payload)  # 300 KB: the kernel's buffers take it
        go.set()
        while len(got) < len(switched) + len(payload):
            got += await client.receive_some(65536)
    await client.aclose()
    assert got == switched + payload
