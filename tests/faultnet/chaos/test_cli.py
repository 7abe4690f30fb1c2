"""``faultnet chaos`` as a user runs it: real `faultnet chaos` and `faultnet server`
processes on loopback, the join log read back, the targets checked with the controls."""

from __future__ import annotations

import functools
import json
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from faultnet.chaos import catalogue
from faultnet.controls import assert_accepting
from faultnet.eventlog import read_jsonl
from faultnet.server.client import ApiClient
from faultnet.testing import echo_server, read_exactly, wait_for_record
from tests.faultnet.chaos.conftest import chaos_cli
from tests.faultnet.chaos.test_run import steps

PLAN = """
duration = 60
gap = [1, 4]
[faults."process:kill"]
weight = 0
[faults."process:stop"]
weight = 0
"""


async def _api(url: str, method: str, path: str, body: Any = None) -> Any:
    return await trio.to_thread.run_sync(
        functools.partial(ApiClient(url).request, method, path, body)
    )


async def _chaos(*args: str, check: bool = False) -> trio.CompletedProcess:
    return await trio.run_process(
        [sys.executable, "-m", "faultnet", "chaos", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=check,
    )


def _addr(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


async def _as_found(url: str, name: str) -> None:
    """A server proxy as chaos found it: no mode in force, no toxic, no frozen
    connection, the listener accepting (the control has its own test of going red)."""
    state = await _api(url, "GET", f"/proxies/{name}/faults")
    assert not state["refusing"] and not state["syn_dropped"], state
    assert state["frozen_new"] == [] and not state["blackhole_new"], state
    assert set(state["connections"]) <= {"open", "half-closed"}, state
    assert await _api(url, "GET", f"/proxies/{name}/toxics") == []
    proxy = await _api(url, "GET", f"/proxies/{name}")
    await assert_accepting(_addr(proxy["listen"]))


def test_help_and_usage_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    r = chaos_cli("--help")
    assert r.returncode == 0 and "--dry-run" in r.stdout and "--armed" in r.stdout
    r = chaos_cli("--dry-run", "--log", str(tmp_path / "log.jsonl"))
    assert r.returncode == 2 and r.stderr.startswith("faultnet: error: no targets")
    bad = tmp_path / "plan.toml"
    bad.write_text("[faults.melt]\nweight = 1\n")
    r = chaos_cli("plan", "--plan", str(bad), "--target", "db")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "unknown fault 'melt'" in r.stderr
    r = chaos_cli("--time-unit", "0", "--target", "db")
    assert r.returncode == 2 and "--time-unit must be > 0" in r.stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    r = chaos_cli("--dry-run", "--target", "db", "--log", str(not_a_dir / "log.jsonl"))
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr.startswith(f"faultnet: error: cannot open the join log {not_a_dir}/log.jsonl")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_no_seed_means_one_is_chosen_and_logged(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    r = chaos_cli("--dry-run", "--target", "db", "--log", str(log), "--json")
    assert r.returncode == 0, r.stderr
    first = read_jsonl(log).records[0]
    assert first["event"] == "seed" and first["detail"]["chosen"] is True
    assert first["detail"]["seed"] == first["seed"]
    # ...and replaying that seed prints the same plan.
    again = chaos_cli("plan", "--target", "db", "--seed", str(first["seed"]), "--json")
    replayed = [s["counter"] for s in json.loads(again.stdout)["slots"]]
    logged = [r["counter"] for r in read_jsonl(log).records if r["event"] in ("fault", "skip")]
    assert replayed == logged


async def test_dry_run_prints_the_same_plan_twice_and_the_steps_a_real_run_attempts(
    server_process: str, tmp_path: Path
) -> None:
    url = server_process
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    async with echo_server() as upstream:
        for name in ("db", "cache"):
            body = {"name": name, "upstream": f"{upstream[0]}:{upstream[1]}"}
            await _api(url, "POST", "/proxies", body)
        db = await _api(url, "GET", "/proxies/db")
        link = await trio.open_tcp_stream(*_addr(db["listen"]))
        common = ["--plan", str(plan), "--api", url, "--target", "db", "--target", "cache"]
        common += ["--seed", "7", "--time-unit", "0.02"]
        outs = []
        for i in (1, 2):
            r = await _chaos("--dry-run", *common, "--log", str(tmp_path / f"dry{i}.jsonl"))
            assert r.returncode == 0, r.stderr
            outs.append(r.stdout.decode())
        assert outs[0] == outs[1] and outs[0].count(" fault ") > 5
        (tmp_path / ".faultnet-chaos-armed").touch()
        real = tmp_path / "real.jsonl"
        r = await _chaos("--armed", *common, "--log", str(real))
        assert r.returncode == 0, r.stderr.decode()
        dry = read_jsonl(tmp_path / "dry1.jsonl").records
        done = read_jsonl(real).records
        assert steps(dry) == steps(done)
        # Every fault applied has its undo (instant ones have none), and the server's own
        # event log saw each fault mode chaos logged.
        faults = [r for r in done if r["event"] == "fault"]
        undos = {r["counter"] for r in done if r["event"] == "undo"}
        assert {r["counter"] for r in faults if r["action"] not in ("sever", "reset")} == undos
        seen = (await _api(url, "GET", "/events?limit=10000"))["events"]
        applied = [
            {"severed": "sever"}.get(e["mode"], e["mode"])
            for e in seen
            if e["event"] == "fault_applied"
        ]
        assert sorted(applied) == sorted(
            r["action"] for r in faults if not r["action"].startswith("toxic:")
        )
        await link.aclose()
        for name in ("db", "cache"):
            await _as_found(url, name)


async def test_an_unarmed_run_and_an_unnamed_server_are_refused_in_the_log(
    server_process: str, tmp_path: Path
) -> None:
    url = server_process
    log = tmp_path / "log.jsonl"
    r = await _chaos(
        "--target",
        f"db@{url}",
        "--api",
        "http://127.0.0.1:1",
        "--seed",
        "3",
        "--log",
        str(log),
        "--armed",
    )
    assert r.returncode == 2
    assert r.stderr.decode().startswith("faultnet: error: refused: the run is not armed (marker")
    rails = [(x["event"], x.get("rail")) for x in read_jsonl(log).records if x.get("rail")]
    assert rails[:2] == [("refuse", "unnamed"), ("refuse", "unarmed")]
    assert {rail for _, rail in rails[2:]} == {"unarmed"} and len(rails) > 3
    assert [e for e in (await _api(url, "GET", "/events"))["events"] if "mode" in e] == []


async def test_sigterm_ends_a_run_with_every_fault_undone(
    server_process: str, tmp_path: Path
) -> None:
    url = server_process
    async with echo_server() as upstream:
        await _api(url, "POST", "/proxies", {"name": "db", "upstream": f"127.0.0.1:{upstream[1]}"})
        db = await _api(url, "GET", "/proxies/db")
        link = await trio.open_tcp_stream(*_addr(db["listen"]))
        plan = tmp_path / "plan.toml"
        # Only freeze, held far longer than the test: only the signal can end it.
        weights = "\n".join(f'[faults."{n}"]\nweight = 0' for n in catalogue() if n != "freeze")
        plan.write_text(
            f"duration = 2\ngap = [1, 1]\n[faults.freeze]\nduration = [1000, 1000]\n{weights}\n"
        )
        (tmp_path / ".faultnet-chaos-armed").touch()
        log = tmp_path / "log.jsonl"
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-m", "faultnet", "chaos", "--plan", str(plan)]
                    + ["--target", f"db@{url}", "--armed", "--log", str(log)]
                    + ["--seed", "1", "--time-unit", "0.05"],
                    check=False,
                )
            )
            await wait_for_record(log, timeout=20, event="fault", action="freeze")
            state = await _api(url, "GET", "/proxies/db/faults")
            assert state["connections"] == {"frozen": 1}
            proc.send_signal(signal.SIGTERM)  # the exact process started above
        assert proc.returncode == 128 + signal.SIGTERM
        records = read_jsonl(log).records
        tail = [(r["event"], r["action"], r.get("reason")) for r in records[-3:]]
        assert tail[0][:2] == ("signal", "SIGTERM")
        assert tail[1] == ("undo", "thaw", "exit") and tail[2][0] == "end"
        await link.send_all(b"thawed\n")
        assert await read_exactly(link, 7) == b"thawed\n"
        await link.aclose()
        await _as_found(url, "db")
