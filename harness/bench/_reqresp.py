"""Request/response and connection churn, direct vs socat vs faultnet in one run.

* **request/response**: ``redis-benchmark`` (GET, 20 clients) against a redis-server of
  our own (``--save '' --appendonly no`` on a free loopback port, stopped by recorded
  identity), not pipelined (``-P 1``: every request waits for its reply, so each one
  pays the proxy's round trip) and pipelined (``-P 16``). Requests/s, median of the
  rounds. Skipped, and said so, when redis-server or redis-benchmark is not installed.
* **churn**: one client opens a connection, makes one 64-byte round trip through the
  bench's echo upstream, closes, and again, for ``churn`` connections; connections/s.

Each arm gets its own proxy in front of redis (a second faultnet proxy process, a second
socat), started and stopped like the first ones; rounds rotate the arms.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from typing import Any

from faultnet.errors import EnvironmentProblem
from faultnet.procs import stop_exact
from harness.bench._children import Child, Socat, _self_argv, start_listening
from harness.bench._stream import (
    CHILD_START_S,
    HOST,
    IO_TIMEOUT_S,
    MODE_ECHO,
    PING_LEN,
    _set_io_timeout,
)

#: redis-benchmark's shape: 20 clients as in issue 14's measurements; GET only (a SET
#: line moved with it in every run measured here).
REDIS_CLIENTS = 20
PIPELINES = (1, 16)
REDIS_RUN_S = 120.0


def find_redis() -> tuple[str, str] | str:
    """(redis-server, redis-benchmark) paths, or why the line is skipped."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    bench = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    for path in (server, bench):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{os.path.basename(path)} not found at {path}"
    return server, bench


class RedisServer:
    """A redis-server of our own on a free loopback port, no persistence."""

    def __init__(self, path: str) -> None:
        def argv(port: int) -> list[str]:
            return [path, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly",
                    "no", "--protected-mode", "no", "--logfile", ""]  # fmt: skip

        self.child, self.port = start_listening(argv, "redis-server")

    def stop(self) -> None:
        """SIGTERM (then SIGKILL) by recorded identity; reaped."""
        if self.child.proc.poll() is None:
            stop_exact(self.child.ident, term_timeout=5.0, kill_timeout=5.0)
        try:
            self.child.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.child._stderr.close()


def redis_rps(bench: str, port: int, requests: int, pipeline: int) -> float:
    """GET requests/s that redis-benchmark measured through 127.0.0.1:*port*."""
    return _benchmark_csv(bench, port, requests, pipeline)[1]


def _benchmark_csv(bench: str, port: int, requests: int, pipeline: int) -> list[float]:
    """redis-benchmark's GET line (``--csv``): requests/s, then the latencies in ms
    (average, min, p50, p95, p99, max); index 0 is unused."""
    argv = [bench, "-h", HOST, "-p", str(port), "-c", str(REDIS_CLIENTS), "-n", str(requests)]
    argv += ["-P", str(pipeline), "-t", "get", "--csv"]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=REDIS_RUN_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentProblem(f"redis-benchmark failed: {exc}") from None
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells[0] == "GET":
            return [0.0, *(float(c) for c in cells[1:])]
    raise EnvironmentProblem(f"redis-benchmark printed no GET line: {out[:200]!r}")


def redis_latency(bench: str, port: int, requests: int, pipeline: int) -> float:
    """The p50 latency in ms of GETs that redis-benchmark measured through *port*
    (each pipelined batch's, from its send to its last reply)."""
    return _benchmark_csv(bench, port, requests, pipeline)[4]


def churn(addr: tuple[str, int], count: int) -> dict[str, Any]:
    """*count* connections one after another, each: connect, one 64-byte round trip
    through the echo upstream, close. Returns connections/s and the p50/p99 of one
    connection's whole life in microseconds."""
    msg = os.urandom(PING_LEN)
    lives: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    for _ in range(count):
        t0 = clock()
        s = socket.create_connection(addr, timeout=IO_TIMEOUT_S)
        try:
            _set_io_timeout(s, IO_TIMEOUT_S)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(MODE_ECHO + msg)
            got = b""
            while len(got) < PING_LEN:
                k = s.recv(PING_LEN - len(got))
                if not k:
                    raise ConnectionError("echo closed the connection")
                got += k
            if got != msg:
                raise ConnectionError("echo returned different bytes")
        finally:
            s.close()
        lives.append(clock() - t0)
    elapsed = (clock() - start) / 1e9
    lives.sort()
    return {
        "connections": count,
        "per_s": count / elapsed if elapsed > 0 else None,
        "p50_us": lives[len(lives) // 2] / 1000,
        "p99_us": lives[min(len(lives) - 1, int(len(lives) * 0.99))] / 1000,
    }


class RedisArms:
    """redis-server plus a socat and a faultnet proxy in front of it."""

    def __init__(self, server: str, socat: str | None, proxy_argv: list[str]) -> None:
        self.redis = RedisServer(server)
        self.socat: Socat | None = None
        self.proxy: Child | None = None
        try:
            self.addrs: dict[str, int] = {"direct": self.redis.port}
            if socat is not None:
                self.socat = Socat(socat, self.redis.port)
                self.addrs["socat"] = self.socat.port
            self.proxy = Child(
                _self_argv("--role", "proxy", "--upstream-port", str(self.redis.port), *proxy_argv),
                "faultnet proxy (redis)",
            )
            self.addrs["faultnet"] = int(self.proxy.read_json(CHILD_START_S)["address"][1])
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        pids = [self.redis.child.pid]
        if self.socat is not None:
            pids.append(self.socat.child.pid)
        if self.proxy is not None:
            pids.append(self.proxy.pid)
        return pids

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.socat is not None:
            self.socat.stop()
        self.redis.stop()
