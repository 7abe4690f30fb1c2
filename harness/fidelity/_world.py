"""The fidelity run's world: its own network namespace, the kernel's faults (nftables),
the servers the clients talk to, and a faultnet proxy on a thread of its own.

Everything here lives inside one network namespace that the run makes for itself with
``unshare(CLONE_NEWNET)`` (:func:`enter_private_netns`): its loopback is the only
interface, so every address is 127.0.0.1 of that namespace, and the namespace (with its
nft table) goes away with the process, however it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import trio

from faultnet.errors import EnvironmentProblem
from faultnet.eventlog import JsonlWriter
from faultnet.events import EVENTS
from faultnet.proxy import Proxy
from faultnet.testing import recv_until
from faultnet.udp.proxy import UdpProxy

__all__ = [
    "EchoServer",
    "KernelFault",
    "Nginx",
    "ProxyThread",
    "Served",
    "enter_private_netns",
    "free_port",
    "http_server",
    "nginx_path",
    "nginx_server",
    "postgres_server",
    "redis_server",
    "udp_echo_server",
]

Address = tuple[str, int]
HOST = "127.0.0.1"
_CLONE_NEWNET = 0x40000000
_NFT_TABLE = "fidelity"


def enter_private_netns() -> None:
    """Move this process into a fresh network namespace with its loopback up.

    Call before any thread starts: a namespace is per thread, and threads and children
    started later inherit the caller's. EnvironmentProblem when not root or when
    ``ip``/``nft``/``ss`` are missing."""
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "the fidelity run needs root: it makes a network namespace and nftables rules"
        )
    for tool in ("ip", "nft", "ss"):
        if shutil.which(tool) is None:
            raise EnvironmentProblem(f"{tool} is not installed (iproute2 / nftables)")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise EnvironmentProblem(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
    _run(["ip", "link", "set", "lo", "up"])
    _run(["nft", "add", "table", "inet", _NFT_TABLE])


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise EnvironmentProblem(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class KernelFault:
    """The kernel's own version of a fault on the server's port, as nftables rules in
    one input chain. On loopback every segment passes the input hook exactly once (the
    output hook too: rules there would act twice), so a rule that matches both ports
    acts once on each segment of both directions. *protocol* ``udp`` makes the rules
    that name no TCP flag (drop both ways, random drop) match datagrams instead."""

    def __init__(self, port: int, protocol: str = "tcp") -> None:
        self.port = port
        self.protocol = protocol

    def _load(self, rules: list[str]) -> None:
        body = "\n".join(f"    {r}" for r in rules)
        script = (
            f"flush table inet {_NFT_TABLE}\n"
            f"table inet {_NFT_TABLE} {{\n  chain input {{\n"
            f"    type filter hook input priority 0; policy accept;\n{body}\n  }}\n}}\n"
        )
        _run(["nft", "-f", "-"], stdin=script)

    def drop_both_ways(self) -> None:
        """A dead route: every segment to or from the port is dropped."""
        p, proto = self.port, self.protocol
        self._load([f"{proto} dport {p} drop", f"{proto} sport {p} drop"])

    def drop_syns(self) -> None:
        """New connects hang: SYNs (not SYN-ACKs) to the port are dropped."""
        self._load([f"tcp dport {self.port} tcp flags & (syn | ack) == syn drop"])

    def drop_random_syns(self, percent: int) -> None:
        """Lossy connects: each SYN to the port (a first one or a retry) dropped with
        probability *percent* / 100, the rest of the handshake untouched."""
        self._load(
            [
                f"tcp dport {self.port} tcp flags & (syn | ack) == syn"
                f" numgen random mod 100 < {percent} drop"
            ]
        )

    def drop_one_way(self, direction: str) -> None:
        """A route dead one way: *direction* ``upstream`` drops every segment the
        clients send to the port, ``downstream`` every segment the port sends them."""
        field = {"upstream": "dport", "downstream": "sport"}[direction]
        self._load([f"tcp {field} {self.port} drop"])

    def drop_peer_both_ways(self, peer: str) -> None:
        """A dead route to one client: every segment between *peer* and the port
        dropped, every other client's untouched."""
        p = self.port
        self._load([f"ip saddr {peer} tcp dport {p} drop", f"ip daddr {peer} tcp sport {p} drop"])

    def reject_with_reset(self) -> None:
        """A firewall's reject: every segment to the port answered with an RST."""
        self._load([f"tcp dport {self.port} reject with tcp reset"])

    def random_drop(self, percent: int) -> None:
        """Each segment either way dropped with probability *percent* / 100."""
        p, proto = self.port, self.protocol
        self._load(
            [
                f"{proto} dport {p} numgen random mod 100 < {percent} drop",
                f"{proto} sport {p} numgen random mod 100 < {percent} drop",
            ]
        )

    def random_drop_from_server(self, percent: int) -> None:
        """Each segment the server sends dropped with probability *percent* / 100 (a
        download's data; the client's ACKs all arrive): one-way loss."""
        self._load([f"tcp sport {self.port} numgen random mod 100 < {percent} drop"])

    def abort_server_sockets(self, peer: str | None = None) -> None:
        """The peer aborting: every established socket on the port (with *peer*, those
        of that client's address only) destroyed (``ss -K``, SOCK_DESTROY), which sends
        the client an RST."""
        only = ["dst", peer] if peer is not None else []
        done = subprocess.run(
            ["ss", "-K", "-t", "state", "established", "sport", "=", f":{self.port}", *only],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode != 0:
            raise EnvironmentProblem(f"ss -K failed: {done.stderr.strip()}")

    def clear(self) -> None:
        _run(["nft", "flush", "table", "inet", _NFT_TABLE])


# -- servers --


class _ThreadedServer:
    """A blocking server on loopback: a thread accepts, and a thread a connection runs
    :meth:`_serve` on it; every connection is kept until :meth:`close`."""

    def __init__(self) -> None:
        self.listener = socket.create_server((HOST, 0), backlog=64)
        self.port = int(self.listener.getsockname()[1])
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()


class EchoServer(_ThreadedServer):
    """A blocking echo server on a thread, each write sent at once (``TCP_NODELAY``); a
    request ``GET n`` (a line) gets *n* bytes of a fixed pattern back instead, and
    ``PUT n`` (a line, then *n* bytes: an upload) is read to its end and answered
    ``ok``."""

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        try:
            # Each echo sent at once, as the proxy sends (no Nagle): a small echo held
            # until the last one's ACK, which rides on the next message, came back a
            # whole period late. Measured, the latency rows' 1 ms pacing beside
            # stress-ng --cpu 2: an arm's median a period high in 4 samples of 15 (the
            # toxic arm's in each, the plain arm's too in one; in a CI run the plain
            # arm's alone: 4.08 ms added, red); with it, 0 of 15.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(65536):
                if data.startswith(b"GET "):
                    n = int(data.split()[1])
                    conn.sendall(pattern(n))
                elif data.startswith(b"PUT "):
                    head, _, body = data.partition(b"\n")
                    _sink(conn, int(head.split()[1]) - len(body))
                    conn.sendall(b"ok\n")
                else:
                    conn.sendall(data)
        except OSError:
            pass

    def close_connections(self, peer: str | None = None) -> None:
        """A clean close by the server: FIN on every connection it has (with *peer*,
        on those from that client's address only)."""
        conns = [c for c in self._conns if peer is None or _peer_host(c) == peer]
        self._conns = [c for c in self._conns if c not in conns]
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_WR)
            c.close()


