"""An HTTP toxic's seeded percent keyed by the request's identity, not its arrival
(issue 33, item 6): concurrent clients whose requests reach the proxy in another order
get the same requests faulted. Real sockets: httpx clients, one keep-alive connection
each, through a real proxy to hypercorn (tests/faultnet/http_app.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import trio

from faultnet.proxy import Proxy
from faultnet.toxics import HttpAbort
from tests.faultnet.http_app import Address, serve_app

Factory = Callable[..., Awaitable[Proxy]]
CLIENTS, REQUESTS = 20, 10


def _url(proxy: Proxy, path: str) -> str:
    assert proxy.address is not None
    return f"http://{proxy.address[0]}:{proxy.address[1]}{path}"


async def _faulted(
    faultnet_proxy: Factory, app: Address, order: list[tuple[int, int]]
) -> set[tuple[int, int]]:
    """Open CLIENTS connections at once, send their requests in *order* (client,
    request) one at a time (so the proxy sees exactly that arrival order), and return
    the requests answered 503. The even clients' requests carry an X-Request-Id and all
    share one target; the odd clients' have none, each client its own target, so a
    request is known by its ordinal on its connection."""
    proxy = await faultnet_proxy(app, seed=11)
    proxy.add_toxic(HttpAbort("some", percent=30))
    faulted = set()
    clients = [
        httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=1))
        for _ in range(CLIENTS)
    ]
    try:
        for c, r in order:
            with_id = c % 2 == 0
            path = "/api/item" if with_id else f"/api/client{c}"
            headers = {"X-Request-Id": f"{c}-{r}"} if with_id else {}
            with trio.fail_after(10):
                resp = await clients[c].get(_url(proxy, path), headers=headers)
            if resp.status_code == 503:
                faulted.add((c, r))
            else:
                assert resp.status_code == 200, resp.text
    finally:
        for client in clients:
            await client.aclose()
    return faulted


async def test_concurrent_clients_in_another_arrival_order_get_the_same_requests_faulted(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    app = await serve_app(nursery)
    # Round robin over the clients, then each client's requests in turn from the last
    # client: the same 200 requests, in two arrival orders.
    first = [(c, r) for r in range(REQUESTS) for c in range(CLIENTS)]
    second = [(c, r) for c in reversed(range(CLIENTS)) for r in range(REQUESTS)]
    a = await _faulted(faultnet_proxy, app, first)
    b = await _faulted(faultnet_proxy, app, second)
    assert a == b, f"{sorted(a ^ b)} faulted in one run only"
    # 30 % of 200, drawn: 35 and 85 are more than 3 standard deviations out.
    assert 35 <= len(a) <= 85, len(a)
    assert any(c % 2 for c, _ in a) and any(c % 2 == 0 for c, _ in a)
