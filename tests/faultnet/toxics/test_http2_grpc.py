"""HTTP/2 and gRPC through the HTTP toxics, judged by grpcio (gRPC's C-core client with
a service-config retry policy, against grpcio's own server): an injected status must be
retried exactly as the real server's, and a toxic that matches nothing passes gRPC."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.testing import start_server
from faultnet.toxics import GrpcStatus, Http2Goaway, Http2Reset, HttpAbort, HttpDelay, HttpHold
from faultnet.toxics.http import HttpToxic
from tests.faultnet import grpc_app
from tests.faultnet.grpc_app import FAIL, HANG, SAY

Factory = Callable[..., Awaitable[Proxy]]


@pytest.fixture
def server() -> Iterator[grpc_app.Server]:
    with grpc_app.serve() as srv:
        yield srv


def port(proxy: Proxy) -> int:
    assert proxy.address is not None
    return proxy.address[1]


def faults(log: Path) -> list[dict[str, Any]]:
    """The log's http_fault records; none of its connections may have met a bug (a
    session's exception resets its connection, which grpcio would retry unseen)."""
    records = read_jsonl(log).records
    assert not [r for r in records if r["event"] == "conn_error"]
    return [r for r in records if r["event"] == "http_fault"]


async def rpc(
    proxy_port: int, method: str, payload: bytes, retries: bool = True, timeout: float = 10
) -> Any:
    """One call in a thread (grpcio blocks): the reply, or the grpc.RpcError raised. The
    channel is connected first, so a short *timeout* is the call's alone (at load ~12 a
    connect and the call within 0.5 s missed: the server saw no call)."""

    def run() -> Any:
        with grpc_app.channel(proxy_port, retries) as chan:
            grpc.channel_ready_future(chan).result(timeout=10)
            try:
                return grpc_app.call(chan, method, payload, timeout)
            except grpc.RpcError as error:
                return error

    return await trio.to_thread.run_sync(run)


async def test_an_abort_with_no_rule_answers_each_grpc_call_not_the_preface(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path
) -> None:
    # Issue 33, 6: the preface read as an HTTP/1 request; abort broke the framing
    # ("Frame size 4740180"). Over HTTP/2 a 503 is an UNAVAILABLE the client retries.
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    proxy.add_toxic(HttpAbort("all"))
    got = await rpc(port(proxy), SAY, b"hi")
    assert isinstance(got, grpc.RpcError), got
    assert got.code() == grpc.StatusCode.UNAVAILABLE, got.details()
    assert "503" in (got.details() or ""), got.details()
    assert server.calls[SAY] == 0
    assert [(r["method"], r["path"], r["action"]) for r in faults(log)] == [
        ("POST", SAY, "abort")
    ] * 3, "three attempts, each one answered by the toxic"


async def test_a_delay_with_no_rule_delays_a_grpc_reply(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path
) -> None:
    # Issue 33, 6: "delay and reset are logged and never applied".
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    proxy.add_toxic(HttpDelay("slow", delay=300))
    start = trio.current_time()
    got = await rpc(port(proxy), SAY, b"hi")
    assert got == b"said hi"
    assert trio.current_time() - start >= 0.3
    assert [(r["path"], r["action"], r["delay_ms"]) for r in faults(log)] == [(SAY, "delay", 300)]


# -- retries: the toxic's status against the real server's ------------------------------


