"""The HTTP lines (issue 33's Targets): what an HTTP toxic that matches no request costs,
against the bare proxy's cost, in the same run.

An nginx of our own (single process, ``master_process off``, keep-alive without a
request limit) answers ``GET /`` with a small body, on HTTP/1.1 and, on a second port,
h2c with prior knowledge; ``/bulk`` is a file of ``--toxic-bytes``. A faultnet proxy
process (the toxic lines' ``ToxicProxy``) in front of it carries, in the toxic arm, an
``http_abort`` whose path glob no request matches: every request and response is
parsed, judged and passed. The lines:

* **http1** and **http2**: one keep-alive connection per arm and round, requests one at
  a time (:mod:`harness.bench._httpclient`: h11, h2); a round's p50 request time
  straight at nginx (direct), through the bare proxy and through the toxic one, rounds
  rotating the arms; an arm's added latency is its p50 less direct's, and the figure is
  the median over the rounds of the toxic's added over the bare proxy's. And the
  proxy's user instructions per request under callgrind (a proxy of its own, as the
  other instruction lines), with the toxic and bare.
* **http_bulk**: ``/bulk`` fetched by curl through the bare proxy and through the
  toxic, each verified byte for byte against the file; MB/s, toxic over bare.

Skipped, saying why, where nginx (or, for the bulk line, curl) is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.bench._children import start_listening
from harness.bench._compiled import proxy_instructions
from harness.bench._context import _dataplane_argv, _Run, rotating_rounds, rotations
from harness.bench._measure import percentile
from harness.bench._stream import HOST
from harness.bench._targets import median_ratio, request_rounds

__all__ = [
    "NO_MATCH",
    "TARGET_HTTP_ADDED_VS_BARE",
    "TARGET_HTTP_BULK_VS_BARE",
    "TARGET_HTTP_INSTRUCTIONS",
    "http_bulk_line",
    "http_line",
]

#: Targets (issue 33): per request, and the bulk rate. Reported with MET/MISSED; never
#: asserted by tests.
TARGET_HTTP_INSTRUCTIONS = 250_000
TARGET_HTTP_ADDED_VS_BARE = 3.0
TARGET_HTTP_BULK_VS_BARE = 0.5
#: The toxic: an abort whose path glob no request of the bench's matches.
NO_MATCH = {"path": "/faultnet-bench/no-request-is-this*"}
#: Requests counted under callgrind at most (``--callgrind`` asks more of the echo
#: lines): a request costs ~1,000x an echo round trip there (measured: 300 requests
#: with 200 warm-up took 100 s), and its count is the same from a few hundred on.
CALLGRIND_MAX = 500
#: A fetch of ``/bulk`` gets this long at least (plus a second per 10 MB).
BULK_TIMEOUT_S = 60.0

_NGINX_CONF = """
{user}
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx-{port}.pid;
error_log {dir}/error-{port}.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    default_type application/octet-stream;
    keepalive_requests 1000000000;
    keepalive_timeout 600s;
    server {{
        listen {host}:{port}{http2};
        location = / {{ return 200 "faultnet bench\\n"; }}
        location = /bulk {{ alias {dir}/bulk; }}
    }}
}}
"""

ProxyFactory = Callable[[int, list[str]], Any]


class Nginx:
    """One nginx process on a free loopback port (h2c with *http2*), serving from
    *directory*; stopped by recorded identity."""

    def __init__(self, exe: str, directory: Path, http2: bool) -> None:
        def argv(port: int) -> list[str]:
            conf = directory / f"nginx-{port}.conf"
            conf.write_text(
                _NGINX_CONF.format(
                    user="user root;" if os.geteuid() == 0 else "",
                    dir=directory,
                    host=HOST,
                    port=port,
                    http2=" http2" if http2 else "",
                )
            )
            return [exe, "-p", str(directory), "-c", str(conf), "-e", str(directory / "e.log")]

        self.child, self.port = start_listening(argv, "nginx")

    def stop(self) -> None:
        self.child.stop()  # SIGTERM (then SIGKILL) by identity: nginx's fast shutdown


def _nginx() -> str | None:
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"
    return found


def _client_argv(protocol: str) -> Callable[[int, int], list[str]]:
    """The keep-alive client's argv in its ``pause`` mode (for the callgrind line)."""
    return lambda port, count: _client(protocol, port, count, 200) + ["pause"]


def _client(protocol: str, port: int, count: int, warmup: int) -> list[str]:
    return [sys.executable, "-m", "harness.bench._httpclient", protocol, HOST, str(port),
            str(count), str(warmup)]  # fmt: skip


