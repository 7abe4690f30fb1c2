"""The fault-mode table is the one source: every list that names a mode agrees with it.

Each test here goes red when one place drifts from :data:`faultnet.modes.MODES`: the
Proxy's methods, the server's dispatch and validation, the CLI's choices, the OpenAPI
enum, the controls list (and its two re-exports), the control test's arms and the README.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import trio

import faultnet
import faultnet.controls
from faultnet.controltest import BREAKAGES, NEGATIVE, REAL_ARGS, variant_key
from faultnet.modes import (
    MODES,
    TCP_ARGUMENTS,
    Mode,
    ModeArgumentError,
    ModeArguments,
    markdown_table,
    mode,
)
from faultnet.proxy import Proxy
from faultnet.server import ApiError
from faultnet.server.cli import _mode_name
from faultnet.server.openapi import openapi_document
from faultnet.testing import echo_server
from faultnet.udp.modes import UDP_MODES
from harness.fidelity.readme import modes_table

README = Path(__file__).resolve().parents[2] / "README.md"
CONTROLS = {m.control for m in MODES.values() if m.control} | {
    control for m in MODES.values() for _, control in m.variant_controls
}


def test_mode_accepts_the_cli_spelling_and_names_the_valid_ones() -> None:
    assert mode("drop-syn") is mode("drop_syn") is MODES["drop_syn"]
    for bad in ("melt", None, 3, "DROP_SYN"):
        with pytest.raises(ModeArgumentError, match="invalid fault mode.*freeze"):
            mode(bad)


def test_the_table_is_consistent_with_itself() -> None:
    for m in MODES.values():
        if m.undone_by is not None:
            assert m.name in MODES[m.undone_by].undoes, m
        for undone in m.undoes:
            assert m.acts_on == "undo" and MODES[undone].undone_by == m.name, m
        if m.takes_include_new or m.per_connection:
            assert m.acts_on != "listener", m
        assert (m.default_percent is not None) == m.takes_percent, m


def test_proxy_has_one_method_per_mode_taking_what_the_row_says() -> None:
    for m in MODES.values():
        params = inspect.signature(getattr(Proxy, m.name)).parameters
        assert ("stream" in params) == m.takes_stream, m.name
        assert ("include_new" in params) == m.takes_include_new, m.name
        assert ("only" in params) == m.per_connection, m.name
        assert ("percent" in params) == m.takes_percent, m.name
        assert ("peer" in params) == m.takes_peer, m.name


def test_apply_s_typed_keywords_are_the_table_s_arguments() -> None:
    assert set(ModeArguments.__annotations__) == {a.name for a in TCP_ARGUMENTS}


def test_the_controls_list_is_the_table_s_controls() -> None:
    assert set(faultnet.controls.__all__) == {"ControlFailed", "assert_accepting", *CONTROLS}
    for name in faultnet.controls.__all__:
        assert getattr(faultnet, name) is getattr(faultnet.controls, name)
    assert set(faultnet.controls.__all__) <= set(faultnet.__all__)
    # The plugin finds them by the same list (test_pytest_plugin checks each).


def test_the_control_test_has_a_real_arm_and_breakages_for_every_control() -> None:
    variants = {variant_key(m.name, flag) for m in MODES.values() for flag, _ in m.variant_controls}
    assert set(BREAKAGES) == {NEGATIVE, *(m.name for m in MODES.values() if m.control), *variants}
    # A variant's flag is an argument its mode takes, and its real arm sets it.
    for m in MODES.values():
        for flag, _ in m.variant_controls:
            assert flag in m.params and REAL_ARGS[variant_key(m.name, flag)][flag] is True
    for rows in BREAKAGES.values():
        assert rows
        for _, apply, undo, *kwargs in rows:
            assert len(kwargs) <= 1 and all(isinstance(k, dict) for k in kwargs)
            for method in (apply, undo):
                assert method == "" or callable(getattr(Proxy, method)), method


def test_cli_choices_are_the_table() -> None:
    from faultnet.cli import build_parser

    parser = build_parser()
    for spelling in ("drop-syn", "drop_syn"):
        assert parser.parse_args(["fault", "p", spelling]).mode == "drop_syn"
    for name in MODES:
        assert parser.parse_args(["fault", "p", name]).mode == name
    assert _mode_name("freeze") == "freeze"


def test_openapi_enum_and_prose_are_the_table() -> None:
    fault = openapi_document("x")["components"]["schemas"]["Fault"]["properties"]
    assert fault["mode"]["enum"] == [*MODES, *(m for m in UDP_MODES if m not in MODES)]
    for m in MODES.values():
        assert f"{m.name}: {m.summary}" in fault["mode"]["description"]


def test_readme_mode_table_is_the_table() -> None:
    # The table with the recorded fidelity run's column (harness.fidelity.readme).
    assert modes_table().startswith(markdown_table().split("\n")[0][:-1])
    assert modes_table() in README.read_text(), (
        "README's mode table is stale: paste `python -m harness.fidelity --readme-table`"
    )


async def test_server_dispatches_every_mode_and_validates_by_the_table() -> None:
    from faultnet.server import open_registry

    async with echo_server() as up, open_registry() as reg:
        await reg.create({"name": "p", "upstream": f"{up[0]}:{up[1]}"})
        for m in MODES.values():
            body: dict[str, object] = {"mode": m.name}
            result = await reg.apply_fault("p", body)  # a percent mode uses its default
            if m.takes_percent:
                with pytest.raises(ApiError, match="percent must be between 0 and 100"):
                    await reg.apply_fault("p", {**body, "percent": 101})
            assert result["mode"] == m.name
            assert ("connections" in result) == m.counts_connections
            if not m.takes_stream:
                with pytest.raises(ApiError, match="stream applies to freeze, thaw and loss only"):
                    await reg.apply_fault("p", {"mode": m.name, "stream": "upstream"})
            if not m.takes_percent:
                with pytest.raises(ApiError, match="percent applies to loss and syn_loss only"):
                    await reg.apply_fault("p", {"mode": m.name, "percent": 5})
            if not m.takes_peer:
                with pytest.raises(ApiError, match="peer applies to"):
                    await reg.apply_fault("p", {"mode": m.name, "peer": "127.0.0.2"})
            else:
                with pytest.raises(ApiError, match="the host must be an IP address"):
                    await reg.apply_fault("p", {**body, "mode": m.name, "peer": "localhost:80"})
            if not m.per_connection:
                with pytest.raises(ApiError, match="connections applies to"):
                    await reg.apply_fault("p", {"mode": m.name, "connections": [1]})
        with pytest.raises(ApiError, match="invalid fault mode"):
            await reg.apply_fault("p", {"mode": "melt"})


async def test_proxy_apply_calls_the_mode_and_refuses_what_it_does_not_take() -> None:
    async with echo_server() as up, faultnet.open_proxy(up) as proxy:
        s = await trio.open_tcp_stream(*proxy.address)
        assert await proxy.apply("freeze", stream="upstream") == 1
        assert proxy.connections()[0].state == "frozen-upstream"
        assert await proxy.apply("thaw") == 1
        assert await proxy.apply("drop-syn") is None and proxy.state["syn_dropped"]
        with pytest.raises(ValueError, match="include_new applies to freeze, blackhole and loss"):
            await proxy.apply("refuse", include_new=True)
        await proxy.apply("restore")
        await s.aclose()


def test_readme_and_fault_help_lead_with_the_fault_that_kills_the_route() -> None:
    # Per-request clients open a NEW connection: a plain freeze changes nothing for them.
    import subprocess
    import sys

    readme = README.read_text()
    kill = readme.index("To kill the route for every client")
    assert kill < readme.index(modes_table())
    said = readme[kill : readme.index(modes_table())]
    assert "proxy.partition()" in said and "drop_syn()" in said
    assert "laptop-changed-networks" in said
    out = subprocess.run(
        [sys.executable, "-m", "faultnet", "fault", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    description = out.split("\n\n")[1]
    assert description.startswith("To kill the route for old and new connections alike")
    assert description.startswith(
        "To kill the route for old and new connections alike: `partition`"
    )
    assert "--include-new" in description and "drop-syn" in description


def test_tcp_and_udp_modes_are_rows_of_one_shape() -> None:
    from faultnet.udp.modes import UDP_MODES

    assert {(type(m), m.protocol) for m in MODES.values()} == {(Mode, "tcp")}
    assert {(type(m), m.protocol, m.takes_stream) for m in UDP_MODES.values()} == {
        (Mode, "udp", True)
    }
    for table in (MODES, UDP_MODES):
        for m in table.values():
            assert set(m.required) <= set(m.params), m.name
            if m.acts_on == "undo":
                assert set(m.undoes) == {n for n, r in table.items() if r.undone_by == m.name}


def test_every_argument_is_declared_for_its_table_and_names_ones_that_exist() -> None:
    from faultnet.modes import TABLES

    for table in TABLES.values():
        for m in table.modes.values():
            assert m.protocol == table.protocol, m.name
            for arg in m.arguments:
                assert arg.protocol == table.protocol, (m.name, arg.name)
                for other in (*arg.excludes, *(arg.needs or ())[:1]):
                    assert other in table.declared, (m.name, arg.name, other)
                if arg.default is not None and arg.kind in ("number", "whole", "choice"):
                    arg.check(arg.default)  # a default the argument itself would refuse