async def attempts_through_toxic(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path, status: str
) -> tuple[str, int, int]:
    """A call through ``grpc_status`` answering *status* to every attempt: the status
    the client ends with, the attempts the toxic answered (its log), and the calls the
    server saw (none, or the toxic let one through)."""
    log = tmp_path / f"toxic-{status}.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    proxy.add_toxic(GrpcStatus("g", path="/faultnet.test.Echo/*", status=status))
    got = await rpc(port(proxy), SAY, b"hi")
    assert isinstance(got, grpc.RpcError), got
    return got.code().name, len(faults(log)), server.calls[SAY]


async def attempts_at_real_server(
    faultnet_proxy: Factory, server: grpc_app.Server, status: str
) -> tuple[str, int]:
    """The same call answered *status* by the real server (through a proxy with no
    toxic): the status the client ends with and the attempts the server saw."""
    proxy = await faultnet_proxy(("127.0.0.1", server.port))
    before = server.calls[FAIL]
    got = await rpc(port(proxy), FAIL, status.encode())
    assert isinstance(got, grpc.RpcError), got
    return got.code().name, server.calls[FAIL] - before


@pytest.mark.parametrize(
    ("status", "expected_attempts"),
    [("UNAVAILABLE", 3), ("INVALID_ARGUMENT", 1), ("DEADLINE_EXCEEDED", 1)],
)
async def test_grpcio_retries_an_injected_status_as_it_retries_the_real_servers(
    faultnet_proxy: Factory,
    server: grpc_app.Server,
    tmp_path: Path,
    status: str,
    expected_attempts: int,
) -> None:
    # The retry policy names UNAVAILABLE only, maxAttempts 3: the real server's
    # UNAVAILABLE is tried three times, INVALID_ARGUMENT and DEADLINE_EXCEEDED once.
    real_status, real_attempts = await attempts_at_real_server(faultnet_proxy, server, status)
    assert (real_status, real_attempts) == (status, expected_attempts)
    code, injected, reached = await attempts_through_toxic(faultnet_proxy, server, tmp_path, status)
    assert (code, injected, reached) == (real_status, real_attempts, 0)


async def test_the_retry_comparison_goes_red_when_the_toxic_answers_another_status(
    faultnet_proxy: Factory,
    server: grpc_app.Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The breakage: the toxic says INTERNAL where it was asked for UNAVAILABLE. The
    # client then does not retry, and the comparison above sees it.
    import faultnet.toxics.grpc as module

    real = module.grpc_answer
    monkeypatch.setattr(module, "grpc_answer", lambda status, message: real("INTERNAL", message))
    real_status, real_attempts = await attempts_at_real_server(
        faultnet_proxy, server, "UNAVAILABLE"
    )
    got = await attempts_through_toxic(faultnet_proxy, server, tmp_path, "UNAVAILABLE")
    assert got != (real_status, real_attempts, 0)
    assert got == ("INTERNAL", 1, 0)


async def test_a_count_of_two_unavailable_makes_the_third_attempt_reach_the_server(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    proxy.add_toxic(GrpcStatus("g", path=SAY, status="UNAVAILABLE", count=2))
    assert await rpc(port(proxy), SAY, b"hi") == b"said hi"
    assert server.calls[SAY] == 1
    records = faults(log)
    assert [(r["action"], r["grpc_status"], r["protocol"]) for r in records] == [
        ("grpc_status", "UNAVAILABLE", "h2")
    ] * 2
    # Without the retry policy the first injected UNAVAILABLE is the client's answer.
    proxy.remove_toxic("g")
    proxy.add_toxic(GrpcStatus("g2", path=SAY, status="UNAVAILABLE", count=1))
    got = await rpc(port(proxy), SAY, b"hi", retries=False)
    assert isinstance(got, grpc.RpcError) and got.code() == grpc.StatusCode.UNAVAILABLE
    assert got.details() == "injected by faultnet"
    assert server.calls[SAY] == 1


@pytest.mark.parametrize(
    ("toxic", "said", "action"),
    [
        # RST_STREAM REFUSED_STREAM: the server did nothing with the stream.
        (Http2Reset("f", path=SAY, count=2), "RST_STREAM", "rst_stream"),
        # GOAWAY whose last stream is below the call's: the server did not process it.
        (Http2Goaway("f", path=SAY, count=2), "GOAWAY", "goaway"),
    ],
)
async def test_a_refused_stream_or_goaway_is_unavailable_and_retried_by_the_policy(
    faultnet_proxy: Factory,
    server: grpc_app.Server,
    tmp_path: Path,
    toxic: HttpToxic,
    said: str,
    action: str,
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    proxy.add_toxic(toxic)
    got = await rpc(port(proxy), SAY, b"hi", retries=False)
    assert isinstance(got, grpc.RpcError) and got.code() == grpc.StatusCode.UNAVAILABLE
    assert said in (got.details() or ""), got.details()
    assert server.calls[SAY] == 0
    assert await rpc(port(proxy), SAY, b"hi") == b"said hi"  # on a new connection
    assert [r["action"] for r in faults(log)] == [action] * 2
    assert server.calls[SAY] == 1


async def test_a_cancelled_stream_is_not_retried(
    faultnet_proxy: Factory, server: grpc_app.Server
) -> None:
    proxy = await faultnet_proxy(("127.0.0.1", server.port))
    proxy.add_toxic(Http2Reset("c", path=SAY, error_code="CANCEL", count=1))
    got = await rpc(port(proxy), SAY, b"hi")
    assert isinstance(got, grpc.RpcError) and got.code() == grpc.StatusCode.CANCELLED
    assert server.calls[SAY] == 0
    assert await rpc(port(proxy), SAY, b"hi") == b"said hi"


async def test_a_held_call_meets_its_deadline_as_at_a_server_that_never_answers(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(("127.0.0.1", server.port), event_log=str(log))
    real = await rpc(port(proxy), HANG, b"", timeout=0.5)
    assert isinstance(real, grpc.RpcError) and server.calls[HANG] == 1
    proxy.add_toxic(HttpHold("h", path=SAY))
    held = await rpc(port(proxy), SAY, b"hi", timeout=0.5)
    assert isinstance(held, grpc.RpcError)
    assert held.code() == real.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert server.calls[SAY] == 0
    assert [r["action"] for r in faults(log)] == ["hold"]


async def test_a_header_rule_and_a_seeded_percent_pick_the_same_grpc_calls_again(
    faultnet_proxy: Factory, server: grpc_app.Server, tmp_path: Path
) -> None:
    # The rule is the HTTP toxics' own: metadata is headers, x-request-id the identity.
    def calls(proxy_port: int) -> list[str]:
        failed = []
        with grpc_app.channel(proxy_port, retries=False) as chan:
            for i in range(30):
                for tenant in ("blue-1", "red-1"):
                    metadata = (("x-tenant", tenant), ("x-request-id", f"r{i}"))
                    try:
                        chan.unary_unary(SAY)(b"hi", timeout=10, metadata=metadata)
                    except grpc.RpcError:
                        failed.append(f"{tenant} r{i}")
        return failed

    runs = []
    for seed in (5, 5, 6):
        log = tmp_path / f"seed{seed}-{len(runs)}.jsonl"
        proxy = await faultnet_proxy(("127.0.0.1", server.port), seed=seed, event_log=str(log))
        proxy.add_toxic(GrpcStatus("g", header="x-tenant: blue*", percent=50))
        failed = await trio.to_thread.run_sync(calls, port(proxy))
        assert len(faults(log)) == len(failed)
        runs.append(failed)
    assert runs[0] == runs[1], "the same seed faulted other calls"
    assert runs[0] != runs[2], "another seed faulted the same calls"
    assert all(f.startswith("blue") for f in runs[0] + runs[2])
    # 50 % of 30, drawn: 6 and 24 are more than 3 standard deviations out.
    assert 6 <= len(runs[0]) <= 24, runs[0]


# -- passing through --------------------------------------------------------------------


class Tap:
    """A relay that keeps every byte each way, per connection, in order of accept."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up: list[bytearray] = []
        self.down: list[bytearray] = []
        #: Set when a connection's both ways have ended.
        self.ended = trio.Event()

    async def handle(self, client: trio.SocketStream) -> None:
        up, down = bytearray(), bytearray()
        self.up.append(up)
        self.down.append(down)
        server = await trio.open_tcp_stream(*self.target)

        async def pump(src: trio.SocketStream, dst: trio.SocketStream, seen: bytearray) -> None:
            while data := await src.receive_some(65536):
                seen += data
                await dst.send_all(data)
            await dst.send_eof()

        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, server, up)
            nursery.start_soon(pump, server, client, down)
        self.ended.set()


async def test_a_toxic_that_matches_nothing_passes_grpc_byte_identical(
    faultnet_proxy: Factory, server: grpc_app.Server, nursery: trio.Nursery
) -> None:
    # client -> outer tap -> proxy (toxics) -> inner tap -> server: both taps must see
    # the same bytes each way, on one connection carrying several calls.
    inner = Tap(("127.0.0.1", server.port))
    proxy = await faultnet_proxy(await start_server(nursery, inner.handle))
    proxy.add_toxic(GrpcStatus("never", path="/other.Service/*"))
    proxy.add_toxic(HttpAbort("never2", header="x-nobody"))
    proxy.add_toxic(HttpDelay("never3", method="GET", delay=5000))
    assert proxy.address is not None
    outer = Tap(proxy.address)
    outer_port = (await start_server(nursery, outer.handle))[1]

    def calls() -> list[Any]:
        with grpc_app.channel(outer_port) as chan:
            got = [grpc_app.call(chan, SAY, b"x" * n) for n in (1, 100, 70_000)]
            try:
                grpc_app.call(chan, FAIL, b"INVALID_ARGUMENT")
            except grpc.RpcError as error:
                got.append(error.code())
            return got

    got = await trio.to_thread.run_sync(calls)
    assert got[:3] == [b"said " + b"x" * n for n in (1, 100, 70_000)]
    assert got[3] == grpc.StatusCode.INVALID_ARGUMENT
    with trio.fail_after(10):  # the channel's close ends both taps' connections
        await outer.ended.wait()
        await inner.ended.wait()
    assert len(outer.up) == len(inner.up) == 1
    assert bytes(outer.up[0]) == bytes(inner.up[0])
    assert bytes(outer.down[0]) == bytes(inner.down[0])
    assert bytes(outer.up[0]).startswith(b"PRI * HTTP/2.0")
