"""The fidelity run: each case against the kernel's fault and faultnet's, judged."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from harness.fidelity._cases import CASES, Case, Servers, Side
from harness.fidelity._observe import Observation, Verdict, confirmed, judge
from harness.fidelity._world import (
    EchoServer,
    KernelFault,
    ProxyThread,
    free_port,
    http_server,
    postgres_server,
    redis_server,
    udp_echo_server,
)

__all__ = ["Row", "run"]


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
            "inconclusive": self.verdict.inconclusive,
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
        if "udp" in wanted:
            servers.udp_port, servers.udp_pid = stack.enter_context(udp_echo_server())
        yield servers


def _server_port(case: Case, servers: Servers) -> int | None:
    return {
        "echo": servers.echo.port,
        "redis": servers.redis_port,
        "http": servers.http_port,
        "pg": servers.pg_port,
        "udp": servers.udp_port,
    }[case.server]


def _kernel_side(case: Case, port: int, servers: Servers) -> Side:
    if case.no_listener:
        return Side("kernel", free_port(), lambda: None, lambda: None)
    kf = KernelFault(port, case.protocol)
    fault, undo = case.kernel(kf, servers)
    return Side("kernel", port, fault, undo, close=undo)


def _faultnet_side(case: Case, port: int) -> Side:
    proxy = ProxyThread(port, case.protocol)
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


def _row(case: Case, port: int, servers: Servers) -> Row:
    """*case* observed on both sides and judged; a contrast's verdict is its text."""
    seen = [_observe(case, port, servers)]
    verdict = judge(*seen[0], segments=case.segments)
    if case.contrast is not None:
        return Row(case, *seen[0], Verdict(verdict.same, case.contrast), False)

    def again() -> Verdict:
        seen.append(_observe(case, port, servers))
        return judge(*seen[-1], segments=case.segments)

    verdict = confirmed(verdict, again)
    return Row(case, *seen[-1], verdict, True)


def _observe(case: Case, port: int, servers: Servers) -> tuple[Observation, Observation]:
    """The kernel's observation of *case* and faultnet's. A plain scenario runs on one
    side and then the other, each side made just before and closed just after; a
    generator scenario runs on both sides made at once, taking turns (kernel, faultnet,
    faultnet, kernel, ...) so that neither side's tries all fall in a busier minute."""
    makers = (partial(_kernel_side, case, port, servers), partial(_faultnet_side, case, port))
    if not inspect.isgeneratorfunction(case.scenario):
        return _observe_alone(case, makers[0], servers), _observe_alone(case, makers[1], servers)
    with contextlib.ExitStack() as stack:
        turns: list[Generator[None, None, Observation]] = []
        for make in makers:
            side = make()
            stack.callback(side.close)
            turns.append(case.scenario(side, servers))
            stack.callback(turns[-1].close)  # a failed run ends the other side's too
        seen: list[Observation | None] = [None, None]
        order = [0, 1]
        while seen[0] is None or seen[1] is None:
            for i in order:
                if seen[i] is None:
                    try:
                        next(turns[i])
                    except StopIteration as done:
                        seen[i] = done.value
            order.reverse()
        return seen[0], seen[1]


def _observe_alone(case: Case, make: Callable[[], Side], servers: Servers) -> Observation:
    side = make()
    try:
        return case.scenario(side, servers)  # type: ignore[return-value]
    finally:
        side.close()


def run(cases: Iterable[Case] = CASES, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Run *cases* (already inside a private network namespace: see
    :func:`enter_private_netns`) and return one :class:`Row` each; *on_row* is called
    as each row is done. A judged row that differs by a share of its tries is measured
    twice (:func:`~harness.fidelity._observe.confirmed`); its row shows the second."""
    cases = list(cases)
    rows = []
    with _servers(cases) as servers:
        for case in cases:
            port = _server_port(case, servers)
            if port is None:
                row = Row(case, None, None, Verdict(False, f"skipped: no {case.server}"), False)
            else:
                row = _row(case, port, servers)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
