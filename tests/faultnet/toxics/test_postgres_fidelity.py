"""The postgres toxic held against PostgreSQL producing the same failure (principle 13),
on loopback, as the dns toxic is held against dnsmasq. Each row runs one scenario twice
through a faultnet proxy: once with no toxic against a PostgreSQL that fails by itself
(two conflicting SERIALIZABLE transactions: 40001; ``pg_terminate_backend``: 57P01;
``max_connections`` reached: 53300), once with the ``postgres`` toxic against a
PostgreSQL that would not fail. Two real clients: psycopg in a tenacity retry loop (the
exception's class and SQLSTATE, the transaction status right after it, how many
attempts, whether the last one succeeded) and ``psql`` (its exit code and what it
printed, ports left out). The arms must see the same. Each row has a breakage that turns
it red: the toxic with a wrong SQLSTATE (40P01, 57P02, 53400)."""

from __future__ import annotations

import functools
import os
import re
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from faultnet.protocols.postgres import parse_error_response
from faultnet.proxy import open_proxy
from faultnet.toxics import Postgres
from harness.fidelity._world import _postgres_bindir, postgres_server
from tests.conftest import require_program

psycopg = pytest.importorskip("psycopg")
tenacity = pytest.importorskip("tenacity")

HOST = "127.0.0.1"


def _bindir() -> Path:
    found = _postgres_bindir()
    return Path(require_program(str(found) if found else None, "PostgreSQL"))


def _connect(port: int, **kwargs: Any) -> Any:
    return psycopg.connect(
        host=HOST, port=port, user="postgres", dbname="postgres", connect_timeout=5, **kwargs
    )


def _ready(port: int) -> None:
    """Wait (bounded) until the new cluster takes connections: it listens before it
    has finished starting ("the database system is starting up")."""
    deadline = time.monotonic() + 30
    while True:
        try:
            _connect(port).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling a server's start-up, bounded above


@pytest.fixture(scope="module")
def pg() -> Iterator[int]:
    """A PostgreSQL that fails only when made to, with a table ``t`` of one row."""
    _bindir()
    with postgres_server() as port:
        assert port is not None
        _ready(port)
        with _connect(port, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
            conn.execute("INSERT INTO t VALUES (1, 0)")
        yield port


@pytest.fixture(scope="module")
def full_pg() -> Iterator[int]:
    """A PostgreSQL of two connections at most (none reserved)."""
    _bindir()
    with postgres_server(max_connections="2", superuser_reserved_connections="0") as port:
        assert port is not None
        _ready(port)
        yield port


async def through(port: int, toxic: dict[str, Any] | None, scenario: Callable[[int], Any]) -> Any:
    """*scenario* (in a thread, as a program calls its client) through a proxy in front
    of *port*, with the postgres *toxic*; or, *toxic* None, straight at *port*."""
    if toxic is None:
        return await trio.to_thread.run_sync(scenario, port)
    async with open_proxy((HOST, port)) as proxy:
        proxy.add_toxic(Postgres(**toxic))
        assert proxy.address is not None
        return await trio.to_thread.run_sync(scenario, proxy.address[1])


def _no_port(text: str) -> str:
    return re.sub(r"port \d+", "port N", text)


def psql(port: int, script: str, appname: str = "psql") -> tuple[int, str, str]:
    """``psql`` running *script*: its exit code, what it printed, what it said."""
    done = subprocess.run(
        [str(_bindir() / "psql"), "-X", "-h", HOST, "-p", str(port), "-U", "postgres"]
        + ["-d", "postgres", "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PGAPPNAME": appname, "PGCONNECT_TIMEOUT": "5"},
    )
    return done.returncode, done.stdout, _no_port(done.stderr)


def _psql_line(port: int, sql: str) -> str:
    """A ``\\!`` line: another psql, straight at the server, running *sql* quietly."""
    bindir = _bindir()
    return (
        f'\\! {bindir}/psql -X -q -h {HOST} -p {port} -U postgres -d postgres -c "{sql}" >/dev/null'
    )


# -- 40001: two conflicting SERIALIZABLE transactions ----------------------------------


def _outcome(retried: Callable[[], None], conns: list[Any]) -> str:
    """Run a retry loop: ``committed``, or the class of the error it gave up on; then
    close its connections (*conns*, as they are by then)."""
    try:
        retried()
        return "committed"
    except psycopg.Error as exc:
        return type(exc).__name__
    finally:
        for conn in conns:
            conn.close()


def serializable_retry(port: int, conflict: Callable[[], None]) -> dict[str, Any]:
    """psycopg, SERIALIZABLE, in a tenacity loop retrying SerializationFailure (3 tries):
    read the row, (*conflict*, on the first try,) update it with a parameter (the
    extended protocol), commit. Each try: its error's class, SQLSTATE and the
    transaction status right after, or ``committed``."""
    tries: list[tuple[str, str | None, str]] = []
    conn = _connect(port)
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE

    @tenacity.retry(
        retry=tenacity.retry_if_exception_type(psycopg.errors.SerializationFailure),
        stop=tenacity.stop_after_attempt(3),
        reraise=True,
    )
    def transfer() -> None:
        conn.execute("SELECT count(*) FROM t WHERE id = 1").fetchone()
        if not tries:
            conflict()
        try:
            conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (1,))
        except psycopg.Error as exc:
            tries.append((type(exc).__name__, exc.sqlstate, conn.info.transaction_status.name))
            conn.rollback()
            raise
        conn.commit()
        tries.append(("committed", None, conn.info.transaction_status.name))

    return {"tries": tries, "outcome": _outcome(transfer, [conn])}


