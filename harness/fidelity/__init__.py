"""Fidelity: every fault mode held against the kernel's own version of it.

faultnet's controls prove a mode is in force against faultnet's own probe; this proves
it against the real thing. In a network namespace of its own (root), each row of
:data:`CASES` runs one real client (a raw socket with keepalive or TCP_USER_TIMEOUT,
redis-py against redis-server, psycopg against PostgreSQL, curl) twice: once against
the kernel's version of the fault (nftables dropping both ways, dropping SYNs, a random
share, rejecting with a reset; ``ss -K``; no listener; SIGSTOP) and once through
faultnet's mode, and records what the client saw (:class:`Observation`). A pair is
judged the same when the outcome is the same and faultnet's time to notice is within
1.25x + 0.3 s of the kernel's (:func:`judge`); for a dead route (blackhole, partition)
the client must also take in no more segments after the fault than the kernel let it.

Rows with ``contrast`` are two failures known to differ (faultnet's ``reset`` against a
firewall's reject): shown with the reason, not judged.

Run it with ``python -m harness.fidelity`` or ``faultnet fidelity``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.fidelity._cases import CASES, Case, Servers, Side
from harness.fidelity._observe import Observation, Verdict, judge, median_of
from harness.fidelity._world import (
    EchoServer,
    KernelFault,
    ProxyThread,
    enter_private_netns,
    free_port,
    http_server,
    postgres_server,
    redis_server,
)

__all__ = [
    "CASES",
    "Case",
    "Observation",
    "Row",
    "Verdict",
    "enter_private_netns",
    "judge",
    "run",
]


@dataclass(frozen=True)
class Row:
    case: Case
    reference: Observation | None
    faultnet: Observation | None
    verdict: Verdict
    #: Judged (counts for the exit code); False for a contrast row or a skipped one.
    judged: bool

    def to_json(self) -> dict[str, Any]:
        c = self.case
        return {
            "mode": c.mode,
            "client": c.client,
            "situation": c.situation,
            "reference": c.reference,
            "kernel": self.reference.to_json() if self.reference else None,
            "faultnet": self.faultnet.to_json() if self.faultnet else None,
            "same": self.verdict.same,
            "verdict": self.verdict.text,
            "judged": self.judged,
        }


@contextlib.contextmanager
def _servers(cases: Iterable[Case]) -> Iterator[Servers]:
    wanted = {c.server for c in cases}
    with contextlib.ExitStack() as stack:
        echo = EchoServer()
        stack.callback(echo.close)
        servers = Servers(echo)
        if "redis" in wanted:
            servers.redis_port, servers.redis_pid = stack.enter_context(redis_server())
        if "http" in wanted:
            servers.http_port = stack.enter_context(http_server())
        if "pg" in wanted:
            servers.pg_port = stack.enter_context(postgres_server())
        yield servers


def _server_port(case: Case, servers: Servers) -> int | None:
    return {
        "echo": servers.echo.port,
        "redis": servers.redis_port,
        "http": servers.http_port,
        "pg": servers.pg_port,
    }[case.server]


def _kernel_side(case: Case, port: int, servers: Servers) -> Side:
    if case.no_listener:
        return Side("kernel", free_port(), lambda: None, lambda: None)
    kf = KernelFault(port)
    fault, undo = case.kernel(kf, servers)
    return Side("kernel", port, fault, undo, close=undo)


def _faultnet_side(case: Case, port: int) -> Side:
    proxy = ProxyThread(port)
    method, kwargs, undoing = case.faultnet
    undone = [False]

    def undo() -> None:
        if not undone[0]:
            undone[0] = True
            proxy.call(undoing)

    def fault() -> None:
        undone[0] = False
        proxy.call(method, **kwargs)

    def close() -> None:
        with contextlib.suppress(Exception):
            undo()
        proxy.close()

    return Side("faultnet", proxy.port, fault, undo, close=close)


def _observe(case: Case, make: Callable[[], Side], servers: Servers) -> Observation:
    runs = []
    for _ in range(case.runs):
        side = make()
        try:
            runs.append(case.scenario(side, servers))
        finally:
            side.close()
    return runs[0] if case.runs == 1 else median_of(runs)


def run(cases: Iterable[Case] = CASES, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run *cases* (already inside a private network namespace: see
    :func:`enter_private_netns`) and return one :class:`Row` each; *on_row* is called
    as each row is done."""
    cases = list(cases)
    rows = []
    with _servers(cases) as servers:
        for case in cases:
            port = _server_port(case, servers)
            if port is None:
                row = Row(case, None, None, Verdict(False, f"skipped: no {case.server}"), False)
            else:
                ref = _observe(case, lambda c=case, p=port: _kernel_side(c, p, servers), servers)
                fn = _observe(case, lambda c=case, p=port: _faultnet_side(c, p), servers)
                verdict = judge(ref, fn, segments=case.segments)
                if case.contrast is not None:
                    verdict = Verdict(verdict.same, case.contrast)
                row = Row(case, ref, fn, verdict, case.contrast is None)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