def _sink(conn: socket.socket, n: int) -> None:
    """Read and drop *n* bytes of an upload (OSError on EOF before them: the client died)."""
    while n > 0:
        data = conn.recv(min(n, 262144))
        if not data:
            raise ConnectionError("EOF in an upload")
        n -= len(data)


def _peer_host(conn: socket.socket) -> str | None:
    try:
        return str(conn.getpeername()[0])
    except OSError:  # already gone
        return None


def pattern(n: int) -> bytes:
    block = bytes(range(256)) * 256
    return (block * (n // len(block) + 1))[:n]


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[int, int]]:
    """redis-server on a free port (no persistence) for the block; yields (port, pid)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise EnvironmentProblem("redis-server is not installed")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fidelity-redis-") as tmp:
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
            + ["--dir", tmp, "--daemonize", "no", "--tcp-keepalive", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(port, proc, "redis-server")
            yield port, proc.pid
        finally:
            _stop(proc)


@contextlib.contextmanager
def postgres_server(**settings: str) -> Iterator[int | None]:
    """PostgreSQL's own binaries on a free port, in a temporary cluster, run as the
    ``postgres`` user (trust auth, loopback only), with *settings* as ``-c name=value``
    (``max_connections="2"``); yields the port, or None when PostgreSQL is not
    installed."""
    bindir = _postgres_bindir()
    if bindir is None:
        yield None
        return
    import pwd

    try:
        pg = pwd.getpwnam("postgres")
    except KeyError:
        yield None
        return
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="fidelity-pg-"))
    os.chown(tmp, pg.pw_uid, pg.pw_gid)

    def as_postgres() -> None:
        os.setgid(pg.pw_gid)
        os.setuid(pg.pw_uid)

    data = tmp / "data"
    proc: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-N"],
            preexec_fn=as_postgres,
            capture_output=True,
            check=True,
            timeout=60,
        )
        proc = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(tmp)]
            + ["-c", f"listen_addresses={HOST}", "-c", "fsync=off"]
            + [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")],
            preexec_fn=as_postgres,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_listening(port, proc, "postgres", bound=30)
        yield port
    finally:
        if proc is not None:
            _stop(proc, signal.SIGINT)  # fast shutdown
        shutil.rmtree(tmp, ignore_errors=True)


def _postgres_bindir() -> Path | None:
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    for version in sorted(root.iterdir(), reverse=True):
        if (version / "bin" / "postgres").exists():
            return version / "bin"
    return None


def _wait_listening(port: int, proc: subprocess.Popen[Any], what: str, bound: float = 10) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EnvironmentProblem(f"{what} exited with {proc.returncode} on start")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.2):
            return
        time.sleep(0.02)  # polling a server's start-up, bounded above
    raise EnvironmentProblem(f"{what} did not listen within {bound} s")


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: The UDP echo server: a process of its own, so that SIGSTOP (an application hang, the
#: kernel's version of a freeze) stops it alone; its datagrams wait in its socket.
_UDP_ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    data, peer = s.recvfrom(65536)
    s.sendto(data, peer)
"""


@contextlib.contextmanager
def udp_echo_server() -> Iterator[tuple[int, int]]:
    """A UDP echo server in a process of its own for the block; yields (port, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _UDP_ECHO, HOST], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # its port, once bound (EOF if it died)
        if not line.strip().isdigit():
            raise EnvironmentProblem(f"the UDP echo server did not start ({proc.poll()})")
        yield int(line), proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process takes no SIGTERM
        _stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """An HTTP/1.1 server on a thread: ``/`` answers a short body; ``/stream`` sends
    chunks of 64 KiB every 50 ms for 30 s (a download a fault lands in)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path == "/stream":
                self.send_response(200)
                self.send_header("Content-Length", str(600 * 65536))
                self.end_headers()
                with contextlib.suppress(OSError):  # the faults end it: reset, aborted
                    for _ in range(600):
                        self.wfile.write(pattern(65536))
                        self.wfile.flush()
                        time.sleep(0.05)  # the server's own pace: a slow stream
                self.close_connection = True
                return
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


# -- nginx: the HTTP toxics' real thing --

#: The body nginx serves on every path, in bytes: a whole second's worth at
#: :data:`NGINX_RATE`, so that nginx's ``limit_rate`` (a second's worth at once, then
#: the rest when that second is over: measured, 10,240 bytes at 0.001 s, the next at
#: 1.005 s) and the slow_body toxic's pacing (1/20 of a second's worth 20 times a
#: second, from the first byte) end together (measured: 1.00 s each, +- 0.02).
NGINX_BODY = 16384
#: nginx's ``limit_rate`` on ``/slow``, bytes a second.
NGINX_RATE = 16384
#: Where the upstream behind ``/cut`` dies: after this many bytes of the body.
NGINX_CUT_AT = 5000

_NGINX_CONF = """
{user}
worker_processes 1;
pid {dir}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    default_type application/octet-stream;
    log_format rows '$request_uri $status $connection';
    access_log off;
    server {{
        listen {host}:{fault};
        access_log {dir}/fault.log rows;
        location = /abort {{ return 503; }}
        location = /cut {{ proxy_pass http://{host}:{upstream}; }}
        location = /hang {{ proxy_pass http://{host}:{upstream}; proxy_read_timeout 3600s; }}
        location = /slow {{ alias {dir}/body; limit_rate {rate}; }}
        location = /sync {{ return 204; }}
    }}
    server {{
        listen {host}:{plain};
        location / {{ root {dir}; try_files /body =404; }}
    }}
}}
"""


class _DyingUpstream(_ThreadedServer):
    """The upstream behind nginx's ``/cut`` and ``/hang``, on a thread: it reads a
    request's head; for ``/cut`` it sends a 200 head with a Content-Length of
    :data:`NGINX_BODY` and the first :data:`NGINX_CUT_AT` bytes of that body, then
    closes (FIN); for anything else it answers nothing and keeps the connection until
    its peer closes it."""

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            head = recv_until(conn, b"\r\n\r\n")
            if b"\r\n\r\n" not in head:
                return
            if head.startswith(b"GET /cut "):
                conn.sendall(
                    f"HTTP/1.1 200 OK\r\nContent-Length: {NGINX_BODY}\r\n\r\n".encode()
                    + pattern(NGINX_BODY)[:NGINX_CUT_AT]
                )
                return
            while conn.recv(65536):  # hung: never answers, until its peer goes
                pass


class Served(NamedTuple):
    """What a server saw of a path: its requests, and the connections they came on."""

    requests: int
    connections: int


class Nginx:
    """A throwaway nginx (see :func:`nginx_server`): ``fault_port`` does each HTTP fault
    itself, ``plain_port`` serves the same paths whole (a toxic's upstream):

    ========== ============================================== ================
    path       fault_port                                     plain_port
    ========== ============================================== ================
    ``/abort`` ``return 503``                                 the body, 200
    ``/cut``   proxied to an upstream that dies mid-body      the body, 200
    ``/slow``  the body at ``limit_rate`` :data:`NGINX_RATE`  the body, 200
    ``/hang``  proxied to an upstream that never answers      the body, 200
               (``proxy_read_timeout`` 1 h)
    ========== ============================================== ================
    """

    def __init__(self, directory: Path, fault_port: int, plain_port: int) -> None:
        self.fault_port = fault_port
        self.plain_port = plain_port
        self._log = directory / "fault.log"
        self._syncs = 0

    def served(self, path: str) -> Served:
        """How many requests for *path* ``fault_port`` has had, every one the caller's
        client has finished with included, and on how many connections (its access
        log: nginx writes a request's line, with its connection's serial number, once
        it is done with it, answered or given up by its client).

        The log is read after a request of our own for ``/sync`` is in it: nginx runs
        one worker, which handles its events in the order they came, so a request its
        client finished (or a close its client sent) before asking ``/sync`` is
        logged before ``/sync`` is."""
        self._syncs += 1
        token = f"/sync?{self._syncs}"
        with socket.create_connection((HOST, self.fault_port), timeout=5) as s:
            s.sendall(f"GET {token} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass
        deadline = time.monotonic() + 5
        while True:
            lines = self._log.read_text().splitlines()
            if any(line.startswith(f"{token} 204") for line in lines):
                break
            if time.monotonic() > deadline:
                raise EnvironmentProblem(f"nginx did not log {token} within 5 s")
            time.sleep(0.005)  # polling nginx's log for our own line, bounded above
        rows = [line.split(" ") for line in lines]
        mine = [row for row in rows if row[0].split("?", 1)[0] == path]
        return Served(len(mine), len({row[2] for row in mine}))


def nginx_path() -> str | None:
    """nginx's executable: on PATH, or Debian's /usr/sbin/nginx (a PATH without sbin's
    is common outside root's shell); None when it is not installed."""
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"
    return found


@contextlib.contextmanager
def nginx_server() -> Iterator[Nginx]:
    """nginx (Debian's, /usr/sbin/nginx) from a temporary directory of its own
    (configuration, logs, pid, the body it serves), on two free loopback ports, with
    its dying upstream, for the block; stopped by the PID it was started with. As root
    its worker runs as root (it reads the temporary directory, mode 0700)."""
    exe = nginx_path()
    if exe is None:
        raise EnvironmentProblem("nginx is not installed")
    upstream = _DyingUpstream()
    tmp = Path(tempfile.mkdtemp(prefix="fidelity-nginx-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        (tmp / "body").write_bytes(pattern(NGINX_BODY))
        fault, plain = free_port(), free_port()
        conf = _NGINX_CONF.format(
            user="user root;" if os.geteuid() == 0 else "",
            dir=tmp,
            host=HOST,
            fault=fault,
            plain=plain,
            upstream=upstream.port,
            rate=NGINX_RATE,
        )
        (tmp / "nginx.conf").write_text(conf)
        proc = subprocess.Popen(
            [exe, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")]
            + ["-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_listening(fault, proc, "nginx")
        _wait_listening(plain, proc, "nginx")
        yield Nginx(tmp, fault, plain)
    finally:
        if proc is not None:
            _stop(proc)  # SIGTERM: nginx's fast shutdown, its worker with it
        upstream.close()
        shutil.rmtree(tmp, ignore_errors=True)


# -- faultnet --


class _CountingLog(JsonlWriter):
    """A proxy's event log that keeps no record but counts the connections accepted
    (``conn_open``: written when one is accepted, before a byte of it is carried)."""

    def __init__(self) -> None:
        super().__init__(None, vocabulary=EVENTS)
        self.opened = 0

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        if event == "conn_open":
            self.opened += 1
        return super().write(event, **fields)


class ProxyThread:
    """A faultnet proxy to *upstream* (a TCP one, or with *protocol* ``udp`` a UDP one),
    run by trio on a thread of its own, so that the clients (blocking libraries,
    subprocesses) run on the caller's. :meth:`call` runs one of the proxy's fault
    methods and returns when it has (total on return); :meth:`opened` counts the
    connections a TCP one has accepted."""

    def __init__(self, upstream_port: int, protocol: str = "tcp") -> None:
        self._protocol = protocol
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self.proxy: Proxy | UdpProxy | None = None
        self._error: BaseException | None = None
        self._log = _CountingLog()
        self._thread = threading.Thread(target=self._main, args=(upstream_port,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self.proxy is None:
            raise EnvironmentProblem(f"the faultnet proxy did not start: {self._error!r}")
        assert self.proxy.address is not None
        self.port: int = int(self.proxy.address[1])

    def _main(self, upstream_port: int) -> None:
        async def run() -> None:
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            proxy: Proxy | UdpProxy
            if self._protocol == "udp":
                proxy = UdpProxy((HOST, upstream_port), (HOST, 0), event_log=self._log)
            else:
                proxy = Proxy((HOST, upstream_port), (HOST, 0), event_log=self._log)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.serve)
                self.proxy = proxy
                self._ready.set()
                await self._stop.wait()
                await proxy.aclose()

        try:
            trio.run(run)
        except BaseException as exc:  # reported by __init__ or close
            self._error = exc
            self._ready.set()

    def opened(self) -> int:
        """How many connections the proxy has accepted so far: every one a client has
        had answered through it included (each is counted before it is carried)."""
        return self._log.opened

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert self.proxy is not None
        fn: Callable[..., Any] = getattr(self.proxy, method)
        return trio.from_thread.run(lambda: fn(*args, **kwargs), trio_token=self._token)

    def call_sync(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` for a method that is not async (``add_toxic``)."""
        assert self.proxy is not None
        fn: Callable[..., Any] = getattr(self.proxy, method)
        return trio.from_thread.run_sync(lambda: fn(*args, **kwargs), trio_token=self._token)

    def close(self) -> None:
        if self._stop is not None and self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)
