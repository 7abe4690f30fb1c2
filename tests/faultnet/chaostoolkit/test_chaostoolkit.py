"""The Chaos Toolkit extension: its actions come from the mode table, and the real
`chaos run` drives a real `faultnet server` process through it, rollbacks included."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import faultnet.chaostoolkit
from faultnet.chaostoolkit import ActivityFailed, actions, probes
from faultnet.controls import assert_accepting
from faultnet.modes import MODES
from faultnet.server.client import ApiClient
from faultnet.testing import echo_server
from tests.conftest import require_program

EXPERIMENT = Path(faultnet.chaostoolkit.__file__).parent / "example-experiment.json"


def test_every_mode_of_the_table_is_an_action_taking_what_its_row_says() -> None:
    for m in MODES.values():
        action = getattr(actions, m.name)
        assert m.name in actions.__all__
        params = set(inspect.signature(action).parameters)
        assert ("stream" in params) == m.takes_stream, m.name
        assert ("include_new" in params) == m.takes_include_new, m.name
        assert ("connections" in params) == m.per_connection, m.name
        assert ("percent" in params) == m.takes_percent, m.name
        assert ("peer" in params) == m.takes_peer, m.name
        assert m.summary in action.__doc__


def test_remove_fault_refuses_what_cannot_be_undone() -> None:
    with pytest.raises(ActivityFailed, match="sever cannot be undone"):
        actions.remove_fault("db", "sever", api_url="http://127.0.0.1:1")
    with pytest.raises(ActivityFailed, match="not a fault mode: 'thaw'"):
        actions.remove_fault("db", "thaw", api_url="http://127.0.0.1:1")


def test_run_control_offers_the_controls_that_make_their_own_connect() -> None:
    assert probes.ADDRESS_CONTROLS == (
        "assert_accepting",
        "assert_refusing",
        "assert_syn_dropped",
        "assert_syn_lossy",
    )
    with pytest.raises(ActivityFailed, match="no probe-able control for 'freeze'"):
        probes.run_control("freeze", address="127.0.0.1:1")


async def test_run_control_goes_red_with_the_controls_own_verdict() -> None:
    async with echo_server() as (host, port):
        run = functools.partial(probes.run_control, address=f"{host}:{port}")
        assert await trio.to_thread.run_sync(run, "assert_accepting")
        with pytest.raises(
            ActivityFailed, match="assert_refusing: expected refused, saw connected"
        ):
            await trio.to_thread.run_sync(run, "refuse")


async def _api(url: str, method: str, path: str, body: Any = None) -> Any:
    return await trio.to_thread.run_sync(
        functools.partial(ApiClient(url).request, method, path, body)
    )


def _addr(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


async def _chaos_run(tmp_path: Path, url: str, upstream: str, *extra: str) -> dict[str, Any]:
    journal = tmp_path / "journal.json"
    r = await trio.run_process(
        [sys.executable, "-m", "chaostoolkit", "--no-version-check"]
        + ["--log-file", str(tmp_path / "chaostoolkit.log"), "run"]
        + ["--journal-path", str(journal), *extra]
        + [str(EXPERIMENT)],
        cwd=tmp_path,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ, "FAULTNET_API": url, "FAULTNET_UPSTREAM": upstream},
    )
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return json.loads(journal.read_text())


async def test_chaos_run_drives_a_faultnet_server_and_its_rollbacks_undo_every_fault(
    server_process: str, tmp_path: Path
) -> None:
    require_program(
        "chaostoolkit" if importlib.util.find_spec("chaostoolkit") else None,
        "chaostoolkit (the `chaostoolkit` extra)",
    )
    url = server_process
    async with echo_server() as (host, port):
        await _api(url, "POST", "/proxies", {"name": "db", "upstream": f"{host}:{port}"})
        journal = await _chaos_run(tmp_path, url, f"{host}:{port}")
        assert journal["status"] == "completed" and not journal["deviated"]
        method = {r["activity"]["name"]: r for r in journal["run"]}
        assert all(r["status"] == "succeeded" for r in method.values()), method
        under = method["state-under-fault"]["output"]
        assert under["refusing"] and under["frozen_new"] == ["downstream", "upstream"]
        assert [(r["activity"]["name"], r["status"]) for r in journal["rollbacks"]] == [
            ("remove-the-latency", "succeeded"),
            ("thaw", "succeeded"),
            ("restore", "succeeded"),
        ]
        # The server's own log saw each fault and each undo, in that order.
        modes = [e["mode"] for e in (await _api(url, "GET", "/events"))["events"] if "mode" in e]
        assert modes == ["refuse", "freeze", "thaw", "restore"]
        # Back as it was: no mode, no toxic, accepting (the control has its red test).
        state = await _api(url, "GET", "/proxies/db/faults")
        assert not state["refusing"] and state["frozen_new"] == [], state
        assert await _api(url, "GET", "/proxies/db/toxics") == []
        await assert_accepting(_addr((await _api(url, "GET", "/proxies/db"))["listen"]))

        # Without the rollbacks the faults outlive the run: they were what put it back.
        await _chaos_run(tmp_path, url, f"{host}:{port}", "--rollback-strategy", "never")
        state = await _api(url, "GET", "/proxies/db/faults")
        assert state["refusing"] and state["frozen_new"] == ["downstream", "upstream"]
        assert [t["name"] for t in await _api(url, "GET", "/proxies/db/toxics")] == ["ctk_latency"]
        await _api(url, "POST", "/reset")
