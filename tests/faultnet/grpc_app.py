"""A real gRPC server for the HTTP/2 toxics' tests (grpcio's own, generic handlers with
bytes in and out: no protoc), and a client with a service-config retry policy.

``/faultnet.test.Echo/Say`` answers its request; ``/faultnet.test.Echo/Fail`` aborts
with the status its request names (``b"UNAVAILABLE"``), as a real server that fails
does; ``/faultnet.test.Echo/Hang`` never answers (until the call ends). The server counts the calls of each method it saw (its own record: what reached
it, whatever the client believes)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

SAY = "/faultnet.test.Echo/Say"
FAIL = "/faultnet.test.Echo/Fail"
HANG = "/faultnet.test.Echo/Hang"

#: Retry UNAVAILABLE only, 3 attempts in all (gRFC A6); backoff short so a test waits
#: milliseconds, not seconds.
RETRY_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": "faultnet.test.Echo"}],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.01s",
                "maxBackoff": "0.05s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


class Server:
    """A grpcio server on a free loopback port; :attr:`calls` counts what reached it."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "Say": grpc.unary_unary_rpc_method_handler(self._say),
            "Fail": grpc.unary_unary_rpc_method_handler(self._fail),
            "Hang": grpc.unary_unary_rpc_method_handler(self._hang),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("faultnet.test.Echo", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def _say(self, request: bytes, context: Any) -> bytes:
        self._count(SAY)
        return b"said " + request

    def _fail(self, request: bytes, context: Any) -> bytes:
        self._count(FAIL)
        context.abort(grpc.StatusCode[request.decode()], "the real server failed")
        raise AssertionError("abort returns only by raising")

    def _hang(self, request: bytes, context: Any) -> bytes:
        self._count(HANG)
        ended = threading.Event()
        context.add_callback(ended.set)  # the client's deadline, or its cancel
        ended.wait(30)
        return b""


@contextmanager
def serve() -> Iterator[Server]:
    """A started :class:`Server`, stopped (no grace) on exit."""
    server = Server()
    server.server.start()
    try:
        yield server
    finally:
        server.server.stop(None).wait(5)


@contextmanager
def channel(port: int, retries: bool = True) -> Iterator[grpc.Channel]:
    """A plaintext (h2c) channel to 127.0.0.1:*port* with :data:`RETRY_CONFIG`, on a
    connection of its own.

    grpcio shares a subchannel (a TCP connection) between channels with the same target
    and options, and one closed a moment ago may still be in its pool: a call on a new
    channel then went over the last test step's connection, opened before the step's
    toxic, and a hold let the reply through (1 in ~100 runs). A local pool per channel
    makes a new channel a new connection, as the tests assume."""
    options: list[tuple[str, Any]] = [
        ("grpc.enable_retries", 1 if retries else 0),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if retries:
        options.append(("grpc.service_config", json.dumps(RETRY_CONFIG)))
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as chan:
        yield chan


def call(chan: grpc.Channel, method: str, payload: bytes, timeout: float = 10) -> bytes:
    """One unary call; raises grpc.RpcError with the status the client saw."""
    result: bytes = chan.unary_unary(method)(payload, timeout=timeout)
    return result
