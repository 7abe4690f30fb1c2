"""The API's HTTP/1.1 server (faultnet.server.http_server) on real loopback sockets,
serving a small ASGI app: each of the semantics its docstring states, bytes in and
bytes out, one table row per exchange."""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from faultnet.server import http_server
from faultnet.server.http_server import HttpLimits, serve_http

#: Bound on any one answer here: loaded CI answers in milliseconds, never near it.
ANSWER_S = 10.0


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/echo``: the body back; ``/ignore``: answers without reading the body;
    ``/slow``: answers after 0.3 s; ``/boom``: raises before answering."""
    body = b""
    if scope["path"] == "/echo":
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    elif scope["path"] == "/slow":
        await trio.sleep(0.3)  # the request in flight while the server stops
        body = b"slow"
    elif scope["path"] == "/boom":
        raise RuntimeError("a bug")
    else:
        body = f"{scope['method']} {scope['path']} {scope['query_string'].decode()}".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _served(limits: HttpLimits | None = None) -> AsyncIterator[tuple[str, trio.CancelScope]]:
    """The server's URL, and the scope whose cancellation stops it."""
    limits = limits or HttpLimits(keep_alive_s=30, read_timeout_s=5)
    stop = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[str]) -> None:
        with stop:
            await serve_http(_app, "127.0.0.1", 0, limits, task_status=task_status)

    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve), stop
        stop.cancel()


async def _connect(url: str) -> trio.SocketStream:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return await trio.open_tcp_stream(host.strip("[]"), int(port))


async def _read_all(stream: trio.SocketStream) -> bytes:
    """Everything until the server's FIN (within :data:`ANSWER_S`)."""
    got = b""
    with trio.fail_after(ANSWER_S):
        while chunk := await stream.receive_some(65536):
            got += chunk
    return got


async def _read_answer(stream: trio.SocketStream, body_end: bytes) -> bytes:
    got = b""
    with trio.fail_after(ANSWER_S):
        while b"\r\n\r\n" not in got or not got.endswith(body_end):
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed without an answer: {got!r}"
            got += chunk
    return got


