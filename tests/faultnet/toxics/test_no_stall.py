"""No toxic can stall the proxy: every byte toxic at its extreme attributes, each on a
saturated connection of its own proxy, while another proxy keeps taking new connections
and answering, and the server's API keeps answering, on every plane.

The toxics run in the process's one trio loop; a stage that never awaits anything that
schedules (a ``slicer`` with ``delay`` 0 writing piece after piece, a ``timeout``
dropping chunk after chunk, a pass-through on a stream the plane keeps filling) held
that loop: API calls and connections through other proxies waited 19 s (issue 32).

The probes run in a thread of their own (blocking sockets, a blocking HTTP client), so
they measure the loop's answer and not their own scheduling: each probe opens a new
connection through the untoxic proxy (its accept is the loop's), makes a round trip,
and asks the API for the proxy list (which crosses into the loop). The bound is from a
measured distribution: see PROBE_BOUND_S.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import pytest
import trio

from faultnet.server import RunningServer
from faultnet.testing import start_server

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

#: Every byte toxic at the attributes that ask most of the loop.
EXTREMES: dict[str, dict[str, Any]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 1},
    "slicer": {"average_size": 1, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 2**50},
    "timeout": {"timeout": 0},
    "slow_close": {"delay": 0},
    "reset_peer": {"timeout": 10**9},
}

#: How long the probes run while every toxic's connection is saturated.
PROBE_S = 1.5
#: The slowest probe allowed (connect + round trip, or one API call). Measured (load
#: 2-5, 3 runs a plane): the slowest of 60-120 probes took 21-45 ms (median 5-13 ms)
#: with every stage yielding; without, 2 probes got through in the whole window, the
#: slowest after 2.2-3.4 s.
PROBE_BOUND_S = 1.0

BLOCK = b"x" * 65536


async def _firehose(stream: trio.SocketStream) -> None:
    """Upstream: send until the connection goes (the test's end closes it)."""
    try:
        while True:
            await stream.send_all(BLOCK)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _drain(address: tuple[str, int]) -> None:
    """A client of a toxic proxy: reads and discards whatever comes, until cancelled."""
    try:
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(BLOCK)  # the upstream stream saturated too
            while await stream.receive_some(65536):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def _probe(proxy: tuple[str, int], url: str, until: float) -> list[float]:
    """In a thread: connect + round trip through *proxy*, then GET /proxies, until the
    monotonic time *until*; the duration of each step."""
    took: list[float] = []
    with httpx.Client(base_url=url, timeout=10) as api:
        while time.monotonic() < until:
            t0 = time.monotonic()
            with socket.create_connection(proxy, timeout=10) as sock:
                sock.sendall(b"ping")
                got = b""
                while len(got) < 4:
                    data = sock.recv(4)
                    assert data, "EOF before the echo"
                    got += data
            t1 = time.monotonic()
            assert api.get("/proxies").status_code == 200
            t2 = time.monotonic()
            took += [t1 - t0, t2 - t1]
            time.sleep(0.01)
    return took


async def _create(api: httpx.AsyncClient, name: str, upstream: tuple[str, int]) -> tuple[str, int]:
    r = await api.post(
        "/proxies",
        json={"name": name, "listen": "127.0.0.1:0", "upstream": f"{upstream[0]}:{upstream[1]}"},
    )
    assert r.status_code == 201, r.text
    host, port = r.json()["listen"].rsplit(":", 1)
    return host, int(port)


async def test_no_toxic_at_its_extreme_stalls_the_api_or_other_proxies(
    faultnet_server: RunningServer, nursery: trio.Nursery
) -> None:
    firehose = await start_server(nursery, _firehose)
    echo = await start_server(nursery)
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as api:
        clean = await _create(api, "clean", echo)
        toxic_proxies = []
        for kind, attributes in EXTREMES.items():
            address = await _create(api, kind, firehose)
            for stream in ("upstream", "downstream"):
                r = await api.post(
                    f"/proxies/{kind}/toxics",
                    json={"type": kind, "stream": stream, "attributes": attributes},
                )
                assert r.status_code == 200, r.text
            toxic_proxies.append(address)
    with trio.fail_after(PROBE_S + 30):
        async with trio.open_nursery() as load:
            for address in toxic_proxies:
                load.start_soon(_drain, address)
            await trio.sleep(0.2)  # the lanes are busy before the first probe
            until = time.monotonic() + PROBE_S
            took = await trio.to_thread.run_sync(_probe, clean, faultnet_server.url, until)
            load.cancel_scope.cancel()
    assert took and max(took) < PROBE_BOUND_S, (
        f"the slowest of {len(took)} probes took {max(took) * 1000:.0f} ms"
    )