PSQL_40001 = """BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT count(*) FROM t WHERE id = 1;
{conflict}
UPDATE t SET v = v + 1 WHERE id = 1;
\\echo sqlstate :LAST_ERROR_SQLSTATE
SELECT 1;
\\echo sqlstate :LAST_ERROR_SQLSTATE
ROLLBACK;
"""


def _update_t(port: int) -> None:
    with _connect(port, autocommit=True) as conn:
        conn.execute("UPDATE t SET v = v + 1 WHERE id = 1")


async def _arms_40001(pg: int, toxic: dict[str, Any] | None) -> tuple[Any, Any]:
    if toxic is None:
        conflict = functools.partial(_update_t, pg)
        line = _psql_line(pg, "UPDATE t SET v = v + 1 WHERE id = 1")
    else:
        conflict, line = (lambda: None), "\\! true"
    client = await through(pg, toxic, functools.partial(serializable_retry, conflict=conflict))
    script = PSQL_40001.format(conflict=line)
    return client, await through(pg, toxic, functools.partial(psql, script=script))


FAULT_40001 = {"query": "update t *", "sqlstate": "40001", "count": 1}


async def test_40001_is_what_two_conflicting_serializable_transactions_give(pg: int) -> None:
    real = await _arms_40001(pg, None)
    faulted = await _arms_40001(pg, FAULT_40001)
    print("real:", real, "faultnet:", faulted)
    assert real[0]["tries"][0] == ("SerializationFailure", "40001", "INERROR")
    assert real[0]["outcome"] == "committed" and len(real[0]["tries"]) == 2
    assert "sqlstate 40001" in real[1][1] and "sqlstate 25P02" in real[1][1]
    assert faulted == real
    # The breakage: another SQLSTATE (a deadlock) is not retried, and says so.
    assert await _arms_40001(pg, {**FAULT_40001, "sqlstate": "40P01"}) != real


# -- 57P01: pg_terminate_backend -------------------------------------------------------


def lock_and_kill(port: int) -> threading.Thread:
    """Take advisory lock 1 (before this returns), then, in a thread, wait (10 s at most)
    until the backend of application ``victim`` waits for it, end that backend with
    ``pg_terminate_backend`` (waiting until it is gone), and let go of the lock: the
    victim's query meets 57P01 while it runs. (An advisory lock, not a table's or a
    row's: the error of a wait for those carries where, a position or a CONTEXT.)"""
    conn = _connect(port)
    conn.execute("SELECT pg_advisory_xact_lock(1)")
    find = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'victim'"
        " AND wait_event_type = 'Lock'"
    )

    def kill() -> None:
        try:
            with _connect(port, autocommit=True) as killer:
                deadline = time.monotonic() + 10
                while not (row := killer.execute(find).fetchone()):
                    assert time.monotonic() < deadline, "the victim never waited for the lock"
                    time.sleep(0.01)  # polling the server's view of the victim, bounded
                killer.execute("SELECT pg_terminate_backend(%s, 5000)", (row[0],))
        finally:
            conn.rollback()
            conn.close()

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def terminated_retry(port: int, terminate: Callable[[], object]) -> dict[str, Any]:
    """psycopg in a tenacity loop retrying an OperationalError that closed the connection
    (3 tries, a new connection each): a query in a transaction, (*terminate*, on the
    first try,) a wait for advisory lock 1, commit. Each try: its error's class, SQLSTATE,
    message, and the transaction status and closed flag right after, or ``committed``."""
    tries: list[tuple[Any, ...]] = []
    conns: list[Any] = []

    def closed(exc: BaseException) -> bool:
        return isinstance(exc, psycopg.OperationalError) and conns[-1].closed

    @tenacity.retry(
        retry=tenacity.retry_if_exception(closed), stop=tenacity.stop_after_attempt(3), reraise=True
    )
    def work() -> None:
        conn = _connect(port, application_name="victim")
        conns.append(conn)
        conn.execute("SELECT 1").fetchone()
        if not tries:
            terminate()
        try:
            conn.execute("SELECT pg_advisory_xact_lock(1)").fetchone()
        except psycopg.Error as exc:
            status = conn.info.transaction_status.name
            tries.append((type(exc).__name__, exc.sqlstate, str(exc), status, conn.closed))
            raise
        conn.commit()
        tries.append(("committed", conn.info.transaction_status.name))

    return {"tries": tries, "outcome": _outcome(work, conns)}


