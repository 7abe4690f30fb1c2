"""``GET /metrics``: off by default (404, as Toxiproxy's), and with the flags Toxiproxy's
byte counters under its names and labels, faultnet's own, and the process's; read
back with prometheus_client's own parser, bytes moved through a real proxy."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from faultnet._version import __version__
from faultnet.addresses import parse_address
from faultnet.server import RunningServer, open_server
from faultnet.server.metrics import MetricsOptions
from faultnet.testing import echo_back, read_line, start_server, wait_until

UP = b"u" * 3000  # client to server; the echo sends it back
LIVE = b"L" * 700


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


async def _echo(stream: trio.SocketStream, payload: bytes) -> None:
    with trio.fail_after(10):
        await echo_back(stream, payload)


async def _scrape(api: httpx.AsyncClient) -> dict[Any, float]:
    r = await api.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return _samples(r.text)


async def test_metrics_are_off_unless_asked_for(faultnet_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=faultnet_server.url) as api:
        r = await api.get("/metrics")
    assert r.status_code == 404
    assert r.json()["error"].startswith("metrics are off: start the server with --proxy-metrics")


async def test_proxy_metrics_count_the_bytes_a_real_proxy_moved(nursery: trio.Nursery) -> None:
    upstream = await start_server(nursery)
    options = MetricsOptions(proxy=True, runtime=True)
    async with (
        open_server(listen_hosts={"127.0.0.1"}, metrics=options) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as api,
    ):
        body = {"name": "db", "upstream": f"{upstream[0]}:{upstream[1]}"}
        p = (await api.post("/proxies", json=body)).json()
        labels = {"listener": p["listen"], "proxy": "db", "upstream": p["upstream"]}
        address = parse_address(p["listen"])
        closed = await trio.open_tcp_stream(*address)
        await _echo(closed, UP)
        live = await trio.open_tcp_stream(*address)
        await _echo(live, LIVE)
        assert (await api.post("/proxies/db/toxics", json={"type": "latency"})).status_code == 200
        r = await api.post("/proxies/db/faults", json={"mode": "refuse"})
        assert r.status_code == 200, r.text

        samples = await _scrape(api)
        moved = len(UP) + len(LIVE)
        for name in ("toxiproxy_proxy_received_bytes_total", "toxiproxy_proxy_sent_bytes_total"):
            for direction in ("upstream", "downstream"):
                assert _value(samples, name, direction=direction, **labels) == moved
        assert _value(samples, "faultnet_proxy_connections", proxy="db", state="open") == 2
        assert _value(samples, "faultnet_proxy_connections", proxy="db", state="frozen") == 0
        assert _value(samples, "faultnet_proxy_fault_in_force", proxy="db", fault="refusing") == 1
        assert _value(samples, "faultnet_proxy_fault_in_force", proxy="db", fault="loss_new") == 0
        assert _value(samples, "faultnet_fault_applications_total", proxy="db", mode="refuse") == 1
        assert _value(samples, "faultnet_toxic_applications_total", proxy="db", type="latency") == 1
        # The runtime's: the process collector's names (Go's too) and the build.
        assert _value(samples, "process_open_fds") > 0
        assert _value(samples, "faultnet_build_info", version=__version__) == 1

        # A closed connection's bytes stay counted (from its conn_close record).
        await closed.aclose()
        proxy = server.registry.proxies["db"].proxy
        assert proxy is not None
        await wait_until(lambda: len(proxy.connections()) == 1, 10, "the proxy's close")
        samples = await _scrape(api)
        sent = _value(samples, "toxiproxy_proxy_sent_bytes_total", direction="upstream", **labels)
        assert sent == moved
        assert _value(samples, "faultnet_proxy_connections", proxy="db", state="open") == 1
        await live.aclose()


def test_the_server_commands_flags_turn_the_metrics_on() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--proxy-metrics"]
        + ["--runtime-metrics"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = read_line(proc.stdout, 20).split(" listening on ")[1].split()[0]
        body = {"name": "p", "upstream": "127.0.0.1:1"}
        httpx.post(f"{url}/proxies", json=body, timeout=10).raise_for_status()
        r = httpx.get(f"{url}/metrics", timeout=10)
        assert r.status_code == 200, r.text
        names = {f.name for f in text_string_to_metric_families(r.text)}
        assert {"toxiproxy_proxy_received_bytes", "toxiproxy_proxy_sent_bytes"} <= names
        assert {"process_cpu_seconds", "faultnet_build_info"} <= names
    finally:
        proc.terminate()  # the exact process started above
        _, stderr = proc.communicate(timeout=20)
    assert b"Traceback" not in stderr, stderr.decode()[-2000:]
