"""The HTTP API end to end: every route, every error response, on real loopback sockets.

The server runs in the test (the plugin's ``faultnet_server`` fixture: the API's own
HTTP/1.1 server on a free port) and is driven with httpx; proxied connections are real sockets to
a real echo server.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from faultnet.addresses import parse_address
from faultnet.controls import (
    assert_accepting,
    assert_frozen,
    assert_refusing,
    assert_reset,
    assert_severed,
    assert_syn_dropped,
)
from faultnet.proxy import Proxy
from faultnet.server import RunningServer, open_server
from faultnet.testing import echo_back, start_server, wait_until

Address = tuple[str, int]


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> Address:
    return await start_server(nursery)


@pytest.fixture
async def api(faultnet_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as client:
        yield client


async def create(api: httpx.AsyncClient, name: str, up: Address, **extra: Any) -> dict[str, Any]:
    r = await api.post("/proxies", json={"name": name, "upstream": f"{up[0]}:{up[1]}", **extra})
    assert r.status_code == 201, r.text
    return r.json()


async def roundtrip(stream: trio.SocketStream, payload: bytes = b"ping") -> bytes:
    with trio.fail_after(5):
        return await echo_back(stream, payload)


async def until_listed(
    api: httpx.AsyncClient, name: str, count: int, bound_s: float = 2.0
) -> list[dict[str, Any]]:
    """Proxy *name*'s connection listing once it has *count* entries. A connection its
    client closed stays listed until the upstream has closed its side too, and no event
    of that reaches the test: the listing is polled (every 10 ms, *bound_s* at most)."""
    with trio.move_on_after(bound_s):
        while True:
            conns = (await api.get(f"/proxies/{name}/connections")).json()
            if len(conns) == count:
                return conns
            await trio.sleep(0.01)
    raise AssertionError(f"{name} did not list {count} connection(s) within {bound_s} s")


def assert_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == status
    assert body["error"].startswith(message), body


# -- version, documents, index --------------------------------------------------------


async def test_version_openapi_and_empty_index(api: httpx.AsyncClient) -> None:
    r = await api.get("/version")
    assert r.status_code == 200 and isinstance(r.json()["version"], str)
    assert (await api.get("/proxies")).json() == {}
    doc = (await api.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    for path in (
        "/proxies",
        "/populate",
        "/proxies/{proxy}",
        "/proxies/{proxy}/toxics",
        "/proxies/{proxy}/toxics/{toxic}",
        "/reset",
        "/version",
        "/proxies/{proxy}/faults",
        "/proxies/{proxy}/connections",
        "/proxies/{proxy}/events",
        "/events",
    ):
        assert path in doc["paths"], path
    assert set(doc["paths"]["/proxies/{proxy}"]) == {"get", "post", "patch", "delete"}


async def test_unknown_route_method_and_browser(api: httpx.AsyncClient) -> None:
    assert_error(await api.get("/nope"), 404, "not found")
    assert_error(await api.get("/proxies/"), 404, "not found")  # not a redirect
    big = b"[" + b"{}," * 400_000 + b"{}]"  # 1.2 MB
    r = await api.post("/populate", content=big)
    assert_error(r, 413, "bad request body: larger")
    # Refused unread, the body leaves the connection unusable and the server closes it.
    # The answer must say so: a keep-alive client that reused the connection lost its
    # next request (the DELETE below) whenever the close came after it (under load: the
    # 413 went out before the body was all in).
    assert r.headers["connection"] == "close"
    r = await api.delete("/version")
    assert_error(r, 405, "method not allowed")
    assert "GET" in r.headers["allow"]
    r = await api.get("/proxies", headers={"User-Agent": "Mozilla/5.0 (X11)"})
    assert r.status_code == 403  # Toxiproxy's guard against web pages driving the API
    r = await api.get("/openapi.json", headers={"User-Agent": "Mozilla/5.0 (X11)"})
    assert r.status_code == 200


# -- proxies ----------------------------------------------------------------------------


async def test_create_show_and_proxy_through(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "echo", upstream, listen="127.0.0.1:0")
    assert set(p) == {"name", "listen", "upstream", "enabled", "toxics"}
    assert p["enabled"] is True and p["toxics"] == []
    assert parse_address(p["listen"])[1] != 0  # the bound address, not the requested one
    assert (await api.get("/proxies/echo")).json() == p
    assert (await api.get("/proxies")).json() == {"echo": p}
    stream = await trio.open_tcp_stream(*parse_address(p["listen"]))
    assert await roundtrip(stream, b"hello through the proxy") == b"hello through the proxy"
    await stream.aclose()


async def test_create_defaults_listen_and_can_start_disabled(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    p = await create(api, "d", upstream, enabled=False)
    assert p["enabled"] is False and p["listen"] == "127.0.0.1:0"
    p = await create(api, "e", upstream)  # no listen: loopback, any port
    assert parse_address(p["listen"])[0] == "127.0.0.1"
    await assert_accepting(parse_address(p["listen"]))


async def test_listen_on_localhost_in_any_case(upstream: Address) -> None:
    # A server's default rule (proxies on loopback, no listen_hosts list) is
    # faultnet.addresses.is_loopback: LOCALHOST is loopback (the registry's own copy of
    # the judge took only lower-case "localhost" and refused this with a 400).
    async with open_server() as server, httpx.AsyncClient(base_url=server.url) as api:
        p = await create(api, "upper", upstream, listen="LOCALHOST:0")
        stream = await trio.open_tcp_stream(*parse_address(p["listen"]))  # the bound one
        assert await roundtrip(stream) == b"ping"
        await stream.aclose()
        r = await api.post(
            "/proxies", json={"name": "x", "upstream": "h:1", "listen": "LOCALHOST.:0"}
        )
        assert_error(r, 400, "listen address LOCALHOST.:0 not allowed")  # a name, not loopback


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{bad json", 400, "bad request body: "),
        (b"", 400, "bad request body: EOF"),
        (b"[1, 2]", 400, "bad request body: expected a JSON object"),
        (b'{"name": "x", "upstream": "127.0.0.1:1", "x": NaN}', 400, "bad request body"),
        (b"[" * 100_000, 400, "bad request body"),
        (b'{"upstream": "127.0.0.1:1"}', 400, "missing required field: name"),
        (b'{"name": "", "upstream": "127.0.0.1:1"}', 400, "missing required field: name"),
        (b'{"name": "x"}', 400, "missing required field: upstream"),
        (b'{"name": 5, "upstream": "127.0.0.1:1"}', 400, "bad request body: name must be"),
        (b'{"name": "x", "upstream": "127.0.0.1:1", "enabled": "yes"}', 400, "bad request body"),
        (b'{"name": "x", "upstream": "nowhere"}', 400, "bad request body: upstream address"),
        (b'{"name": "x", "upstream": "h:99999"}', 400, "bad request body: upstream address"),
        (b'{"name": "x", "upstream": "h:1", "listen": "::1:5"}', 400, "bad request body: listen"),
        (b'{"name": "x", "upstream": "h:1", "listen": "10.0.0.1:0"}', 400, "listen address"),
        (b"\xff\xfe\x00", 400, "bad request body"),
    ],
)
async def test_create_bad_input(
    api: httpx.AsyncClient, body: bytes, status: int, message: str
) -> None:
    assert_error(await api.post("/proxies", content=body), status, message)
    assert (await api.get("/proxies")).json() == {}  # nothing half-created


async def test_create_conflicts(api: httpx.AsyncClient, upstream: Address) -> None:
    await create(api, "p", upstream)
    r = await api.post("/proxies", json={"name": "p", "upstream": "127.0.0.1:1"})
    assert_error(r, 409, "proxy already exists")
    # A listen address in use: Toxiproxy's 500, with a message naming the address.
    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = await api.post(
            "/proxies", json={"name": "q", "upstream": "127.0.0.1:1", "listen": f"127.0.0.1:{port}"}
        )
        assert_error(r, 500, f"listen address 127.0.0.1:{port} is already in use")
    assert set((await api.get("/proxies")).json()) == {"p"}


async def test_unknown_proxy_is_404_everywhere(api: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/proxies/x"),
        ("POST", "/proxies/x"),
        ("PATCH", "/proxies/x"),
        ("DELETE", "/proxies/x"),
        ("GET", "/proxies/x/toxics"),
        ("POST", "/proxies/x/toxics"),
        ("GET", "/proxies/x/toxics/t"),
        ("PATCH", "/proxies/x/toxics/t"),
        ("POST", "/proxies/x/toxics/t"),
        ("DELETE", "/proxies/x/toxics/t"),
        ("GET", "/proxies/x/faults"),
        ("POST", "/proxies/x/faults"),
        ("DELETE", "/proxies/x/faults"),
        ("GET", "/proxies/x/connections"),
        ("GET", "/proxies/x/events"),
    ]:
        # A bad body does not hide the missing proxy (Toxiproxy looks the proxy up first).
        r = await api.request(method, path, content=b"{not json")
        assert_error(r, 404, "proxy not found")


async def test_disable_closes_listener_and_connections_enable_relistens(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    p = await create(api, "p", upstream)
    where = parse_address(p["listen"])
    live = await trio.open_tcp_stream(*where)
    await roundtrip(live)
    r = await api.post("/proxies/p", json={"enabled": False})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert r.json()["listen"] == p["listen"]
    await assert_refusing(where)  # the listener is closed when the answer arrives
    await assert_severed(live)  # and the live connection was closed
    r = await api.patch("/proxies/p", json={"enabled": True})
    assert r.json()["enabled"] is True and r.json()["listen"] == p["listen"]
    await assert_accepting(where)  # the same address again
    # Updating with nothing (or the same values) changes nothing.
    assert (await api.patch("/proxies/p", json={"name": "ignored"})).json() == r.json()


async def test_update_changes_upstream_and_listen(
    api: httpx.AsyncClient, upstream: Address, nursery: trio.Nursery
) -> None:
    p = await create(api, "p", upstream)
    other = await start_server(nursery)
    r = await api.patch("/proxies/p", json={"upstream": f"127.0.0.1:{other[1]}"})
    assert r.status_code == 200 and r.json()["upstream"] == f"127.0.0.1:{other[1]}"
    assert r.json()["listen"] == p["listen"]  # restarted on the same address
    stream = await trio.open_tcp_stream(*parse_address(p["listen"]))
    await roundtrip(stream)
    await stream.aclose()
    r = await api.post("/proxies/p", json={"listen": "127.0.0.1:0"})
    new_listen = r.json()["listen"]
    assert new_listen != p["listen"]
    await assert_refusing(parse_address(p["listen"]))
    await assert_accepting(parse_address(new_listen))
    # Errors: body shape, types, address syntax; the proxy is unchanged by them.
    assert_error(await api.patch("/proxies/p", json=[1]), 400, "bad request body")
    assert_error(await api.patch("/proxies/p", json={"enabled": 1}), 400, "bad request body")
    assert_error(await api.patch("/proxies/p", json={"listen": "nope"}), 400, "bad request body")
    assert_error(await api.patch("/proxies/p", content=b""), 400, "bad request body: EOF")
    assert (await api.get("/proxies/p")).json()["listen"] == new_listen


async def test_enable_when_address_taken_is_500_and_stays_disabled(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    p = await create(api, "p", upstream)
    await api.post("/proxies/p", json={"enabled": False})
    with trio.socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await thief.bind(parse_address(p["listen"]))
        thief.listen(1)
        r = await api.post("/proxies/p", json={"enabled": True})
        assert_error(r, 500, f"listen address {p['listen']} is already in use")
        assert (await api.get("/proxies/p")).json()["enabled"] is False
    assert (await api.post("/proxies/p", json={"enabled": True})).json()["enabled"] is True


async def test_delete(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "p", upstream)
    live = await trio.open_tcp_stream(*parse_address(p["listen"]))
    r = await api.delete("/proxies/p")
    assert r.status_code == 204 and r.content == b""
    await assert_refusing(parse_address(p["listen"]))
    await assert_severed(live)
    assert_error(await api.get("/proxies/p"), 404, "proxy not found")


# -- toxics -----------------------------------------------------------------------------


async def test_toxic_crud(api: httpx.AsyncClient, upstream: Address) -> None:
    await create(api, "p", upstream)
    assert (await api.get("/proxies/p/toxics")).json() == []
    r = await api.post("/proxies/p/toxics", json={"type": "latency", "attributes": {"latency": 5}})
    assert r.status_code == 200  # Toxiproxy answers 200 here, not 201
    lat = r.json()
    assert lat == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 5, "jitter": 0},
    }
    up = (
        await api.post(
            "/proxies/p/toxics",
            json={"name": "cut", "type": "limit_data", "stream": "upstream", "toxicity": 0.5},
        )
    ).json()
    # Listing: the upstream chain first, then downstream (Toxiproxy's order).
    assert (await api.get("/proxies/p/toxics")).json() == [up, lat]
    assert (await api.get("/proxies/p")).json()["toxics"] == [up, lat]
    assert (await api.get("/proxies/p/toxics/cut")).json() == up
    r = await api.patch(
        "/proxies/p/toxics/latency_downstream", json={"attributes": {"jitter": 2}, "type": "x"}
    )
    assert r.json()["attributes"] == {"latency": 5, "jitter": 2}  # merged; type ignored
    r = await api.post("/proxies/p/toxics/latency_downstream", json={"toxicity": 0.25})
    assert r.json()["toxicity"] == 0.25 and r.json()["attributes"]["jitter"] == 2
    assert (await api.delete("/proxies/p/toxics/cut")).status_code == 204
    assert [t["name"] for t in (await api.get("/proxies/p/toxics")).json()] == [
        "latency_downstream"
    ]


async def test_toxic_errors(api: httpx.AsyncClient, upstream: Address) -> None:
    await create(api, "p", upstream)
    await api.post("/proxies/p/toxics", json={"type": "latency"})
    cases = [
        ({"type": "latency"}, 409, "toxic already exists"),
        ({"type": "latency", "name": "x", "stream": "up"}, 400, "stream was invalid"),
        ({"type": "bogus"}, 400, "invalid toxic type"),
        ({"type": "latency", "name": "y", "attributes": {"latency": "1"}}, 400, "bad request"),
        ({"type": "latency", "name": "y", "attributes": {"latency": -1}}, 400, "bad request"),
        ({"type": "latency", "name": "y", "toxicity": 2}, 400, "bad request body"),
        ({"type": 7}, 400, "bad request body"),
    ]
    for body, status, message in cases:
        assert_error(await api.post("/proxies/p/toxics", json=body), status, message)
    assert_error(await api.post("/proxies/p/toxics", content=b"{"), 400, "bad request body")
    for method in ("GET", "PATCH", "POST", "DELETE"):
        r = await api.request(method, "/proxies/p/toxics/nope", json={})
        assert_error(r, 404, "toxic not found")
    path = "/proxies/p/toxics/latency_downstream"
    assert_error(await api.patch(path, json={"attributes": {"latency": 1.5}}), 400, "bad request")
    assert_error(await api.patch(path, json={"toxicity": "1"}), 400, "bad request body")
    assert_error(await api.patch(path, json=None), 400, "bad request body")
    assert (await api.get(path)).json()["attributes"] == {"latency": 0, "jitter": 0}


async def test_toxic_via_api_applies_live_and_survives_disable(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    p = await create(api, "p", upstream)
    stream = await trio.open_tcp_stream(*parse_address(p["listen"]))
    await roundtrip(stream)
    await api.post("/proxies/p/toxics", json={"type": "latency", "attributes": {"latency": 150}})
    t0 = trio.current_time()
    await roundtrip(stream)
    assert trio.current_time() - t0 >= 0.15  # on the connection that was already open
    await api.post("/proxies/p", json={"enabled": False})
    await api.post("/proxies/p", json={"enabled": True})
    assert len((await api.get("/proxies/p/toxics")).json()) == 1
    stream = await trio.open_tcp_stream(*parse_address(p["listen"]))
    t0 = trio.current_time()
    await roundtrip(stream)
    assert trio.current_time() - t0 >= 0.15
    await stream.aclose()


# -- populate and reset -----------------------------------------------------------------


async def test_populate(api: httpx.AsyncClient, upstream: Address) -> None:
    up = f"127.0.0.1:{upstream[1]}"
    keep = await create(api, "keep", upstream)
    same = await create(api, "same", upstream)
    await api.post("/proxies/same/toxics", json={"type": "latency"})
    await create(api, "changed", upstream)
    body = [
        {"name": "same", "upstream": up, "listen": same["listen"]},
        {"name": "changed", "upstream": "127.0.0.1:1"},
        {"name": "new", "upstream": up, "enabled": False},
    ]
    r = await api.post("/populate", json=body)
    assert r.status_code == 201
    got = {p["name"]: p for p in r.json()["proxies"]}
    assert list(got) == ["same", "changed", "new"]
    assert got["same"]["toxics"] and got["same"]["listen"] == same["listen"]  # untouched
    assert got["changed"]["upstream"] == "127.0.0.1:1" and got["changed"]["toxics"] == []
    assert got["new"]["enabled"] is False
    index = (await api.get("/proxies")).json()
    assert set(index) == {"keep", "same", "changed", "new"} and index["keep"] == keep


async def test_populate_errors(api: httpx.AsyncClient, upstream: Address) -> None:
    assert_error(await api.post("/populate", json={"a": 1}), 400, "bad request body")
    r = await api.post("/populate", json=[{"name": "a", "upstream": "h:1"}, {"name": "b"}])
    assert_error(r, 400, "missing required field: upstream at proxy 2")
    r = await api.post("/populate", json=[{"upstream": "h:1"}])
    assert_error(r, 400, "missing required field: name at proxy 1")
    assert (await api.get("/proxies")).json() == {}  # checked before anything changed
    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        body = [
            {"name": "ok", "upstream": "h:1"},
            {"name": "clash", "upstream": "h:1", "listen": f"127.0.0.1:{port}"},
            {"name": "never", "upstream": "h:1"},
        ]
        r = await api.post("/populate", json=body)
    assert_error(r, 500, f"listen address 127.0.0.1:{port} is already in use")
    assert [p["name"] for p in r.json()["proxies"]] == ["ok"]
    assert set((await api.get("/proxies")).json()) == {"ok"}


async def test_reset(api: httpx.AsyncClient, upstream: Address) -> None:
    a = await create(api, "a", upstream)
    await create(api, "b", upstream, enabled=False)
    await api.post("/proxies/a/toxics", json={"type": "latency"})
    await api.post("/proxies/b/toxics", json={"type": "timeout"})
    await api.post("/proxies/a/faults", json={"mode": "refuse"})
    await assert_refusing(parse_address(a["listen"]))
    r = await api.post("/reset")
    assert r.status_code == 204
    index = (await api.get("/proxies")).json()
    assert all(p["enabled"] and p["toxics"] == [] for p in index.values())
    await assert_accepting(parse_address(a["listen"]))
    await assert_accepting(parse_address(index["b"]["listen"]))


# -- faultnet's modes -------------------------------------------------------------------


async def test_fault_modes_through_the_api(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "p", upstream)
    where = parse_address(p["listen"])
    a = await trio.open_tcp_stream(*where)
    await roundtrip(a)
    r = await api.post("/proxies/p/faults", json={"mode": "freeze", "stream": "upstream"})
    assert r.status_code == 200 and r.json()["connections"] == 1
    assert r.json()["state"]["connections"] == {"frozen-upstream": 1}
    await assert_frozen(a, a, window=0.2)
    r = await api.post("/proxies/p/faults", json={"mode": "thaw"})
    assert r.json()["connections"] == 1
    with trio.fail_after(2):  # the held bytes arrive after thaw
        assert await a.receive_some() == b"faultnet frozen probe\n"
    await roundtrip(a)

    await api.post("/proxies/p/faults", json={"mode": "refuse"})
    assert (await api.get("/proxies/p/faults")).json()["refusing"] is True
    await assert_refusing(where)
    await roundtrip(a)  # open connections are untouched
    await api.post("/proxies/p/faults", json={"mode": "restore"})
    await assert_accepting(where)
    await api.post("/proxies/p/faults", json={"mode": "drop-syn"})
    await assert_syn_dropped(where, timeout=0.3)
    assert (await api.delete("/proxies/p/faults")).status_code == 204
    await assert_accepting(where)

    # The probes' connections (closed by their client) leave the listing once the upstream
    # has closed its side too; sever then finds a alone (it once found a probe's as well).
    await until_listed(api, "p", 1)
    r = await api.post("/proxies/p/faults", json={"mode": "sever"})
    assert r.json()["connections"] == 1
    await assert_severed(a)
    b = await trio.open_tcp_stream(*where)
    await roundtrip(b)
    await api.post("/proxies/p/faults", json={"mode": "reset"})
    await assert_reset(b)

    c = await trio.open_tcp_stream(*where)
    await roundtrip(c)
    r = await api.post("/proxies/p/faults", json={"mode": "blackhole"})
    conns = (await api.get("/proxies/p/connections")).json()
    assert [x["state"] for x in conns] == ["blackholed"]
    await assert_frozen(c, c, window=0.2)
    await api.post("/proxies/p/faults", json={"mode": "thaw"})
    await c.aclose()


async def test_fault_on_named_connections_only(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "p", upstream)
    a, b = [await trio.open_tcp_stream(*parse_address(p["listen"])) for _ in range(2)]
    await roundtrip(a)
    await roundtrip(b)
    ids = sorted(x["id"] for x in (await api.get("/proxies/p/connections")).json())
    r = await api.post("/proxies/p/faults", json={"mode": "freeze", "connections": ids[:1]})
    assert r.json()["connections"] == 1
    await assert_frozen(a, a, window=0.2)
    await roundtrip(b)  # the other connection still flows
    r = await api.post("/proxies/p/faults", json={"mode": "reset", "connections": ids[1:]})
    assert r.json()["connections"] == 1
    await assert_reset(b)
    await api.post("/proxies/p/faults", json={"mode": "thaw", "connections": ids[:1]})
    with trio.fail_after(2):
        assert await a.receive_some() == b"faultnet frozen probe\n"
    await a.aclose()


async def test_fault_errors(api: httpx.AsyncClient, upstream: Address) -> None:
    await create(api, "p", upstream)
    cases = [
        ({"mode": "melt"}, 400, "invalid fault mode"),
        ({}, 400, "invalid fault mode"),
        ({"mode": "freeze", "stream": "sideways"}, 400, "stream was invalid"),
        ({"mode": "sever", "stream": "upstream"}, 400, "stream applies to freeze, thaw and loss"),
        ({"mode": "freeze", "include_new": "yes"}, 400, "bad request body"),
        ({"mode": "refuse", "include_new": True}, 400, "include_new applies to"),
        ({"mode": "freeze", "connections": "all"}, 400, "bad request body"),
        ({"mode": "freeze", "connections": [True]}, 400, "bad request body"),
        ({"mode": "refuse", "connections": [1]}, 400, "connections applies to"),
        ({"mode": "freeze", "connections": [1], "include_new": True}, 400, "connections and"),
        (
            {"mode": "loss", "both_ways": True, "stream": "upstream"},
            400,
            "both_ways loses both streams",
        ),
        ({"mode": "freeze", "both_ways": True}, 400, "both_ways applies to loss only"),
        ({"mode": "loss", "both_ways": "yes"}, 400, "bad request body"),
    ]
    for body, status, message in cases:
        assert_error(await api.post("/proxies/p/faults", json=body), status, message)
    assert_error(await api.post("/proxies/p/faults", json=["freeze"]), 400, "bad request body")
    await api.post("/proxies/p", json={"enabled": False})
    r = await api.post("/proxies/p/faults", json={"mode": "freeze"})
    assert_error(r, 409, "proxy is disabled")
    assert (await api.get("/proxies/p/faults")).json() == {"proxy": "p", "enabled": False}
    assert (await api.get("/proxies/p/connections")).json() == []


async def test_loss_both_ways_through_the_api(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "p", upstream)
    a = await trio.open_tcp_stream(*parse_address(p["listen"]))
    await roundtrip(a)
    body = {"mode": "loss", "percent": 5, "both_ways": True, "include_new": True}
    r = (await api.post("/proxies/p/faults", json=body)).json()
    assert (r["connections"], r["both_ways"]) == (1, True)
    assert r["state"]["loss_new"] == {"upstream": 5.0, "downstream": 5.0}
    await roundtrip(a, b"x" * 1000)
    (c,) = (await api.get("/proxies/p/connections")).json()
    assert c["on_hop"] and c["loss_both_ways"] == ["downstream", "upstream"]
    await api.post("/proxies/p/faults", json={"mode": "thaw"})
    (c,) = (await api.get("/proxies/p/connections")).json()
    assert c["on_hop"] and c["loss"] is None and c["loss_both_ways"] is None
    await a.aclose()
    await until_listed(api, "p", 0)


async def test_connections_listing(api: httpx.AsyncClient, upstream: Address) -> None:
    p = await create(api, "p", upstream)
    a = await trio.open_tcp_stream(*parse_address(p["listen"]))
    await roundtrip(a, b"x" * 1000)
    conns = (await api.get("/proxies/p/connections")).json()
    assert len(conns) == 1
    c = conns[0]
    assert c["peer"] == f"127.0.0.1:{a.socket.getsockname()[1]}"
    assert (c["bytes_upstream"], c["bytes_downstream"], c["state"]) == (1000, 1000, "open")
    await a.aclose()
    await until_listed(api, "p", 0)  # the proxy notices the close


async def test_events(api: httpx.AsyncClient, upstream: Address) -> None:
    await create(api, "p", upstream)
    await api.post("/proxies/p/toxics", json={"type": "latency"})
    everything = (await api.get("/events")).json()
    kinds = [e["event"] for e in everything["events"]]
    assert "server_seed" in kinds and "proxy_created" in kinds and "toxic_added" in kinds
    mine = (await api.get("/proxies/p/events")).json()["events"]
    assert mine and all(e["proxy"] == "p" for e in mine)
    assert [e["event"] for e in mine][:2] == ["listening", "toxic_added"]
    seqs = [e["seq"] for e in everything["events"]]
    assert seqs == sorted(seqs)
    later = (await api.get(f"/events?since={seqs[1]}&limit=2")).json()["events"]
    assert [e["seq"] for e in later] == seqs[2:4]
    for bad in ("since=-1", "since=x", "limit=0", "limit=10001"):
        assert_error(await api.get(f"/events?{bad}"), 400, "bad request")


async def test_a_handler_bug_is_a_500_and_the_server_keeps_serving(
    faultnet_server: RunningServer, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("deliberate")

    monkeypatch.setattr(faultnet_server.registry, "index", broken)
    assert_error(await api.get("/proxies"), 500, "internal error: RuntimeError('deliberate')")
    monkeypatch.undo()
    assert (await api.get("/proxies")).json() == {}
    errors = [e for e in (await api.get("/events")).json()["events"] if e["event"] == "api_error"]
    assert errors and errors[0]["path"] == "/proxies"


@pytest.mark.parametrize("protocol", ["tcp", "udp"])
async def test_a_bug_in_a_fault_mode_is_a_500_with_its_event_not_the_client_s_400(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    # The bug is injected (no mode has one on demand): the mode's operation raises the
    # TypeError a wrong call inside it would. The request itself is valid, so the
    # answer must not blame the client (the UDP dispatch once caught TypeError as a 400).
    from faultnet.proxy import _proxy
    from faultnet.udp.proxy import UdpProxy

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("deliberate")

    def broken_op(proxy: Any, req: Any) -> None:
        raise TypeError("deliberate")

    if protocol == "udp":
        monkeypatch.setattr(UdpProxy, "latency", broken)
        body: dict[str, Any] = {"mode": "latency", "latency_ms": 5}
    else:
        monkeypatch.setitem(_proxy._OPERATIONS, "loss", broken_op)
        body = {"mode": "loss", "percent": 5}
    r = await api.post(
        "/proxies", json={"name": "p", "upstream": "127.0.0.1:9", "protocol": protocol}
    )
    assert r.status_code == 201, r.text
    assert_error(await api.post("/proxies/p/faults", json=body), 500, "internal error: TypeError")
    errors = [e for e in (await api.get("/events")).json()["events"] if e["event"] == "api_error"]
    assert errors and errors[0]["path"] == "/proxies/p/faults"
    assert "TypeError('deliberate')" in errors[0]["error"]


# -- seeds ------------------------------------------------------------------------------


async def _affected_pattern(seed: int, up: Address, n: int = 16) -> list[bool]:
    """Which of n connections a toxicity-0.5 limit_data toxic picks, under *seed*."""
    async with open_server(seed=seed) as server, httpx.AsyncClient(base_url=server.url) as api:
        p = await create(api, "p", up)
        body = {"type": "limit_data", "toxicity": 0.5, "attributes": {"bytes": 1}}
        await api.post("/proxies/p/toxics", json=body)
        pattern = []
        for _ in range(n):
            s = await trio.open_tcp_stream(*parse_address(p["listen"]))
            await s.send_all(b"hello")
            got = b""
            with trio.fail_after(5):
                while len(got) < 5 and (chunk := await s.receive_some()):
                    got += chunk
            pattern.append(got == b"h")
            await s.aclose()
        events = (await api.get("/events")).json()["events"]
        assert {"event": "server_seed", "seed": seed}.items() <= events[0].items()
    return pattern


async def test_seed_makes_toxicity_decisions_reproducible(upstream: Address) -> None:
    a = await _affected_pattern(1234, upstream)
    assert a == await _affected_pattern(1234, upstream)
    assert a != await _affected_pattern(99, upstream)
    assert 0 < sum(a) < len(a)


async def test_relisten_on_a_taken_address_is_500_naming_it(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    p = await create(api, "p", upstream)
    await create(api, "q", upstream)
    await api.post("/proxies/q", json={"enabled": False})
    q = (await api.get("/proxies/q")).json()
    await api.post("/proxies/p/faults", json={"mode": "refuse"})
    with trio.socket.socket() as thief, trio.socket.socket() as thief2:
        for sock, where in ((thief, p["listen"]), (thief2, q["listen"])):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            await sock.bind(parse_address(where))
            sock.listen(1)
        message = f"listen address {p['listen']} is already in use"
        assert_error(await api.post("/proxies/p/faults", json={"mode": "restore"}), 500, message)
        assert_error(await api.delete("/proxies/p/faults"), 500, message)
        assert_error(await api.post("/reset"), 500, message)  # stops at the first failure
        await api.delete("/proxies/p")
        message = f"listen address {q['listen']} is already in use"
        assert_error(await api.post("/reset"), 500, message)
    assert (await api.post("/reset")).status_code == 204  # the address is free again
    await assert_accepting(parse_address(q["listen"]))


def test_the_error_class_chooses_the_status_never_its_text() -> None:
    from faultnet.proxy import AddressInUse, ProxyError
    from faultnet.server.registry import _proxy_error

    assert _proxy_error(AddressInUse("listen address 127.0.0.1:1 is taken")).status == 500
    assert _proxy_error(ProxyError("listen address 127.0.0.1:1 is already in use")).status == 400


# -- names: whatever can be created can be listed, addressed and deleted -------------


async def post(api: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    # json.dumps escapes a lone surrogate (valid JSON); httpx's own encoder cannot.
    return await api.post(path, content=json.dumps(body))


BAD_NAMES = [
    ("b\ud800", "lone surrogate"),
    ("a/b", "'/'"),
    (".", "'.'"),
    ("..", "'..'"),
    ("x" * 16_385, "at most 256 characters"),
    ("tab\there", "control characters"),
]


@pytest.mark.parametrize("bad,why", BAD_NAMES, ids=[w for _, w in BAD_NAMES])
async def test_a_name_that_could_not_be_addressed_is_a_clear_400(
    api: httpx.AsyncClient, upstream: Address, bad: str, why: str
) -> None:
    """Issue 10 item 6: such names were created (a lone surrogate answered 500 and then
    broke GET /proxies, the toxic list and /reset for good)."""
    r = await post(api, "/proxies", {"name": bad, "upstream": f"{upstream[0]}:{upstream[1]}"})
    assert_error(r, 400, "bad request body: proxy name")
    assert why in r.json()["error"]
    await create(api, "p", upstream)
    r = await post(api, "/proxies/p/toxics", {"name": bad, "type": "latency"})
    assert_error(r, 400, "bad request body: toxic name")
    r = await post(api, "/populate", [{"name": bad, "upstream": "127.0.0.1:1"}])
    assert r.status_code == 400
    if why == "lone surrogate":  # an address that cannot be encoded poisons it too
        r = await post(api, "/proxies", {"name": "q", "upstream": f"{bad}:1"})
        assert_error(r, 400, "bad request body: upstream address")
    assert (await api.get("/proxies")).status_code == 200
    assert (await api.get("/proxies/p/toxics")).json() == []
    assert (await api.post("/reset")).status_code == 204


async def test_every_name_that_can_be_created_can_be_listed_addressed_and_deleted(
    api: httpx.AsyncClient, upstream: Address
) -> None:
    from urllib.parse import quote

    names = ["a b", "ünï", "x%2Fy", "?q=1#f", "...", "x" * 256, "😀"]
    for name in names:
        await create(api, name, upstream)
        path = f"/proxies/{quote(name, safe='')}"
        assert (await api.get(path)).json()["name"] == name
        r = await api.post(f"{path}/toxics", json={"name": name, "type": "latency"})
        assert r.status_code == 200, r.text
        assert (await api.get(f"{path}/toxics/{quote(name, safe='')}")).status_code == 200
    assert set((await api.get("/proxies")).json()) == set(names)
    for name in names:
        path = f"/proxies/{quote(name, safe='')}"
        assert (await api.delete(f"{path}/toxics/{quote(name, safe='')}")).status_code == 204
        assert (await api.delete(path)).status_code == 204
    assert (await api.get("/proxies")).json() == {}


# -- requests that stall or go away -----------------------------------------------------


async def _raw_request(server: RunningServer, head: bytes) -> trio.SocketStream:
    s = await trio.open_tcp_stream(*parse_address(server.url.removeprefix("http://")))
    await s.send_all(head)
    return s


async def test_a_stalled_request_body_is_answered_408_and_closed(
    faultnet_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 item 7: headers sent, body never: the request was held forever."""
    import faultnet.server.api

    monkeypatch.setattr(faultnet.server.api, "BODY_TIMEOUT_S", 0.5)
    s = await _raw_request(
        faultnet_server,
        b"POST /proxies HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{",
    )
    answer = b""
    with trio.fail_after(5):
        while data := await s.receive_some(65536):
            answer += data
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"not received within 0.5 s" in answer and b"\r\nconnection: close\r\n" in answer
    await s.aclose()


