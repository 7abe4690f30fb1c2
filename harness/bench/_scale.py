"""The scale lines (issue 36, item 5): one ``faultnet server`` with many proxies, and one
proxy with many connections, each figure as issue 36's table has it.

A ``faultnet server`` process of its own (``--scale N`` proxies; the run's upstream
behind them) is driven through its HTTP API over one kept-alive connection, as a client
library would. The lines, in order:

* **proxies**: the server's RSS and thread count at rest, then after creating *N*
  proxies one request each (the time to create them all); ``GET /proxies`` with *N*
  proxies (p50 of :data:`SAMPLES`); a toxic added to one of the *N* proxies and removed
  (p50 of each).
* **connections**: in a fresh server (its RSS grows from its start, not into what the
  proxies freed; its descriptors are the connections'), on one proxy, connections opened (each verified by one echo)
  up to each level of ``--scale-connections`` in turn, kept open from level to level;
  at each level ``GET /proxies/P/faults`` (p50), a freeze of every
  connection through the API and its thaw (p50 of :data:`FREEZES`), and a latency toxic
  added (first), removed, added again and removed.
* **idle**: the same levels in another fresh server where nothing else is done: the RSS
  per idle connection (the growth over the server's RSS before any, per connection).

The levels are capped by the descriptor limit (the server holds two descriptors per
connection, beside its reserve): the cap is said in the output. Every request's answer
is checked (its status, and that the freeze acted on every connection): one check for
the section. The targets are rows of ``_scale_targets.SCALE_TARGETS``.
"""

from __future__ import annotations

import http.client
import json
import resource
import sys
import time
from typing import Any

from faultnet.errors import EnvironmentProblem
from harness.bench._children import Child, _free_port, proc_rss_kib
from harness.bench._context import _log, _median, _Run
from harness.bench._measure import open_held
from harness.bench._stream import CHILD_START_S, HOST

__all__ = ["LEVELS", "SAMPLES", "connection_cap", "scale_phase"]

#: The connection levels of issue 36's table (``--scale-connections``' default).
LEVELS = (1000, 5000, 9000)
#: Timed requests per figure taken as a p50 (GET /proxies, /faults, a toxic's add).
SAMPLES = 20
#: Freeze-and-thaw cycles per level (each one a freeze of every connection).
FREEZES = 3
#: Descriptors kept beside the connections' two each: the server's reserve for its API
#: (faultnet.proxy._reserve) and its listeners, with margin.
_SPARE_FDS = 1500


