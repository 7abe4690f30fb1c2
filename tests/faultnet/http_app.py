"""The servers the HTTP toxics' tests put behind a proxy: a small ASGI app served by
hypercorn (a real HTTP/1.1 server), and a recording server that answers canned
responses and keeps every byte it was sent (for byte-identity)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import h11
import trio

from tests.conftest import require_program

Address = tuple[str, int]

#: The body of GET /big: large enough to need many writes.
BIG = bytes(i % 251 for i in range(200_000))


async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """``/big``: :data:`BIG`; ``/chunked``: three chunks, no Content-Length; POST
    anywhere: the request body echoed; anything else: ``"<METHOD> <path> ok"``."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/big":
        out = BIG
    elif scope["method"] == "POST":
        out = body
    else:
        out = f"{scope['method']} {path} ok".encode()
    headers = [(b"content-length", str(len(out)).encode()), (b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


async def serve_app(nursery: trio.Nursery, tls: tuple[str, str] | None = None) -> Address:
    """hypercorn serving :func:`app` on a free loopback port, in *nursery*; over TLS
    with *tls* = (certificate file, key file)."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    if tls is not None:
        config.certfile, config.keyfile = tls
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5

    class Started:
        def __init__(self, task_status: trio.TaskStatus[str]) -> None:
            self.task_status = task_status

        def started(self, binds: Any = None) -> None:
            self.task_status.started(binds[0])

    async def run(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, config, task_status=Started(task_status))  # type: ignore[arg-type]

    url: str = await nursery.start(run)
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


class Recorder:
    """A server answering every request with a fixed response per path, recording the
    raw bytes each connection received and sent (for byte-identity checks)."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []
        self.sent: list[bytearray] = []
        #: Bytes per write of a response (0: the whole response in one write).
        self.piece = 0
        #: Every response sent, in order, over every connection.
        self.responses: list[bytes] = []
        #: When each request's head arrived (trio time), in order.
        self.arrived: list[float] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        got, out = bytearray(), bytearray()
        self.received.append(got)
        self.sent.append(out)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    got += data
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    self.arrived.append(trio.current_time())
                    request = event
                    body = b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    data = self._answer(conn, request, body)
                    self.responses.append(data)
                    out += data
                    step = self.piece or len(data)
                    for i in range(0, len(data), step):
                        await stream.send_all(data[i : i + step])
                    if conn.our_state is h11.MUST_CLOSE:
                        break
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    break
        except (trio.BrokenResourceError, h11.ProtocolError):
            pass
        finally:
            await stream.aclose()

    def _answer(self, conn: h11.Connection, request: h11.Request, body: bytes) -> bytes:
        path = request.target.decode()
        if path.startswith("/chunked"):
            data = conn.send(
                h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])
            )
            for part in (b"alpha ", b"beta ", path.encode()):
                data += conn.send(h11.Data(data=part))
        else:
            payload = body or f"{request.method.decode()} {path}".encode()
            data = conn.send(
                h11.Response(status_code=200, headers=[("content-length", str(len(payload)))])
            )
            if request.method != b"HEAD":
                data += conn.send(h11.Data(data=payload))
        return data + conn.send(h11.EndOfMessage())


async def curl(*args: str, max_time: int = 20) -> subprocess.CompletedProcess[bytes]:
    """Run curl (a real client) with *args*, silent but for errors, within *max_time*
    seconds of its own; its exit code is the caller's to judge."""
    exe = require_program(shutil.which("curl"), "curl")
    with trio.fail_after(max_time + 10):
        return await trio.run_process(
            [exe, "-sS", "--max-time", str(max_time), *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
