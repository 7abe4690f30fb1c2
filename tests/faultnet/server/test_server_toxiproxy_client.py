"""toxiproxy-python (PyPI, unchanged) driving the faultnet server end to end.

The client is blocking (requests), so each call runs in a worker thread while the server
runs in the test's trio loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import toxiproxy
import trio
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from faultnet.addresses import parse_address
from faultnet.controls import assert_accepting, assert_refusing, assert_severed
from faultnet.server import RunningServer
from faultnet.testing import start_server

T = TypeVar("T")


async def call(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


@pytest.fixture
def client(faultnet_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> toxiproxy.Toxiproxy:
    host, _, port = faultnet_server.url.removeprefix("http://").rpartition(":")
    monkeypatch.setattr(APIConsumer, "host", host)
    monkeypatch.setattr(APIConsumer, "port", int(port))
    return toxiproxy.Toxiproxy()


async def rtt(stream: trio.SocketStream) -> float:
    t0 = trio.current_time()
    await stream.send_all(b"ping")
    got = b""
    with trio.fail_after(5):
        while len(got) < 4:
            chunk = await stream.receive_some()
            assert chunk
            got += chunk
    return trio.current_time() - t0


async def test_toxiproxy_python_end_to_end(
    client: toxiproxy.Toxiproxy, nursery: trio.Nursery
) -> None:
    up_port = (await start_server(nursery))[1]

    assert await call(client.running)
    assert b'"version"' in await call(client.version)
    proxy = await call(client.create, upstream=f"127.0.0.1:{up_port}", name="echo")
    assert proxy.enabled is True and parse_address(proxy.listen)[1] != 0
    where = parse_address(proxy.listen)
    assert set(await call(client.proxies)) == {"echo"}
    with pytest.raises(ProxyExists):
        await call(client.create, upstream="127.0.0.1:1", name="echo")

    # A toxic, live on a connection already open.
    stream = await trio.open_tcp_stream(*where)
    assert await rtt(stream) < 0.1
    await call(proxy.add_toxic, type="latency", attributes={"latency": 120})
    assert await rtt(stream) >= 0.12
    toxics = await call(proxy.toxics)
    assert set(toxics) == {"latency_downstream"}
    assert toxics["latency_downstream"].attributes == {"latency": 120, "jitter": 0}
    with pytest.raises(InvalidToxic):
        await call(proxy.add_toxic, type="no_such_toxic")

    # Disable = refused and connections closed; enable = accepting on the same address.
    await call(proxy.disable)
    await assert_refusing(where)
    await assert_severed(stream)
    fetched = await call(client.get_proxy, "echo")
    assert fetched.enabled is False
    await call(proxy.enable)
    await assert_accepting(where)

    def down_and_up() -> bool:  # the client's context manager: disable, then enable
        with proxy.down():
            return client.get_proxy("echo").enabled

    assert await call(down_and_up) is False
    assert (await call(client.get_proxy, "echo")).enabled is True

    # reset: every proxy enabled, every toxic removed.
    await call(proxy.disable)
    assert await call(client.reset)
    assert (await call(client.get_proxy, "echo")).enabled is True
    assert await call(proxy.toxics) == {}
    stream = await trio.open_tcp_stream(*where)
    assert await rtt(stream) < 0.1
    await stream.aclose()

    await call(proxy.add_toxic, type="timeout", stream="upstream", name="t")
    assert await call(proxy.destroy_toxic, "t")
    with pytest.raises(NotFound):
        await call(proxy.destroy_toxic, "t")

    # populate (the client's own create-or-replace loop over GET /proxies).
    made = await call(
        client.populate,
        [{"name": "second", "upstream": f"127.0.0.1:{up_port}", "listen": "127.0.0.1:0"}],
    )
    assert [p.name for p in made] == ["second"]
    assert await call(client.destroy, proxy)
    await call(client.destroy_all)
    assert await call(client.proxies) == {}
    await assert_refusing(where)


async def test_toxiproxy_python_adds_and_removes_an_http_toxic_unchanged(
    client: toxiproxy.Toxiproxy, nursery: trio.Nursery, faultnet_server: RunningServer
) -> None:
    import httpx

    from tests.faultnet.http_app import serve_app

    host, port = await serve_app(nursery)
    proxy = await call(client.create, upstream=f"{host}:{port}", name="web")
    base = "http://{}:{}".format(*parse_address(proxy.listen))
    attributes = {"path": "/api/*", "status": 503, "body": "busy", "count": 1}
    await call(proxy.add_toxic, type="http_abort", name="api503", attributes=attributes)
    listed = (await call(proxy.toxics))["api503"]
    assert listed.type == "http_abort"
    assert {k: listed.attributes[k] for k in attributes} == attributes
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.get(base + "/api/x")
        assert (r.status_code, r.text) == (503, "busy")
        assert (await http.get(base + "/api/x")).status_code == 200  # count=1
        await call(proxy.destroy_toxic, "api503")
        assert await call(proxy.toxics) == {}
    # An attribute of the wrong type is Toxiproxy's 400, which the client raises.
    with pytest.raises(InvalidToxic):
        await call(proxy.add_toxic, type="http_abort", attributes={"status": "x"})