def connection_cap(fd_limit: int, proxies: int) -> int:
    """The most connections one server can hold at *fd_limit* descriptors beside
    *proxies* listeners: two descriptors each (client side, upstream side)."""
    return max(0, (fd_limit - proxies - _SPARE_FDS) // 2)


class _Api:
    """One kept-alive HTTP connection to the server; each call timed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection(HOST, port, timeout=60)
        self.bad: list[str] = []

    def call(self, method: str, path: str, body: Any = None) -> tuple[float, Any]:
        """(milliseconds from the request to the whole answer, its JSON or None)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        t0 = time.perf_counter()
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        ms = (time.perf_counter() - t0) * 1000
        if resp.status >= 300:
            self.bad.append(f"{method} {path}: {resp.status} {raw[:200]!r}")
        return ms, (json.loads(raw) if raw else None)

    def p50(self, method: str, path: str, body: Any = None, n: int = SAMPLES) -> float | None:
        return _median([self.call(method, path, body)[0] for _ in range(n)])

    def close(self) -> None:
        self.conn.close()


def _start_server() -> tuple[Child, _Api]:
    port = _free_port()
    argv = [sys.executable, "-m", "faultnet", "server", "--port", str(port), "--seed", "1"]
    child = Child(argv, "faultnet server (scale lines)", control=False)
    deadline = time.monotonic() + CHILD_START_S
    while True:
        try:
            api = _Api(port)
            api.call("GET", "/version")
            return child, api
        except OSError:
            if time.monotonic() > deadline or child.proc.poll() is not None:
                child.stop()
                raise EnvironmentProblem("faultnet server (scale lines) did not answer") from None
            time.sleep(0.05)  # bounded by CHILD_START_S: a start-up poll, not a sync


def _threads(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _mib(kib: int | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def _proxies_line(api: _Api, pid: int, n: int, up: tuple[str, int]) -> dict[str, Any]:
    rest_kib, rest_threads = proc_rss_kib(pid), _threads(pid)
    floor = api.p50("GET", "/version")  # a request that does nothing: the API's own cost
    upstream = f"{up[0]}:{up[1]}"
    t0 = time.perf_counter()
    for i in range(n):
        api.call("POST", "/proxies", {"name": f"p{i}", "listen": "127.0.0.1:0",
                                      "upstream": upstream})  # fmt: skip
    create_s = time.perf_counter() - t0
    rss_kib, threads = proc_rss_kib(pid), _threads(pid)
    listing = api.p50("GET", "/proxies")
    toxic = {"name": "lat", "type": "latency", "stream": "downstream",
             "attributes": {"latency": 0}}  # fmt: skip
    add, remove = [], []
    for _ in range(SAMPLES):
        add.append(api.call("POST", "/proxies/p0/toxics", toxic)[0])
        remove.append(api.call("DELETE", "/proxies/p0/toxics/lat")[0])
    return {
        "proxies": n,
        "version_p50_ms": floor,
        "rss_at_rest_mib": _mib(rest_kib),
        "threads_at_rest": rest_threads,
        "rss_mib": _mib(rss_kib),
        "threads": threads,
        "create_s": round(create_s, 3),
        "get_proxies_p50_ms": listing,
        "toxic_add_p50_ms": _median(add),
        "toxic_remove_p50_ms": _median(remove),
    }


def _level(api: _Api, n: int) -> dict[str, Any]:
    """The figures of one level of *n* open connections on proxy ``conns``."""
    faults = api.p50("GET", "/proxies/conns/faults")
    freezes = []
    for _ in range(FREEZES):
        ms, answer = api.call("POST", "/proxies/conns/faults", {"mode": "freeze"})
        freezes.append(ms)
        acted = (answer or {}).get("connections")
        if acted != n:
            api.bad.append(f"freeze at {n} connections acted on {acted}")
        api.call("POST", "/proxies/conns/faults", {"mode": "thaw"})
    toxic = {"name": "lat", "type": "latency", "stream": "downstream",
             "attributes": {"latency": 1}}  # fmt: skip
    add_first = api.call("POST", "/proxies/conns/toxics", toxic)[0]
    remove_first = api.call("DELETE", "/proxies/conns/toxics/lat")[0]
    add_again = api.call("POST", "/proxies/conns/toxics", toxic)[0]
    remove_again = api.call("DELETE", "/proxies/conns/toxics/lat")[0]
    return {
        "connections": n,
        "faults_p50_ms": faults,
        "freeze_p50_ms": _median(freezes),
        "freeze_ms": [round(x, 2) for x in freezes],
        "toxic_add_first_ms": round(add_first, 2),
        "toxic_add_again_ms": round(add_again, 2),
        "toxic_remove_first_ms": round(remove_first, 2),
        "toxic_remove_again_ms": round(remove_again, 2),
    }


def _connections_line(
    api: _Api, pid: int, levels: tuple[int, ...], up: tuple[str, int], idle: bool = False
) -> dict[str, Any]:
    """Connections opened up to each level in turn on a new proxy ``conns``; at each,
    the RSS per connection (*idle*: nothing else is done) or the level's figures."""
    _, made = api.call("POST", "/proxies", {"name": "conns", "listen": "127.0.0.1:0",
                                            "upstream": f"{up[0]}:{up[1]}"})  # fmt: skip
    host, _, port = (made or {}).get("listen", ":0").rpartition(":")
    addr = (host.strip("[]"), int(port))
    base_kib = proc_rss_kib(pid)
    held: list[Any] = []
    out: list[dict[str, Any]] = []
    try:
        for n in levels:
            more, info = open_held(addr, n - len(held))
            held += more
            if len(held) < n:
                out.append({"connections": n, "skipped": f"held {len(held)}: {info['stopped_by']}"})
                break
            if idle:
                rss = proc_rss_kib(pid)
                per = None if rss is None or base_kib is None else (rss - base_kib) / n
                out.append({"connections": n, "rss_per_connection_kib": _round(per)})
            else:
                out.append(_level(api, n))
            _log(f"scale {n} connections: {_brief(out[-1])}")
    finally:
        for s in held:
            s.close()
    return {"levels": out}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _brief(level: dict[str, Any]) -> str:
    keys = ("faults_p50_ms", "freeze_p50_ms", "toxic_add_first_ms", "rss_per_connection_kib")
    return ", ".join(f"{k} {level[k]:.2f}" for k in keys if level.get(k) is not None)


def scale_phase(ctx: _Run) -> None:
    """The scale lines into ``ctx.sections["scale"]``; one check for the section."""
    p = ctx.p
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cap = connection_cap(fd_limit, 1)  # a server of their own: one listener
    levels = tuple(n for n in p.scale_connections if n <= cap)
    if len(levels) < len(p.scale_connections):
        levels += (cap,) if cap and cap not in levels else ()
    doc: dict[str, Any] = {
        "fd_limit": fd_limit,
        "connection_cap": cap,
        "levels_asked": list(p.scale_connections),
    }
    bad: list[str] = []
    child, api = _start_server()
    doc["server_pid"] = child.pid
    try:
        doc["proxies"] = _proxies_line(api, child.pid, p.scale, ctx.addrs["direct"])
        _log(f"scale {p.scale} proxies: create {doc['proxies']['create_s']} s, "
             f"RSS {doc['proxies']['rss_mib']} MiB")  # fmt: skip
    finally:
        bad += api.bad
        api.close()
        child.stop()
    # Each in a server of its own: memory a level's operations took is not counted as
    # the next level's idle connections'.
    for key, idle in (("idle", True), ("connections", False)):
        child, api = _start_server()
        doc[f"{key}_server_pid"] = child.pid
        try:
            doc[key] = _connections_line(api, child.pid, levels, ctx.addrs["direct"], idle)
        finally:
            bad += api.bad
            api.close()
            child.stop()
    ctx.sections["scale"] = doc
    ctx.checks.append(
        {
            "name": "scale lines: every API answer was a success, every freeze total",
            "ok": not bad,
            "detail": bad[0] if bad else f"{p.scale} proxies, levels {list(levels)}",
        }
    )
