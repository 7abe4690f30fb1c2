"""The redis toxic through a real proxy (each data plane) in front of a real
redis-server, driven by redis-py: what each fault looks like to a client, that a command
no rule faults crosses, pub/sub and RESP3 pushes pass, one ``redis_fault`` record per
faulted command; and the toxic through the HTTP API and the CLI's ``toxic add``."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.exceptions as rexc
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.server import RunningServer
from faultnet.toxics import TOXICS, Redis
from tests.faultnet.server.test_server_cli import Cli
from tests.faultnet.toxics.test_redis_fidelity import redis_server

Factory = Callable[..., Awaitable[Proxy]]


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield port


@pytest.fixture
async def proxy(faultnet_proxy: Factory, redis_port: int, tmp_path: Path, each_plane: str) -> Proxy:
    log = str(tmp_path / "events.jsonl")
    return await faultnet_proxy(("127.0.0.1", redis_port), event_log=log, dataplane=each_plane)


def client(proxy: Proxy, **kwargs: Any) -> redis.Redis:
    assert proxy.address is not None
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    kwargs.setdefault("socket_timeout", 5)
    return redis.Redis(port=proxy.address[1], **kwargs)


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


def faults(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(tmp_path / "events.jsonl").records if r["event"] == "redis_fault"]


def test_redis_is_one_registered_both_stream_type() -> None:
    assert TOXICS["redis"] is Redis and Redis.both_streams
    with pytest.raises(ValueError, match="delay_ms"):
        Redis(fault="delay")
    with pytest.raises(ValueError, match="MOVED"):
        Redis(error="MOVED 3999")
    with pytest.raises(ValueError, match="one line"):
        Redis(error="ERR a\r\n+OK")
    with pytest.raises(ValueError, match="fault must be"):
        Redis(fault="explode")
    with pytest.raises(ValueError, match="unknown attribute 'comand'"):
        Redis.check_attributes({"comand": "GET"})
    toxic = Redis(fault="delay", delay_ms=100)
    with pytest.raises(ValueError):
        toxic.update({"delay_ms": 0})  # refused, nothing changed
    assert toxic.delay_ms == 100
    Redis(error="MOVED 3999 127.0.0.1:6381")
    Redis(error="-ASK 1 [::1]:7000")


async def test_a_command_no_rule_faults_crosses(proxy: Proxy, tmp_path: Path) -> None:
    proxy.add_toxic(Redis(command="FLUSHALL"))
    r = client(proxy)
    assert await in_thread(lambda: r.set("x", "1") and r.get("x")) == b"1"
    assert faults(tmp_path) == []


async def test_a_pipelined_error_comes_in_its_place_and_is_logged_once(
    proxy: Proxy, tmp_path: Path
) -> None:
    proxy.add_toxic(Redis("ro", command="set", key="user:*", error="READONLY You can't write"))
    r = client(proxy)

    def pipeline() -> list[Any]:
        r.set("other", "o")
        pipe = r.pipeline(transaction=False)
        pipe.get("other").set("user:1", "v").get("other").set("user:2", "w")
        return list(pipe.execute(raise_on_error=False))

    got = await in_thread(pipeline)
    assert got[0] == got[2] == b"o"
    assert isinstance(got[1], rexc.ReadOnlyError) and isinstance(got[3], rexc.ReadOnlyError)
    records = faults(tmp_path)
    assert [(f["command"], f["key"], f["action"], f["toxic"]) for f in records] == [
        ("SET", "user:1", "error", "ro"),
        ("SET", "user:2", "error", "ro"),
    ]
    assert await in_thread(lambda: r.exists("user:1")) == 0  # never reached the server


async def test_count_fails_the_first_then_the_retry_gets_through(proxy: Proxy) -> None:
    text = "LOADING Redis is loading the dataset in memory"
    proxy.add_toxic(Redis(command="GET", count=2, error=text))
    retry = Retry(NoBackoff(), 3, supported_errors=(rexc.BusyLoadingError,))
    r = client(proxy, retry=retry)
    assert await in_thread(lambda: r.get("nothing")) is None


async def test_a_delayed_reply_comes_no_sooner_than_its_delay(proxy: Proxy) -> None:
    proxy.add_toxic(Redis(fault="delay", command="PING", delay_ms=200))
    r = client(proxy)

    def timed() -> float:
        r.echo("warm")  # the connection made first: only the PING is timed
        t = time.monotonic()
        r.ping()
        return time.monotonic() - t

    assert await in_thread(timed) >= 0.2


async def test_hold_times_the_client_out_and_close_cuts_the_reply(proxy: Proxy) -> None:
    toxic = Redis(fault="hold", command="GET")
    proxy.add_toxic(toxic)
    r = client(proxy, socket_timeout=0.3)
    with pytest.raises(rexc.TimeoutError):
        await in_thread(lambda: r.get("k"))
    proxy.update_toxic(toxic.name, {"fault": "close"})
    with pytest.raises(rexc.ConnectionError):
        await in_thread(lambda: client(proxy).get("k"))


async def test_percent_is_drawn_by_the_command_s_identity(proxy: Proxy) -> None:
    toxic = Redis(command="GET", percent=50)
    proxy.add_toxic(toxic)

    def fates() -> list[bool]:
        r = client(proxy)
        out = []
        for i in range(40):
            try:
                r.get(f"k{i}")
                out.append(False)
            except rexc.ResponseError:
                out.append(True)
        r.close()
        return out

    first, second = await in_thread(fates), await in_thread(fates)
    assert first == second and 5 < sum(first) < 35  # seeded: the same commands, each time


async def test_pub_sub_and_resp3_pushes_pass(proxy: Proxy) -> None:
    proxy.add_toxic(Redis(command="GET", key="faulted"))

    def pubsub() -> Any:
        r = client(proxy)
        sub = r.pubsub()
        sub.subscribe("news")
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        client(proxy).publish("news", "hello world")
        message = sub.get_message(timeout=5)
        sub.close()
        return message["data"]

    assert await in_thread(pubsub) == b"hello world"

    def resp3() -> Any:
        r = client(proxy, protocol=3)
        with pytest.raises(rexc.ResponseError):
            r.get("faulted")
        return r.hgetall("none"), r.get("faulted:not")

    assert await in_thread(resp3) == ({}, None)


async def test_the_api_and_the_cli_add_a_redis_toxic(
    faultnet_server: RunningServer, redis_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as api:
        body = {"name": "r", "listen": "127.0.0.1:0", "upstream": f"127.0.0.1:{redis_port}"}
        r = await api.post("/proxies", json=body)
        assert r.status_code == 201, r.text
        listen = r.json()["listen"]
        bad = {"type": "redis", "attributes": {"error": "MOVED nowhere"}}
        r = await api.post("/proxies/r/toxics", json=bad)
        assert r.status_code == 400 and "MOVED" in r.json()["error"], r.text
    cli = Cli(faultnet_server.url, capsys)
    await cli.ok("toxic", "add", "r", "-t", "redis", "-n", "moved", "-a", "command=GET",
                 "-a", "error=MOVED 3999 127.0.0.1:6381")  # fmt: skip
    port = int(listen.rsplit(":", 1)[1])
    r2 = redis.Redis(port=port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    with pytest.raises(rexc.MovedError) as moved:
        await trio.to_thread.run_sync(functools.partial(r2.get, "k"))
    assert (moved.value.slot_id, moved.value.port) == (3999, 6381)
