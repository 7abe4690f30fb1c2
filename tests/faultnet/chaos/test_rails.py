"""Each rail: a test that makes it fire (the refusal is logged, nothing is touched) and
a test that removes it and watches the harm it prevents happen (so the first test would
go red without it)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

import faultnet.chaos._rails as rails
from faultnet.chaos import JoinLog, Runner, register_process
from faultnet.chaos._allowlist import Allowlist, Verdict
from faultnet.eventlog import read_jsonl
from faultnet.procs import ProcessIdentity
from faultnet.server import RunningServer
from faultnet.testing import echo_server, wait_until
from tests.faultnet.chaos.conftest import append_line, hand_plan, proc_state, process_plan

UNIT = 0.01
FREEZE = (0.0, "freeze", "db@local", 2.0, {"stream": "both"})


def _applied(events: Path) -> list[str]:
    if not events.exists():
        return []
    return [r["mode"] for r in read_jsonl(events).records if r["event"] == "fault_applied"]


async def _run(plan, tmp_path: Path, **kw: Any) -> tuple[Runner, list[dict[str, Any]]]:
    kw.setdefault("time_unit", UNIT)
    log = JoinLog(tmp_path / "chaos.jsonl", seed=plan.seed, dry=False)
    runner = Runner(plan, log, **kw)
    await runner.run()
    log.close()
    return runner, read_jsonl(tmp_path / "chaos.jsonl").records


def _marker(tmp_path: Path) -> Path:
    marker = tmp_path / ".faultnet-chaos-armed"
    marker.touch()
    return marker


def _rails_fired(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["event"], r["rail"]) for r in records if r.get("rail")]


# -- unarmed ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["flag", "marker"])
async def test_an_unarmed_run_is_refused_and_touches_nothing(
    faultnet_proxy, tmp_path: Path, missing: str
) -> None:
    async with echo_server() as upstream:
        events = tmp_path / "proxy.jsonl"
        proxy = await faultnet_proxy(upstream, name="db", event_log=str(events))
        marker = tmp_path / "marker"
        if missing == "flag":
            marker.touch()
        plan = hand_plan([FREEZE, (3.0, "refuse", "db@local", 1.0, {})], proxies=("db@local",))
        runner, records = await _run(
            plan, tmp_path, proxies={"db": proxy}, armed=missing != "flag", marker=marker
        )
        assert runner.result.refused and runner.result.exit_code == 2
        assert _rails_fired(records) == [
            ("refuse", "unarmed"),
            ("skip", "unarmed"),
            ("skip", "unarmed"),
        ]
        word = "--armed was not given" if missing == "flag" else "does not exist"
        assert word in records[2]["reason"]
        assert _applied(events) == []


# -- loopback ------------------------------------------------------------------------------

# A proxy whose upstream is beyond loopback. Nothing connects through it, so no packet
# ever leaves the machine: the rail is judged on the address alone.
BEYOND = ("192.0.2.1", 9)  # TEST-NET-1 (RFC 5737): documentation only, never routed


async def test_a_target_beyond_loopback_is_refused(faultnet_proxy, tmp_path: Path) -> None:
    events = tmp_path / "proxy.jsonl"
    proxy = await faultnet_proxy(BEYOND, name="db", event_log=str(events))
    plan = hand_plan([FREEZE], proxies=("db@local",))
    runner, records = await _run(
        plan, tmp_path, proxies={"db": proxy}, armed=True, marker=_marker(tmp_path)
    )
    assert _rails_fired(records) == [("skip", "loopback")]
    assert "192.0.2.1 is not loopback" in next(r["reason"] for r in records if r.get("rail"))
    assert _applied(events) == [] and runner.result.exit_code == 0
    # ...unless allowed by the flag.
    (tmp_path / "chaos.jsonl").unlink()
    await _run(
        plan,
        tmp_path,
        proxies={"db": proxy},
        armed=True,
        marker=_marker(tmp_path),
        allow_non_loopback=True,
    )
    assert _applied(events) == ["freeze"]


async def test_a_server_url_beyond_loopback_is_refused_without_contact(
    faultnet_server: RunningServer, tmp_path: Path
) -> None:
    # 0.0.0.0 is "every interface", not loopback; the rail refuses it without a packet.
    port = faultnet_server.url.rsplit(":", 1)[1]
    await faultnet_server.registry.create({"name": "db", "upstream": "127.0.0.1:9"})
    target = f"db@http://0.0.0.0:{port}"
    plan = hand_plan([(0.0, "refuse", target, 1.0, {})], proxies=(target,))
    _, records = await _run(plan, tmp_path, armed=True, marker=_marker(tmp_path))
    assert _rails_fired(records) == [("skip", "loopback")]
    server_events = faultnet_server.registry.events.read(proxy="db")
    assert not [e for e in server_events if e["event"] == "fault_applied"]


async def test_without_the_loopback_rail_chaos_drives_a_server_beyond_it(
    tmp_path: Path, monkeypatch
) -> None:
    from faultnet.server import open_server

    monkeypatch.setattr(rails, "check_loopback", lambda hosts, allow: None)
    # The server admits Host 0.0.0.0 by name: it refuses a Host that is not its own
    # address or a loopback name (DNS rebinding) unless told otherwise.
    async with open_server("127.0.0.1", 0, allow_hosts=["0.0.0.0"]) as server:
        port = server.url.rsplit(":", 1)[1]
        await server.registry.create({"name": "db", "upstream": "127.0.0.1:9"})
        # Linux delivers a connect to 0.0.0.0 to this host, so the server (on 127.0.0.1)
        # is reached: exactly what the rail would have refused.
        target = f"db@http://0.0.0.0:{port}"
        plan = hand_plan([(0.0, "refuse", target, 1.0, {})], proxies=(target,))
        _, records = await _run(plan, tmp_path, armed=True, marker=_marker(tmp_path))
        server_events = server.registry.events.read(proxy="db")
    assert [r["event"] for r in records if r["counter"] == 0] == ["intent", "fault", "undo"]
    assert [e["mode"] for e in server_events if e["event"] == "fault_applied"] == ["refuse"]


# -- unnamed -------------------------------------------------------------------------------


async def test_a_proxy_the_plan_does_not_name_is_never_touched(
    faultnet_proxy, tmp_path: Path
) -> None:
    async with echo_server() as upstream:
        db = await faultnet_proxy(upstream, name="db")
        events = tmp_path / "other.jsonl"
        other = await faultnet_proxy(upstream, name="other", event_log=str(events))
        # A slot aimed at a proxy the plan does not name (a plan built or edited by hand).
        plan = hand_plan(
            [FREEZE, (3.0, "freeze", "other@local", 2.0, {"stream": "both"})],
            proxies=("db@local",),
        )
        _, records = await _run(
            plan,
            tmp_path,
            proxies={"db": db, "other": other},
            armed=True,
            marker=_marker(tmp_path),
            servers=["http://127.0.0.1:1"],
        )
        assert _rails_fired(records) == [
            ("refuse", "unnamed"),  # the server given but named by no target
            ("refuse", "unnamed"),  # the proxy given but not named
            ("skip", "unnamed"),  # the slot aimed at it
        ]
        assert [r["target"] for r in records if r.get("rail")] == [
            "http://127.0.0.1:1",
            "other@local",
            "other@local",
        ]
        assert _applied(events) == []


# -- unarmed and unnamed, each removed ------------------------------------------------------


@pytest.mark.parametrize(
    ("rail", "named", "armed"),
    [
        # unarmed: neither --armed nor the marker, and the same run faults.
        ("check_armed", True, False),
        # unnamed: armed, and a slot reaches a proxy the plan does not name.
        ("check_named", False, True),
    ],
    ids=["unarmed", "unnamed"],
)
async def test_without_the_rail_the_freeze_it_refuses_is_applied(
    faultnet_proxy, tmp_path: Path, monkeypatch, rail: str, named: bool, armed: bool
) -> None:
    monkeypatch.setattr(rails, rail, lambda *args: None)
    async with echo_server() as upstream:
        events = tmp_path / "proxy.jsonl"
        proxy = await faultnet_proxy(upstream, name="db", event_log=str(events))
        plan = hand_plan([FREEZE], proxies=("db@local",) if named else ())
        marker = _marker(tmp_path) if armed else None
        runner, _ = await _run(plan, tmp_path, proxies={"db": proxy}, armed=armed, marker=marker)
        assert not runner.result.refused
        assert _applied(events) == ["freeze"]


# -- pid-allowlist -------------------------------------------------------------------------


def _listed_with_another_cmdline(pids: Path, name: str, pid: int) -> None:
    # The PID and start time of a live process, but the command line of another: what the
    # file would say if the PID had been reused by a process started in the same tick.
    ident = ProcessIdentity.of(pid)
    pids.write_text(f"{pid}\t{name}\t{ident.start_time}\t{json.dumps(['other-program'])}\n")


async def test_a_process_not_listed_or_no_longer_the_one_listed_is_not_signalled(
    sleepers, tmp_path: Path
) -> None:
    a, b, c = sleepers(), sleepers(), sleepers()
    pids = tmp_path / "pids"
    _listed_with_another_cmdline(pids, "a", a.pid)
    # b's PID with a start time that is not b's.
    append_line(pids, f"{b.pid}\tb\t{ProcessIdentity.of(b.pid).start_time + 1}")
    plan = process_plan(
        "process:stop",
        (0.0, "a", 2.0),
        (1.0, "b", 2.0),
        (2.0, "c", 2.0),  # c is not listed at all
    )
    _, records = await _run(plan, tmp_path, allowlist=pids, armed=True, marker=_marker(tmp_path))
    skips = [(r["target"], r["rail"], r["reason"]) for r in records if r.get("rail")]
    at_pin = "differs from the listed one at the pin"
    assert skips == [
        # Refused at the pin (a line in either form is checked there), then at each step.
        ("process:a", "pid-allowlist", f"line 1: pid reused: command line {at_pin}"),
        ("process:b", "pid-allowlist", f"line 2: pid reused: start time {at_pin}"),
        ("process:a", "pid-allowlist", "a: pid reused: command line differs from the listed one"),
        ("process:b", "pid-allowlist", "b: pid reused: start time differs from the listed one"),
        ("process:c", "pid-allowlist", "c: not listed"),
    ]
    assert [proc_state(p.pid) for p in (a, b, c)] == ["S", "S", "S"]


async def test_without_the_pid_rail_a_reused_pid_would_be_stopped(
    sleepers, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(Allowlist, "check", staticmethod(lambda listed: Verdict(listed, None)))
    a = sleepers()
    pids = tmp_path / "pids"
    _listed_with_another_cmdline(pids, "a", a.pid)
    plan = process_plan("process:stop", (0.0, "a", 1e6))
    log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
    runner = Runner(plan, log, allowlist=pids, armed=True, marker=_marker(tmp_path), time_unit=UNIT)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run)
        await wait_until(lambda: runner.result.counts.get("fault") == 1, 10, "the stop")
        # The harm: a process that is not the one listed gets stopped (SIGSTOP takes
        # effect when the target is next scheduled, so wait for it).
        await wait_until(lambda: proc_state(a.pid) == "T", 10, "a stopped")
        nursery.cancel_scope.cancel()
    assert proc_state(a.pid) != "T"


def test_register_process_pins_start_time_and_command_line(sleepers, tmp_path: Path) -> None:
    a = sleepers()
    pids = tmp_path / "pids"
    ident = register_process(pids, "a", a.pid)
    fields = pids.read_text().rstrip("\n").split("\t")
    assert fields[:3] == [str(a.pid), "a", str(ident.start_time)]
    assert json.loads(fields[3]) == ["sleep", "120"]
    assert Allowlist(pids).verify("a").identity == ident
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=10)
    assert Allowlist(pids).verify("a").reason == "gone"
