"""The control plane under connection churn: API latency while its proxies carry a storm
of short connections.

    python -m harness.api_churn [--seconds S] [--workers N] [--json]

It starts, each in its own process, an echo upstream, ``faultnet server`` (one proxy,
``churn``, in front of the echo) and churn workers that connect through the proxy,
make one 16-byte round trip and close, as fast as they can. Meanwhile this process
drives the API the way a Toxiproxy client does (one keep-alive HTTP connection, as
``requests`` keeps one): ``GET /version`` and a toxic added then deleted, one request
every 10 ms. It prints one line (or ``--json``, one object):

    api under churn: 1350 conn/s; GET /version p50 0.9 ms p99 2.0 ms; toxic add+delete
    p50 2.1 ms p99 5.0 ms; failed 0 of 1200

A failed request is one that got no answer (refused, reset, closed before the answer:
``RemoteDisconnected``, ``ECONNRESET``) or an unexpected status. Targets (issue 24
item 17): p99 <= 20 ms for both, 0 failed. Exit 0 when they were met, 1 when not, 2
when the run could not be made (a process did not start).

Every process it starts is stopped by its own PID when the run ends.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ChurnResult", "main", "measure"]

#: The targets the control plane must meet under churn (issue 24 item 17).
P99_TARGET_MS = 20.0
#: One API request this often (seconds): a busy client, not a flood of its own.
API_INTERVAL_S = 0.01
PAYLOAD = b"0123456789abcdef"


# -- the child processes -------------------------------------------------------------------


def _echo_main() -> None:
    """An echo server on 127.0.0.1 (one selectors loop); prints its port, runs until
    killed."""
    sel = selectors.DefaultSelector()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    listener.setblocking(False)
    sel.register(listener, selectors.EVENT_READ)
    print(listener.getsockname()[1], flush=True)
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ)
                continue
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                try:
                    sock.sendall(data)
                    continue
                except OSError:
                    pass
            sel.unregister(sock)
            sock.close()


def _churn_main(port: int, seconds: float) -> None:
    """Connect to 127.0.0.1:*port*, one round trip, close; repeat for *seconds*. Prints
    ``connections failures`` at the end."""
    done = failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(PAYLOAD)
                got = b""
                while len(got) < len(PAYLOAD):
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    got += chunk
                if got != PAYLOAD:
                    failed += 1
        except OSError:
            failed += 1
        done += 1
    print(done, failed, flush=True)


# -- the measurement ------------------------------------------------------------------------


@dataclass
class ChurnResult:
    """What one run measured."""

    seconds: float
    connections_per_s: float
    churn_failures: int
    version_p50_ms: float
    version_p99_ms: float
    toxic_p50_ms: float
    toxic_p99_ms: float
    requests: int
    failed: int
    failures: list[str]

    @property
    def met(self) -> bool:
        return (
            self.failed == 0
            and self.version_p99_ms <= P99_TARGET_MS
            and self.toxic_p99_ms <= P99_TARGET_MS
        )

    def line(self) -> str:
        return (
            f"api under churn: {self.connections_per_s:.0f} conn/s; GET /version p50 "
            f"{self.version_p50_ms:.1f} ms p99 {self.version_p99_ms:.1f} ms; toxic "
            f"add+delete p50 {self.toxic_p50_ms:.1f} ms p99 {self.toxic_p99_ms:.1f} ms; "
            f"failed {self.failed} of {self.requests} "
            f"(target p99 <= {P99_TARGET_MS:g} ms, 0 failed: "
            f"{'MET' if self.met else 'MISSED'})"
        )


def _pctl(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Api:
    """One keep-alive HTTP connection to the API; a request that gets no answer is a
    failure, and the next request opens a new connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "api-churn"}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        except BaseException:
            self.conn.close()
            self.conn = None
            raise


