"""The toxics' fidelity rows: each toxic keeps its promise through a real proxy, and
each row's judge calls its breakage (a promise the toxic was not asked) broken.

No root: the rows run on this process's loopback (harness/fidelity/_toxics.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from faultnet.toxics import TOXICS
from harness.fidelity import _toxics
from harness.fidelity._toxics import (
    TOXIC_CASES,
    ToxicCase,
    ToxicServers,
    ks_uniform,
    run_toxic,
    toxic_servers,
)
from tests.fidelity._toxic_rows import check_toxic_row, row_param


@pytest.fixture(scope="module")
def servers() -> Iterator[ToxicServers]:
    with toxic_servers() as running:
        yield running


# The pair rows (the HTTP toxics against nginx) are tests/fidelity/test_http_rows.py's.
@pytest.mark.parametrize("case", [row_param(c) for c in TOXIC_CASES if c.reference is None])
def test_each_toxic_keeps_its_promise_and_its_judge_tells_a_breakage(
    case: ToxicCase, servers: ToxicServers
) -> None:
    check_toxic_row(case, servers)


def test_the_echo_server_sends_each_echo_at_once(servers: ToxicServers) -> None:
    # Nagle on the server's side held an echo for the last one's ACK: whole periods
    # added to the rows' round trips, on either arm (harness/fidelity/_world.py).
    with socket.create_connection(("127.0.0.1", servers.echo.port), timeout=5) as s:
        s.sendall(b"m")
        assert s.recv(1) == b"m"  # its connection's thread is past its setup
        (conn,) = [c for c in servers.echo._conns if _peer(c) == s.getsockname()]
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def _peer(conn: socket.socket) -> object:
    try:
        return conn.getpeername()
    except OSError:  # an earlier row's, gone
        return None


def test_every_byte_toxic_and_toxicity_has_a_row() -> None:
    # The protocol toxics (both streams: http_*, tls_*, dns) change a protocol's
    # messages, not bytes and timing: their fidelity is the protocol sessions' (held
    # against real servers: the HTTP ones against nginx, test_http_rows.py).
    byte_toxics = {t for t, cls in TOXICS.items() if not cls.both_streams}
    assert byte_toxics <= {c.toxic for c in TOXIC_CASES}
    assert any(c.toxicity not in (0.0, 1.0) for c in TOXIC_CASES)
    for c in TOXIC_CASES:
        assert c.breakages, c.name
        TOXICS[c.toxic].check_attributes(dict(c.attributes))  # attributes it takes


@pytest.mark.parametrize(
    ("values", "low", "high", "distance"),
    [
        ([0.5], 0.0, 1.0, 0.5),
        # The midpoints of ten equal bins: the closest ten draws come to uniform.
        ([i / 10 + 0.05 for i in range(10)], 0.0, 1.0, 0.05),
        # All below the range, or all above: as far as can be.
        ([-1.0, -2.0], 0.0, 1.0, 1.0),
        ([5.0], 0.0, 1.0, 1.0),
        # Uniform on 0-1 against uniform asked on 0-2: half the mass is missing at 1.
        ([i / 1000 for i in range(1000)], 0.0, 2.0, 0.5),
        # No spread asked (jitter 0): a point mass at low.
        ([3.0, 3.0], 3.0, 3.0, 0.0),
        ([3.0, 4.0], 3.0, 3.0, 0.5),
    ],
)
def test_ks_uniform_is_the_largest_gap_between_the_two_distribution_functions(
    values: list[float], low: float, high: float, distance: float
) -> None:
    assert ks_uniform(values, low, high) == pytest.approx(distance, abs=0.002)


@pytest.mark.parametrize("toxic", ["timeout", "reset_peer"])
def test_a_client_held_up_after_its_connect_still_sees_the_whole_wait(
    toxic: str, servers: ToxicServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI's red (stop 44): reset_peer 300 ms "ended after 0.2999 s". The proxy starts the
    # toxic's clock when it accepts, which can come before a loaded client thread reads
    # its clock after connect() returns; so the wait is timed from before the connect.
    # Here the client is held 50 ms after each connect, as a descheduled thread is.
    connect = _toxics._connect

    def held_up(port: int, timeout: float = 5.0) -> socket.socket:
        s = connect(port, timeout)
        time.sleep(0.05)  # the scenario: the thread not run for 50 ms
        return s

    monkeypatch.setattr(_toxics, "_connect", held_up)
    (case,) = [
        c for c in TOXIC_CASES if c.toxic == toxic and c.workload is _toxics._message_then_end
    ]
    row = run_toxic(replace(case, attempts=1), servers)
    assert row.verdict.same, f"{case.name}: {row.verdict.text} ({row.seen})"