def _p50_ms(protocol: str, port: int, count: int, warmup: int) -> float | None:
    """The p50 request time in ms of one keep-alive connection, or None if it failed."""
    try:
        done = subprocess.run(
            _client(protocol, port, count, warmup), capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    xs = sorted(int(x) for x in done.stdout.split())
    got = percentile(xs, 50) if xs else None
    return None if got is None else got / 1e6


def http_line(ctx: _Run, proxy: ProxyFactory, setup: str, protocol: str) -> dict[str, Any]:
    """The ``http1`` (*protocol* ``h1``) or ``http2`` (``h2``) line's figures (see the
    module docstring); *proxy* starts a faultnet proxy process in front of a port (the
    toxic lines' ``ToxicProxy``), *setup* is its command that adds :data:`NO_MATCH`."""
    exe = _nginx()
    if exe is None:
        return {"skipped": "nginx is not installed"}
    count = max(100, ctx.p.pings // ctx.p.rounds)
    warmup = min(200, max(10, count // 10))
    with tempfile.TemporaryDirectory(prefix="faultnet-bench-nginx-") as tmp:
        nginx = Nginx(exe, Path(tmp), http2=protocol == "h2")
        try:
            tp = proxy(nginx.port, _dataplane_argv(ctx.p))
            try:
                ports = {"direct": nginx.port, "bare": tp.addr[1], "toxic": tp.addr[1]}
                p50 = rotating_rounds(
                    ports,
                    ctx.p.rounds,
                    lambda port: _p50_ms(protocol, port, count, warmup),
                    lambda: tp.toxic("http_abort", "nomatch", **NO_MATCH),
                )
            finally:
                tp.stop()
            instructions = _instructions(ctx, protocol, nginx.port, setup)
        finally:
            nginx.stop()
    failed = [arm for arm, xs in p50.items() if None in xs]
    return {
        "protocol": protocol,
        "requests": count,
        "toxic": {"type": "http_abort", **NO_MATCH},
        **request_rounds(p50, "bare"),
        "instructions": instructions,
        **({"failed": failed} if failed else {}),
    }


def _instructions(ctx: _Run, protocol: str, port: int, setup: str) -> dict[str, Any]:
    """Instructions per request of a proxy with the toxic (*setup*), and of a bare one."""
    if not ctx.p.callgrind:
        return {"skipped": "not run (--callgrind 0)"}
    argv, count = _dataplane_argv(ctx.p), min(ctx.p.callgrind, CALLGRIND_MAX)
    out = proxy_instructions(_client_argv(protocol), port, argv, count, [setup])
    bare = proxy_instructions(_client_argv(protocol), port, argv, count, [])
    if "per_rtt" in bare:
        out["bare_per_rtt"] = bare["per_rtt"]
    return out


def _fetch(port: int, path: Path, size: int) -> tuple[float | None, str]:
    """MB/s of one ``/bulk`` fetched by curl through *port*, checked against the file at
    *path* byte for byte (None, and why, if it failed or differed)."""
    argv = ["curl", "-sS", "--fail", "-o", "-", f"http://{HOST}:{port}/bulk"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    got, same = 0, True
    try:
        with path.open("rb") as want:
            while chunk := proc.stdout.read(1 << 20):
                same = same and chunk == want.read(len(chunk))
                got += len(chunk)
        proc.wait(timeout=BULK_TIMEOUT_S + size / 10e6)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, "curl timed out"
    finally:
        proc.stdout.close()
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        return None, f"curl exited {proc.returncode}: {err}"
    if got != size or not same:
        return None, f"content differs ({got} of {size} bytes)"
    return size / seconds / 1e6, ""


def http_bulk_line(ctx: _Run, proxy: ProxyFactory, block: bytes) -> dict[str, Any]:
    """The ``http_bulk`` line's figures (see the module docstring): ``--toxic-bytes`` of
    *block* repeated, served by nginx; a fetch that failed or differed is named under
    ``failed``."""
    exe = _nginx()
    if exe is None:
        return {"skipped": "nginx is not installed"}
    if shutil.which("curl") is None:
        return {"skipped": "curl is not installed"}
    size = ctx.p.toxic_bytes
    with tempfile.TemporaryDirectory(prefix="faultnet-bench-nginx-") as tmp:
        body = Path(tmp) / "bulk"
        with body.open("wb") as f:
            for at in range(0, size, len(block)):
                f.write(block[: size - at])
        nginx = Nginx(exe, Path(tmp), http2=False)
        try:
            tp = proxy(nginx.port, _dataplane_argv(ctx.p))
            try:
                rounds: dict[str, list[float | None]] = {"bare": [], "toxic": []}
                why: list[str] = []
                for order in rotations(list(rounds), ctx.p.rounds):
                    for arm in order:
                        if arm == "toxic":
                            with tp.toxic("http_abort", "nomatch", **NO_MATCH):
                                mbps, bad = _fetch(tp.addr[1], body, size)
                        else:
                            mbps, bad = _fetch(tp.addr[1], body, size)
                        rounds[arm].append(mbps)
                        why += [f"{arm}: {bad}"] if bad else []
            finally:
                tp.stop()
        finally:
            nginx.stop()
    return {
        "bytes": size,
        "round_mbps": rounds,
        "mbps": {arm: _median(xs) for arm, xs in rounds.items()},
        "bulk_vs_bare": median_ratio(rounds["toxic"], rounds["bare"]),
        **({"failed": why} if why else {}),
    }


def _median(xs: list[float | None]) -> float | None:
    got = sorted(x for x in xs if x is not None)
    return got[len(got) // 2] if got else None
