"""``faultnet chaos`` as a user runs it: real `faultnet chaos` and `faultnet server`
processes on loopback, the join log read back, the targets checked with the controls."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from faultnet.chaos import catalogue
from faultnet.chaos.cli import SAMPLE_PLAN
from faultnet.controls import assert_accepting
from faultnet.eventlog import read_jsonl
from faultnet.server.client import ApiClient
from faultnet.testing import echo_server, read_exactly, wait_for_record
from tests.faultnet.chaos.conftest import chaos_cli
from tests.faultnet.chaos.test_run import steps

#: A proxy on a server nobody listens on: planning and dry runs never contact it.
DB = "db@http://127.0.0.1:1"

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
    r = chaos_cli("plan", "--plan", str(bad), "--target", DB)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "unknown fault 'melt'" in r.stderr
    r = chaos_cli("--time-unit", "0", "--target", DB)
    assert r.returncode == 2 and "--time-unit must be > 0" in r.stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    r = chaos_cli("--dry-run", "--target", DB, "--log", str(not_a_dir / "log.jsonl"))
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr.startswith(f"faultnet: error: cannot open the join log {not_a_dir}/log.jsonl")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_no_seed_means_one_is_chosen_and_logged(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    r = chaos_cli("--dry-run", "--target", DB, "--log", str(log), "--json")
    assert r.returncode == 0, r.stderr
    first = read_jsonl(log).records[0]
    assert first["event"] == "seed" and first["detail"]["chosen"] is True
    assert first["detail"]["seed"] == first["seed"]
    # ...and replaying that seed prints the same plan.
    again = chaos_cli("plan", "--target", DB, "--seed", str(first["seed"]), "--json")
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
        # An episode applies its down mode, and its ending on what that took.
        endings = [
            r["action"]
            for r in done
            if r["event"] == "undo" and "end" in r["detail"] and r["result"]["connections"]
        ]
        assert sorted(applied) == sorted(
            [r["detail"].get("down", r["action"]) for r in faults if "toxic:" not in r["action"]]
            + endings
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


# -- refused before anything runs (issue 24, items 2 and 4) -------------------------------


def _one_line_exit_2(r: subprocess.CompletedProcess[str], words: str) -> None:
    assert (r.returncode, r.stdout) == (2, ""), r
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert words in r.stderr, r.stderr


def test_a_run_that_could_do_nothing_is_refused_before_it_starts(sleepers, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    url = "http://127.0.0.1:1"
    base = ["--dry-run", "--seed", "1", "--log", str(log)]
    # A proxy "in this process": a CLI run has none.
    _one_line_exit_2(chaos_cli(*base, "--target", "db"), "proxy db has no server")
    _one_line_exit_2(chaos_cli("plan", "--target", "db"), "proxy db has no server")
    # Processes: no allowlist, a missing one, a malformed one, one that does not list it.
    proc = ["--target", f"db@{url}", "--process", "bot"]
    _one_line_exit_2(chaos_cli(*base, *proc), "process bot needs --pids FILE")
    missing = str(tmp_path / "nope")
    _one_line_exit_2(chaos_cli(*base, *proc, "--pids", missing), "No such file")
    pids = tmp_path / "pids"
    pids.write_text("1234 bot\n")  # spaces, not a TAB
    _one_line_exit_2(chaos_cli(*base, *proc, "--pids", str(pids)), "line 1: malformed")
    pids.write_text(f"{sleepers().pid}\tother\n")
    _one_line_exit_2(chaos_cli(*base, *proc, "--pids", str(pids)), "process bot is not in")
    _one_line_exit_2(chaos_cli(*base, "--target", DB, "--pid-cwd", missing), "not a directory")
    assert not log.exists()  # nothing ran, not even the log


async def test_a_mistyped_target_is_refused_naming_the_servers_proxies(
    server_process: str, tmp_path: Path
) -> None:
    """Issue 35, item 9: a target its server does not have was skipped as "absent" at
    every step, and the run exited 0 (a dry run listed them as faults)."""
    url = server_process
    for name in ("db", "cache"):
        await _api(url, "POST", "/proxies", {"name": name, "upstream": "127.0.0.1:9"})
    (tmp_path / ".faultnet-chaos-armed").touch()
    log = tmp_path / "log.jsonl"
    base = ["--api", url, "--seed", "1", "--time-unit", "0.01", "--log", str(log)]
    for mode in ("--dry-run", "--armed"):
        r = await _chaos(mode, *base, "--target", "db", "--target", "dbb")
        err = r.stderr.decode()
        assert (r.returncode, r.stdout) == (2, b""), err
        assert err == f"faultnet: error: no proxy dbb on {url} (its proxies: cache, db)\n"
        assert not log.exists()  # nothing ran
    # A real run cannot check a server that does not answer, so it does not start; a
    # dry run says so and walks the plan (a plan may be walked offline).
    r = await _chaos("--armed", *base, "--target", "db@http://127.0.0.1:1")
    assert r.returncode == 2 and b"cannot reach the faultnet server" in r.stderr, r.stderr
    r = await _chaos("--dry-run", *base, "--target", "db@http://127.0.0.1:1")
    assert r.returncode == 0 and b"its targets are not checked" in r.stderr, r.stderr


def test_plan_reads_no_allowlist(tmp_path: Path) -> None:
    """Issue 35, item 10: the README's first chaos line (`chaos plan ... --process bot1`)
    exited 2 for want of --pids; planning is pure, the allowlist is a run's."""
    r = chaos_cli("plan", "--seed", "7", "--api", "http://127.0.0.1:8474", "--target", "db")
    assert r.returncode == 0, r.stderr
    with_process = chaos_cli(
        "plan", "--seed", "7", "--api", "http://127.0.0.1:8474", "--target", "db",
        "--process", "bot1", "--json",
    )  # fmt: skip
    assert with_process.returncode == 0, with_process.stderr
    assert json.loads(with_process.stdout)["config"]["processes"] == ["bot1"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--duration", "1e400"], "duration must be a finite number, not inf"),
        (["--duration", "nan"], "duration must be a finite number"),
        (["--gap", "1", "inf"], "gap must be a finite number"),
        (["--time-unit", "inf"], "--time-unit must be > 0 seconds"),
    ],
)
def test_numbers_that_are_not_finite_are_refused(args: list[str], words: str) -> None:
    _one_line_exit_2(chaos_cli("plan", "--target", "db@http://127.0.0.1:1", *args), words)