PSQL_57P01 = "SELECT 1;\nSELECT pg_advisory_xact_lock(1);\n\\echo after\n"


async def _arms_57p01(pg: int, toxic: dict[str, Any] | None) -> tuple[Any, Any]:
    killers: list[threading.Thread] = []

    def terminate() -> None:
        if toxic is None:
            killers.append(lock_and_kill(pg))

    try:
        client = await through(pg, toxic, functools.partial(terminated_retry, terminate=terminate))
        terminate()
        script = functools.partial(psql, script=PSQL_57P01, appname="victim")
        return client, await through(pg, toxic, script)
    finally:
        for killer in killers:
            killer.join(15)


FAULT_57P01 = {"query": "select pg_advisory_xact_lock*", "sqlstate": "57P01", "count": 1}


async def test_57p01_is_what_pg_terminate_backend_gives(pg: int) -> None:
    real = await _arms_57p01(pg, None)
    faulted = await _arms_57p01(pg, FAULT_57P01)
    print("real:", real, "faultnet:", faulted)
    assert real[0]["tries"][0][:2] == ("AdminShutdown", "57P01")
    assert real[0]["outcome"] == "committed" and real[1][0] == 2
    assert faulted == real
    assert await _arms_57p01(pg, {**FAULT_57P01, "sqlstate": "57P02"}) != real


# -- 53300: max_connections reached ----------------------------------------------------


def connect_retry(port: int, release: Callable[[], None]) -> dict[str, Any]:
    """psycopg's connect in a tenacity loop retrying OperationalError (3 tries), *release*
    run before each retry. Each try: its error's class, SQLSTATE and message, or
    ``connected``."""
    tries: list[tuple[Any, ...]] = []

    @tenacity.retry(
        retry=tenacity.retry_if_exception_type(psycopg.OperationalError),
        stop=tenacity.stop_after_attempt(3),
        before_sleep=lambda state: release(),
        reraise=True,
    )
    def connect() -> None:
        try:
            conn = _connect(port)
        except psycopg.OperationalError as exc:
            tries.append((type(exc).__name__, exc.sqlstate, _no_port(str(exc))))
            raise
        conn.close()
        tries.append(("connected",))

    try:
        connect()
        outcome = "connected"
    except psycopg.Error as exc:
        outcome = type(exc).__name__
    return {"tries": tries, "outcome": outcome}


def raw_startup(port: int) -> dict[str, str | None]:
    """A StartupMessage on a raw socket: the fields of the ErrorResponse it gets
    (severity, SQLSTATE, message), read to the server's close."""
    params = b"user\0postgres\0database\0postgres\0\0"
    with socket.create_connection((HOST, port), timeout=5) as s:
        s.sendall(struct.pack("!II", 8 + len(params), 196608) + params)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data[:1] == b"E", data[:40]
    fields = parse_error_response(data)
    return {key: fields.get(key) for key in "SVCM"}


def _release(held: list[Any]) -> None:
    """Close *held* and wait (5 s at most) until each backend process has gone: its slot
    is free only then."""
    pids = [conn.info.backend_pid for conn in held]
    for conn in held:
        conn.close()
    held.clear()
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling a process's exit (no pidfd for another's child), bounded


async def _arms_53300(port: int, toxic: dict[str, Any] | None) -> tuple[Any, ...]:
    held: list[Any] = []
    if toxic is None:
        held = [_connect(port) for _ in range(2)]
    try:
        wire = await through(port, toxic, raw_startup) if toxic is not None or held else None
        seen_psql = await through(port, toxic, functools.partial(psql, script="SELECT 1;\n"))
        if toxic is not None:
            toxic = {**toxic, "count": 1}  # the client's own try: one fault, then through
        client = await through(
            port, toxic, functools.partial(connect_retry, release=lambda: _release(held))
        )
    finally:
        _release(held)
    return wire, seen_psql, client


FAULT_53300 = {"at": "startup", "sqlstate": "53300"}


async def test_53300_is_what_max_connections_gives(pg: int, full_pg: int) -> None:
    real = await _arms_53300(full_pg, None)
    faulted = await _arms_53300(pg, FAULT_53300)
    print("real:", real, "faultnet:", faulted)
    assert real[0] == {
        "S": "FATAL",
        "V": "FATAL",
        "C": "53300",
        "M": "sorry, too many clients already",
    }
    assert real[1][0] == 2 and real[2]["outcome"] == "connected"
    assert faulted == real
    assert await _arms_53300(pg, {**FAULT_53300, "sqlstate": "53400"}) != real
