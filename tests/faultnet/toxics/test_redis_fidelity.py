"""The redis toxic held against redis-server producing the same fault itself (principle
13), on loopback: the real arm is redis-server doing it (a replica's READONLY,
``maxmemory`` with ``noeviction`` full for OOM, ``DEBUG SLEEP`` for a slow reply,
``CLIENT KILL`` of a client awaiting its reply) behind a faultnet proxy with no toxic;
faultnet's arm is a healthy redis-server behind a proxy with the ``redis`` toxic. Three
real clients: redis-py with no retry (the exception class), redis-py with its ``Retry``
(two retries, no backoff: the outcome and how many retries it made), and redis-cli (its
exit code and what it printed; not on the rows whose reply never comes in time, as
redis-cli has no read timeout). Each row has a breakage that turns it red: the error's
wrong prefix, a delay too long or too short, a fault on every try instead of the first.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.exceptions as rexc
from redis.backoff import NoBackoff
from redis.retry import Retry

from faultnet.protocols.http import Inject
from faultnet.protocols.resp import Session
from faultnet.toxics import Redis
from harness.fidelity._world import ProxyThread
from tests.conftest import require_program

READONLY = "READONLY You can't write against a read only replica."
OOM = "OOM command not allowed when used memory > 'maxmemory'."
#: The client's read timeout on the rows whose reply comes late (s).
TIMEOUT_S = 1.0
#: What the server sleeps (real arm) or the toxic delays (faultnet's) past that
#: timeout: each of three tries times out (measured: the real arm's three end in
#: 3.9-4.1 s, faultnet's in 3.0-3.1 s; the retries' count, not the time, is compared).
LATE_S = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(tmp: Path, *args: str) -> Iterator[int]:
    """A redis-server of our own on a free loopback port, no persistence, up (PING
    answered) before the block; stopped by the process we started."""
    port = free_port()
    exe = require_program(shutil.which("redis-server"), "redis-server")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(tmp), "--enable-debug-command", "yes", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_answering(port, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_answering(port: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until redis-server on *port* answers PING (bound: 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2).ping()
            return
        except rexc.ConnectionError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # a bounded poll: redis-server says nothing when it is up


@dataclass
class Servers:
    healthy: int
    replica: int
    full: int


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("redis-fidelity")
    with contextlib.ExitStack() as stack:
        healthy = stack.enter_context(redis_server(mk(tmp / "h")))
        replica = stack.enter_context(
            redis_server(mk(tmp / "r"), "--replicaof", "127.0.0.1", str(healthy))
        )
        full = stack.enter_context(redis_server(mk(tmp / "f"), "--maxmemory-policy", "noeviction"))
        fill(full)
        yield Servers(healthy, replica, full)


def mk(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


def fill(port: int) -> None:
    """2 MB of data, then ``maxmemory 1mb``: used memory stays well over it (noeviction
    keeps what it holds), so every write is refused with OOM. (Filled up to the limit
    instead, a small write still fitted now and then: measured, one run in two.)"""
    r = redis.Redis(port=port)
    for i in range(20):
        r.set(f"fill:{i}", b"x" * 100_000)
    r.config_set("maxmemory", "1mb")
    with pytest.raises(rexc.OutOfMemoryError):
        r.set("probe", "x")


# -- the clients -------------------------------------------------------------------------


class Counting(NoBackoff):
    """No backoff, and a count of the retries it was asked for (redis-py deep-copies
    its Retry, so the count lives on the class)."""

    retries = 0

    def compute(self, failures: int) -> float:
        type(self).retries += 1
        return 0


Op = Callable[[redis.Redis], Any]


def outcome(op: Op, port: int, retry: bool, timeout: float) -> Any:
    """What redis-py made of *op* through *port*: ``ok`` or the exception's class, and
    with *retry* the retries it made (its Retry: two, on the errors the rows raise)."""
    errors = (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError, rexc.OutOfMemoryError)
    Counting.retries = 0
    kwargs: dict[str, Any] = {"retry": Retry(Counting(), 2, supported_errors=errors)}
    if not retry:
        kwargs = {"retry": Retry(NoBackoff(), 0)}
    client = redis.Redis(port=port, socket_timeout=timeout, **kwargs)
    try:
        op(client)
        seen = "ok"
    except rexc.RedisError as exc:
        seen = type(exc).__name__
    finally:
        client.close()
    return (seen, Counting.retries) if retry else seen


def cli(argv: list[str], port: int) -> tuple[int, str]:
    exe = require_program(shutil.which("redis-cli"), "redis-cli")
    done = subprocess.run([exe, "-p", str(port), *argv], capture_output=True, text=True, timeout=20)
    return done.returncode, (done.stdout + done.stderr).strip()


# -- the rows ------------------------------------------------------------------------------


@dataclass
class Row:
    #: The real arm: which server, the command its clients send, what runs beside them.
    real: str
    real_argv: list[str]
    #: faultnet's arm: the command its clients send through the toxic.
    argv: list[str]
    toxic: dict[str, Any]
    #: The breakage: attributes that must make faultnet's arm differ.
    breakage: dict[str, Any]
    timeout: float = 10.0
    with_cli: bool = True
    #: Before each client: setting up the healthy server (faultnet's arm).
    prepare: Callable[[int], None] = lambda port: None
    real_prepare: Callable[[int], None] = lambda port: None
    #: Beside each real client (a thread): what makes the server fail it.
    beside: Callable[[int], None] | None = None
    after: Callable[[int], None] = lambda port: None
    tags: list[str] = field(default_factory=list)


def queue_two(port: int) -> None:
    r = redis.Redis(port=port)
    r.delete("q")
    r.rpush("q", "first", "second")


def empty_queue(port: int) -> None:
    redis.Redis(port=port).delete("q")


def kill_the_waiting_client(port: int) -> None:
    """CLIENT KILL of the client blocked in BLPOP, once it is (a bounded poll of CLIENT
    LIST), then a value for its retry."""
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        waiting = [c for c in r.client_list() if c["cmd"] == "blpop"]
        if waiting:
            r.client_kill_filter(_id=waiting[0]["id"])
            r.rpush("q", "after")
            return
        time.sleep(0.005)
    raise AssertionError("no client blocked in BLPOP within 10 s")


ROWS: dict[str, Row] = {
    "READONLY: a replica refuses a write": Row(
        "replica", ["SET", "k", "v"], ["SET", "k", "v"],
        {"fault": "error", "command": "set", "key": "k", "error": READONLY},
        {"error": "ERR You can't write against a read only replica."},
    ),
    "OOM: maxmemory full, noeviction": Row(
        "full", ["SET", "k", "v"], ["SET", "k", "v"],
        {"fault": "error", "command": "SET", "error": OOM},
        {"error": "ERR command not allowed when used memory > 'maxmemory'."},
    ),
    "a slow reply within the timeout (DEBUG SLEEP 0.3)": Row(
        "healthy", ["DEBUG", "SLEEP", "0.3"], ["DEBUG", "SLEEP", "0"],
        {"fault": "delay", "command": "DEBUG", "delay_ms": 300},
        {"delay_ms": 3000}, timeout=2.0,
    ),
    "a reply later than the timeout (DEBUG SLEEP 1.5)": Row(
        "healthy", ["DEBUG", "SLEEP", str(LATE_S)], ["DEBUG", "SLEEP", "0"],
        {"fault": "delay", "command": "DEBUG", "delay_ms": int(LATE_S * 1000)},
        {"delay_ms": 100}, timeout=TIMEOUT_S, with_cli=False, after=wait_answering,
    ),
    "a reply that never comes in time: hold (DEBUG SLEEP 1.5)": Row(
        "healthy", ["DEBUG", "SLEEP", str(LATE_S)], ["DEBUG", "SLEEP", "0"],
        {"fault": "hold", "command": "DEBUG"},
        {"count": 1}, timeout=TIMEOUT_S, with_cli=False, after=wait_answering,
    ),
    "CLIENT KILL of a client awaiting its reply": Row(
        "healthy", ["BLPOP", "q", "5"], ["BLPOP", "q", "5"],
        {"fault": "close", "command": "BLPOP", "count": 1},
        {"count": 0},
        prepare=queue_two, real_prepare=empty_queue, beside=kill_the_waiting_client,
        after=empty_queue,
    ),
}  # fmt: skip


def arm(
    row: Row, upstream: int, argv: list[str], toxic: dict[str, Any] | None, real: bool
) -> dict[str, Any]:
    """Each client's outcome through a fresh proxy to *upstream* (with the *toxic*, or
    none: its count starts afresh for each client)."""
    seen: dict[str, Any] = {}

    def op(r: redis.Redis) -> Any:
        return r.execute_command(*argv)

    clients: dict[str, Callable[[int], Any]] = {
        "redis-py": lambda port: outcome(op, port, False, row.timeout),
        "redis-py Retry(2)": lambda port: outcome(op, port, True, row.timeout),
    }
    if row.with_cli:
        clients["redis-cli"] = lambda port: cli(argv, port)
    for name, client in clients.items():
        (row.real_prepare if real else row.prepare)(upstream)
        proxy = ProxyThread(upstream)
        try:
            if toxic is not None:
                proxy.call_sync("add_toxic", Redis(**toxic))
            beside = None
            if real and row.beside is not None:
                beside = threading.Thread(target=row.beside, args=(upstream,))
                beside.start()
            seen[name] = client(proxy.port)
            if beside is not None:
                beside.join(15)
        finally:
            proxy.close()
        row.after(upstream)
    return seen


def real_arm(row: Row, servers: Servers) -> dict[str, Any]:
    port = getattr(servers, row.real)
    return arm(row, port, row.real_argv, None, True)


@pytest.mark.parametrize("name", list(ROWS))
def test_the_redis_toxic_is_what_redis_server_doing_it_is(name: str, servers: Servers) -> None:
    row = ROWS[name]
    real = real_arm(row, servers)
    faulted = arm(row, servers.healthy, row.argv, row.toxic, False)
    print(name, "real:", real, "faultnet:", faulted)
    assert faulted == real, (name, real, faulted)
    broken = arm(row, servers.healthy, row.argv, {**row.toxic, **row.breakage}, False)
    print(name, "broken:", broken)
    assert broken != real, (name, "the breakage went unnoticed", broken)


# -- pipelined: the error in its place -----------------------------------------------------


def pipelined(port: int) -> list[str]:
    """redis-py's pipeline (no transaction) of GET, SET, GET: each reply, in order."""
    client = redis.Redis(port=port, retry=Retry(NoBackoff(), 0))
    try:
        pipe = client.pipeline(transaction=False)
        pipe.get("missing").set("k", "v").get("missing")
        replies = pipe.execute(raise_on_error=False)
    finally:
        client.close()
    return [type(r).__name__ if isinstance(r, Exception) else repr(r) for r in replies]


def through(upstream: int, toxic: dict[str, Any] | None, client: Callable[[int], Any]) -> Any:
    proxy = ProxyThread(upstream)
    try:
        if toxic is not None:
            proxy.call_sync("add_toxic", Redis(**toxic))
        return client(proxy.port)
    finally:
        proxy.close()


def out_of_order(self: Any, now: float) -> None:
    """The breakage: an error answered at once, ahead of the replies owed before it."""
    answered = [s for s in self.slots if s.answer is not None]
    for slot in answered:
        self.slots.remove(slot)
        self._emit(Inject("downstream", slot.answer))


async def test_a_pipelined_readonly_is_in_its_place_as_the_replica_s(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio

    toxic = {"fault": "error", "command": "SET", "error": READONLY}
    real = await trio.to_thread.run_sync(through, servers.replica, None, pipelined)
    faulted = await trio.to_thread.run_sync(through, servers.healthy, toxic, pipelined)
    assert real == ["None", "ReadOnlyError", "None"]
    assert faulted == real
    monkeypatch.setattr(Session, "_sync", out_of_order)
    broken = await trio.to_thread.run_sync(through, servers.healthy, toxic, pipelined)
    assert broken != real, broken