def _start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def _first_line(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    """The first stdout line of *proc*, within *timeout* seconds."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not out or not out[0]:
        raise RuntimeError(f"{what} did not start within {timeout} s")
    return out[0].strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(seconds: float = 10.0, workers: int = 4) -> ChurnResult:
    """Run the churn for *seconds* with *workers* churn processes; measure the API."""
    me = [sys.executable, "-m", "harness.api_churn"]
    procs: list[subprocess.Popen[str]] = []
    try:
        echo = _start([*me, "--role", "echo"])
        procs.append(echo)
        echo_port = int(_first_line(echo, 30, "the echo upstream"))
        server = _start([sys.executable, "-m", "faultnet", "server", "--port", "0"])
        procs.append(server)
        banner = _first_line(server, 60, "faultnet server")
        url = banner.split("listening on ", 1)[1].split()[0]
        host, _, port_text = url.removeprefix("http://").rpartition(":")
        api = _Api(host, int(port_text))
        status, raw = api.call(
            "POST", "/proxies", {"name": "churn", "upstream": f"127.0.0.1:{echo_port}"}
        )
        if status != 201:
            raise RuntimeError(f"cannot create the churn proxy: {status} {raw[:200]!r}")
        proxy_port = int(json.loads(raw)["listen"].rpartition(":")[2])
        churners = [
            _start([*me, "--role", "churn", "--port", str(proxy_port), "--seconds", str(seconds)])
            for _ in range(workers)
        ]
        procs.extend(churners)
        version: list[float] = []
        toxic: list[float] = []
        failures: list[str] = []
        requests = 0
        start = time.monotonic()
        end = start + seconds
        toxic_body = {"type": "latency", "name": "l", "attributes": {"latency": 1}}
        while time.monotonic() < end:
            for what in ("version", "toxic"):
                t0 = time.perf_counter()
                try:
                    if what == "version":
                        requests += 1
                        status, _ = api.call("GET", "/version")
                        ok = status == 200
                    else:
                        requests += 2
                        status, _ = api.call("POST", "/proxies/churn/toxics", toxic_body)
                        ok = status == 200
                        if ok:
                            status, _ = api.call("DELETE", "/proxies/churn/toxics/l")
                            ok = status == 204
                    if not ok:
                        failures.append(f"{what}: HTTP {status}")
                except (OSError, http.client.HTTPException) as exc:
                    failures.append(f"{what}: {type(exc).__name__}: {exc}")
                    continue
                ms = (time.perf_counter() - t0) * 1000
                (version if what == "version" else toxic).append(ms)
                time.sleep(API_INTERVAL_S)
        elapsed = time.monotonic() - start
        connections = churn_failures = 0
        for c in churners:
            out, _ = c.communicate(timeout=60)
            done, failed = (int(x) for x in out.split())
            connections += done
            churn_failures += failed
        return ChurnResult(
            seconds=round(elapsed, 2),
            connections_per_s=round(connections / elapsed, 1),
            churn_failures=churn_failures,
            version_p50_ms=round(statistics.median(version), 2) if version else float("nan"),
            version_p99_ms=round(_pctl(version, 0.99), 2),
            toxic_p50_ms=round(statistics.median(toxic), 2) if toxic else float("nan"),
            toxic_p99_ms=round(_pctl(toxic, 0.99), 2),
            requests=requests,
            failed=len(failures),
            failures=failures[:20],
        )
    finally:
        for p in reversed(procs):
            _stop(p)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.api_churn",
        description="Measure the faultnet API's latency (p50/p99) and failed requests "
        "while its proxy carries a storm of short connections. Exit 0 targets met, 1 "
        "missed, 2 the run could not be made.",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--workers", type=int, default=4, help="churn processes (default 4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--role", choices=("echo", "churn"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "echo":
        _echo_main()
        return 0
    if args.role == "churn":
        _churn_main(args.port, args.seconds)
        return 0
    if not (0 < args.seconds <= 3600) or not (0 <= args.workers <= 64):
        parser.error("--seconds must be in (0, 3600] and --workers in [0, 64]")
    try:
        result = measure(args.seconds, args.workers)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"api_churn: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(result), "met": result.met}))
    else:
        print(result.line())
        for failure in result.failures[:5]:
            print(f"  failed: {failure}")
    return 0 if result.met else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