async def test_a_client_that_leaves_mid_request_is_one_record_without_a_traceback(
    faultnet_server: RunningServer,
) -> None:
    """Issue 10 item 7: a client that disconnected mid-body was logged as an API error
    with a traceback."""
    events = faultnet_server.registry.events
    s = await _raw_request(
        faultnet_server,
        b'POST /proxies HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{"na',
    )
    await s.aclose()
    await wait_until(lambda: any(r["event"] == "client_disconnected" for r in events.read()))
    (record,) = [r for r in events.read() if r["event"] == "client_disconnected"]
    assert record["path"] == "/proxies" and "traceback" not in record
    assert not [r for r in events.read() if r["event"] == "api_error"]


async def test_a_running_proxy_that_fails_is_recorded_and_disabled_not_the_server(
    faultnet_server: RunningServer,
    api: httpx.AsyncClient,
    upstream: Address,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The breakage is injected (a real proxy cannot be made to fail on demand): proxy
    # "db" fails once it is running. The registry must record proxy_failed, show it
    # disabled with its toxics kept, and go on serving the API and other proxies.
    fail = trio.Event()
    real = Proxy.serve

    async def serve(self: Proxy, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started(await nursery.start(functools.partial(real, self)))
            if self.name == "db":
                await fail.wait()
                raise RuntimeError("injected serve failure")

    monkeypatch.setattr(Proxy, "serve", serve)
    await create(api, "db", upstream)
    r = await api.post("/proxies/db/toxics", json={"type": "latency", "attributes": {"latency": 5}})
    assert r.status_code == 200, r.text
    assert (await api.get("/proxies/db")).json()["enabled"] is True
    fail.set()
    await wait_until(lambda: not faultnet_server.registry.proxies["db"].enabled)
    db = (await api.get("/proxies/db")).json()
    assert db["enabled"] is False and [t["type"] for t in db["toxics"]] == ["latency"]
    events = (await api.get("/events")).json()["events"]
    (failed,) = [e for e in events if e["event"] == "proxy_failed"]
    assert failed["name"] == "db" and "injected serve failure" in failed["error"]
    other = await create(api, "other", upstream)
    stream = await trio.open_tcp_stream(*parse_address(other["listen"]))
    async with stream:
        assert await roundtrip(stream) == b"ping"
