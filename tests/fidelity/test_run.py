"""The run's order: a generator scenario's sides take turns, a plain one's run in turn.

Real sides: the echo server, a faultnet proxy in front of it, and the kernel side's
nftables fault (never made here, so no root is needed)."""

from __future__ import annotations

import socket
from collections.abc import Generator

import pytest

from harness.fidelity._cases import Case, Servers, Side
from harness.fidelity._observe import Observation
from harness.fidelity._run import run


def _case(scenario: object) -> Case:
    return Case(
        "sever",
        "test client",
        "turns",
        "none",
        "echo",
        scenario,  # type: ignore[arg-type]
        lambda kf, servers: (lambda: None, lambda: None),
        ("sever", {}, "thaw"),
    )


def _answers(port: int) -> bool:
    """A round trip through *port* (the echo server, or the proxy in front of it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"ping\n")
        return s.recv(16) == b"ping\n"


def test_a_generator_scenario_s_sides_take_turns_kernel_faultnet_faultnet_kernel() -> None:
    turns: list[str] = []
    ports: dict[str, int] = {}

    def scenario(side: Side, servers: Servers) -> Generator[None, None, Observation]:
        ports[side.name] = side.port
        for _ in range(3):
            assert _answers(side.port)  # each side's connections work in its turn
            turns.append(side.name)
            yield
        return Observation(f"done by {side.name}", 0.0)

    (row,) = run([_case(scenario)])
    assert turns == ["kernel", "faultnet", "faultnet", "kernel", "kernel", "faultnet"]
    assert ports["kernel"] != ports["faultnet"]
    assert row.reference is not None and row.reference.outcome == "done by kernel"
    assert row.faultnet is not None and row.faultnet.outcome == "done by faultnet"


def test_a_plain_scenario_runs_on_one_side_then_the_other() -> None:
    turns: list[str] = []

    def scenario(side: Side, servers: Servers) -> Observation:
        turns.append(side.name)
        return Observation("done", 0.0)

    run([_case(scenario)])
    assert turns == ["kernel", "faultnet"]


def test_a_side_that_fails_ends_the_other_side_s_turns_too() -> None:
    ended: list[str] = []

    def scenario(side: Side, servers: Servers) -> Generator[None, None, Observation]:
        try:
            yield
            if side.name == "faultnet":
                raise RuntimeError("faultnet's second turn fails")
            yield
            return Observation("done", 0.0)
        finally:
            ended.append(side.name)

    with pytest.raises(RuntimeError, match="second turn"):
        try:
            run([_case(scenario)])
        finally:  # read while the traceback still holds the run's frames
            ended_by_then = sorted(ended)
    assert ended_by_then == ["faultnet", "kernel"]