def _req(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


#: (request bytes, what the answer starts with, what it ends with, closed after it).
EXCHANGES = [
    (_req("GET", "/a%20b?x=1"), b"HTTP/1.1 200", b"GET /a b x=1", False),
    (_req("POST", "/echo", "Content-Length: 5", body=b"hello"), b"HTTP/1.1 200", b"hello", False),
    (
        _req(
            "POST", "/echo", "Transfer-Encoding: chunked", body=b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        ),
        b"HTTP/1.1 200",
        b"abcde",
        False,
    ),
    # HEAD: the head (its Content-Length kept), no body.
    (_req("HEAD", "/x"), b"HTTP/1.1 200", b"content-length: 8\r\n\r\n", False),
    # A body the app did not read is dropped; the connection carries the next request.
    (
        _req("POST", "/ignore", "Content-Length: 3", body=b"xyz"),
        b"HTTP/1.1 200",
        b"POST /ignore ",
        False,
    ),
    (_req("GET", "/x", "Connection: close"), b"HTTP/1.1 200", b"GET /x ", True),
    # A bug in the app: a 500, the connection kept.
    (_req("GET", "/boom"), b"HTTP/1.1 500", b"\r\n\r\n", False),
    # Malformed: h11's status hint, the API's JSON error, closed.
    (b"NOT HTTP\r\n\r\n", b"HTTP/1.1 400", b'"status": 400}', True),
    # A head past h11's 16 KiB still incomplete after one read (64 KiB): 431.
    (_req("GET", "/x", "X: " + "y" * 100_000), b"HTTP/1.1 431", b'"status": 431}', True),
]


@pytest.mark.parametrize(("request_bytes", "starts", "ends", "closed"), EXCHANGES)
async def test_an_exchange(request_bytes: bytes, starts: bytes, ends: bytes, closed: bool) -> None:
    async with _served() as (url, _), await _connect(url) as stream:
        await stream.send_all(request_bytes)
        if closed:
            answer = await _read_all(stream)
            assert b"connection: close" in answer.lower()
        else:
            answer = await _read_answer(stream, ends)
            # The connection carries the next request.
            await stream.send_all(_req("GET", "/next"))
            assert (await _read_answer(stream, b"GET /next ")).startswith(b"HTTP/1.1 200")
        assert answer.startswith(starts), answer
        assert answer.endswith(ends), answer


async def test_a_malformed_request_is_a_json_400_with_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _served() as (url, _), await _connect(url) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nHost\r\n\r\n")
        answer = await _read_all(stream)
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body["status"] == 400 and body["error"].startswith("bad request: ")
    assert not [r for r in caplog.records if r.exc_info]


async def test_expect_100_continue_is_answered_when_the_app_reads() -> None:
    async with _served() as (url, _), await _connect(url) as stream:
        await stream.send_all(_req("POST", "/echo", "Content-Length: 2", "Expect: 100-continue"))
        assert (await _read_answer(stream, b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        await stream.send_all(b"ok")
        assert (await _read_answer(stream, b"ok")).startswith(b"HTTP/1.1 200")


async def test_a_stalled_head_is_closed_after_the_read_timeout() -> None:
    limits = HttpLimits(keep_alive_s=30, read_timeout_s=0.5)
    async with _served(limits) as (url, _), await _connect(url) as stream:
        # The clock read before the send: the server's timer starts when it reads the
        # head's first part, which can come before this task runs again after send_all.
        t0 = trio.current_time()
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        assert await _read_all(stream) == b""
        assert trio.current_time() - t0 >= 0.5


async def test_an_idle_connection_is_closed_with_a_fin_after_the_keep_alive() -> None:
    limits = HttpLimits(keep_alive_s=0.5, read_timeout_s=5)
    async with _served(limits) as (url, _), await _connect(url) as stream:
        # The clock read before the request: the keep-alive starts when the server has
        # sent its answer, which is before this task reads it.
        t0 = trio.current_time()
        await stream.send_all(_req("GET", "/x"))
        await _read_answer(stream, b"GET /x ")
        assert await _read_all(stream) == b""  # a FIN: an RST would raise here
        assert trio.current_time() - t0 >= 0.5


async def test_a_request_in_flight_is_answered_when_the_server_stops() -> None:
    async with _served() as (url, stop), await _connect(url) as stream:
        await stream.send_all(_req("GET", "/slow"))
        await trio.testing.wait_all_tasks_blocked()  # the app is in its sleep
        stop.cancel()
        answer = await _read_all(stream)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"slow")


async def test_the_bound_address_is_reported_ipv6_in_brackets() -> None:
    limits = HttpLimits(keep_alive_s=30, read_timeout_s=5)
    async with trio.open_nursery() as nursery:
        try:
            url = await nursery.start(serve_http, _app, "::1", 0, limits)
        except OSError as exc:
            pytest.skip(f"no IPv6 loopback here: {exc}")
        assert url.startswith("http://[::1]:")
        async with await _connect(url) as stream:
            await stream.send_all(_req("GET", "/six"))
            assert (await _read_answer(stream, b"GET /six ")).startswith(b"HTTP/1.1 200")
        nursery.cancel_scope.cancel()


async def test_out_of_descriptors_the_accept_loop_waits_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """accept() failing with EMFILE (a real one: this process's limit lowered to the
    descriptors it holds) is one warning and a retry, not a crash or a traceback."""
    caplog.set_level(logging.WARNING, logger=http_server.__name__)
    warned = trio.Event()
    signal = logging.Handler()
    signal.emit = lambda record: warned.set()  # type: ignore[method-assign]
    logging.getLogger(http_server.__name__).addHandler(signal)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with _served() as (url, _):
        client = trio.socket.socket()  # made before the limit: connecting takes no new one
        fillers: list[int] = []
        try:
            highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
            # Room for at least the two fillers freed below, whatever holes there are.
            resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 3, hard))
            try:
                while True:
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
            host, _, port = url.removeprefix("http://").rpartition(":")
            await client.connect((host, int(port)))
            with trio.fail_after(ANSWER_S):
                await warned.wait()
            # Two free: one for the connection, one for the accept() after it (Linux
            # takes the descriptor before it looks for a connection: with none free the
            # next accept() fails again, a new episode, even with no client waiting).
            os.close(fillers.pop())
            os.close(fillers.pop())
            stream = trio.SocketStream(client)
            await stream.send_all(_req("GET", "/after"))
            assert (await _read_answer(stream, b"GET /after ")).startswith(b"HTTP/1.1 200")
        finally:
            for fd in fillers:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            client.close()
            logging.getLogger(http_server.__name__).removeHandler(signal)
    assert len(caplog.records) == 1 and not caplog.records[0].exc_info