def test_a_misspelt_toxic_attribute_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[faults."toxic:latency"]\nattributes = { latenzy = 100 }\n')
    r = chaos_cli("plan", "--plan", str(plan), "--target", "db@http://127.0.0.1:1")
    _one_line_exit_2(r, "unknown attribute 'latenzy' of toxic latency (known: latency, jitter)")


def test_the_slot_cap_is_said(tmp_path: Path) -> None:
    r = chaos_cli(
        "plan", "--target", "db@http://127.0.0.1:1", "--duration", "1e6", "--gap", "1", "1"
    )
    assert r.returncode == 0
    assert "the plan stops at 10,000 slots" in r.stderr
    assert r.stdout.splitlines()[0].endswith("10000 slots")


def test_a_closed_stdout_ends_quietly() -> None:
    """`faultnet chaos plan | head -1`: the reader leaves, the writer ends without a
    traceback (10,000 slots: far more than a pipe buffer holds)."""
    argv = [sys.executable, "-m", "faultnet", "chaos", "plan", "--target", "db@http://127.0.0.1:1"]
    argv += ["--duration", "1e6", "--gap", "1", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_sample_plan_plans_and_dry_runs(tmp_path: Path) -> None:
    """The sample plan file (the format's documentation, `faultnet chaos sample`) is read
    by the planner and walked by a dry run."""
    r = chaos_cli("sample")
    assert r.returncode == 0 and r.stdout == SAMPLE_PLAN.read_text()
    assert "faultnet chaos sample" in chaos_cli("--help").stdout
    url = ["--api", "http://127.0.0.1:1"]
    r = chaos_cli("plan", "--plan", str(SAMPLE_PLAN), *url, "--seed", "4", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    drawn = {s["fault"] for s in doc["slots"] if not s.get("skip")}
    assert drawn and drawn <= {"freeze", "episode:freeze-sever", "sever", "toxic:latency"}
    log = tmp_path / "dry.jsonl"
    r = chaos_cli("--dry-run", "--plan", str(SAMPLE_PLAN), *url, "--seed", "4", "--log", str(log))
    assert r.returncode == 0, r.stderr
    faults = [x for x in read_jsonl(log).records if x["event"] == "fault"]
    assert len(faults) == len([s for s in doc["slots"] if not s.get("skip")])
