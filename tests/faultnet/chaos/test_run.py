"""The runner against real loopback proxies in this process and real processes:
faults applied and undone, the join log, dry runs, once-per-run, undo on cancel."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import trio

from faultnet.chaos import JoinLog, Runner, catalogue, load_config, make_plan, register_process
from faultnet.controls import assert_accepting
from faultnet.eventlog import read_jsonl
from faultnet.testing import echo_server, read_exactly, wait_until
from faultnet.toxics import Latency
from tests.faultnet.chaos.conftest import append_line, hand_plan, proc_state, process_plan

UNIT = 0.01  # seconds per unit: a plan of 100 units runs in about a second

#: The fields a dry run and a real run share for each step: the decision, not its outcome.
STEP_KEYS = ("event", "counter", "at", "action", "target", "detail", "rail")


def steps(records: list[dict[str, Any]]) -> list[tuple]:
    return [
        tuple(repr(r.get(k)) for k in STEP_KEYS)
        for r in records
        if r["event"] in ("fault", "undo", "skip")
    ]


def armed(tmp_path: Path) -> dict[str, Any]:
    marker = tmp_path / ".faultnet-chaos-armed"
    marker.touch()
    return {"armed": True, "marker": marker}


def listed(tmp_path: Path, **processes: Any) -> Path:
    """An allowlist file naming each of *processes* (name=Popen), pinned as chaos pins."""
    pids = tmp_path / "pids"
    for name, proc in processes.items():
        register_process(pids, name, proc.pid)
    return pids


async def _open_links(address, n: int = 2) -> list[trio.SocketStream]:
    links = []
    for _ in range(n):
        s = await trio.open_tcp_stream(*address)
        await s.send_all(b"hello there\n")
        assert await read_exactly(s, 12) == b"hello there\n"
        links.append(s)
    return links


async def assert_as_found(proxy) -> None:
    """The pre-run state: no fault mode in force, no toxic, no frozen connection, and the
    listener accepting (a control that has its own test of going red)."""
    assert proxy.state == {
        "refusing": False,
        "syn_dropped": False,
        "frozen_new": [],
        "blackhole_new": False,
        "loss_new": None,
        "loss_new_both_ways": None,
        "syn_loss": 0.0,
        "partitioned": [],
    }
    assert proxy.toxics == []
    assert all(c.state in ("open", "half-closed") for c in proxy.connections())
    await assert_accepting(proxy.address)


async def test_a_real_run_applies_every_proxy_fault_logs_it_and_undoes_it(
    faultnet_proxy, tmp_path: Path
) -> None:
    async with echo_server() as upstream:
        events = tmp_path / "proxy.jsonl"
        proxy = await faultnet_proxy(upstream, name="db", event_log=str(events))
        links = await _open_links(proxy.address)
        # One slot per proxy fault of the catalogue (built from it, so a new mode or
        # toxic is covered here at once); the instant ones last, as they end the links.
        faults = [f for f in catalogue().values() if f.on == "proxy"]
        faults.sort(key=lambda f: f.undo is None)
        slots = []
        for i, f in enumerate(faults):
            detail: dict[str, Any] = {}
            if f.kind == "toxic":
                type_name = f.name.split(":")[1]
                detail = {
                    "stream": "downstream",
                    "type": type_name,
                    "attributes": dict(f.attributes),
                    "name": f"chaos_1_{i}_{type_name}",
                }
            slots.append((i * 3.0, f.name, "db@local", 2.0 if f.undo else 0.0, detail))
        plan = hand_plan(slots, proxies=("db@local",))
        log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
        result = await Runner(
            plan, log, proxies={"db": proxy}, time_unit=UNIT, **armed(tmp_path)
        ).run()
        assert result.exit_code == 0, log.records
        records = read_jsonl(tmp_path / "chaos.jsonl").records
        fired = [r for r in records if r["event"] == "fault"]
        assert [r["action"] for r in fired] == [f.name for f in faults]
        undone = [r for r in records if r["event"] == "undo"]
        assert [r["counter"] for r in undone] == [
            r["counter"] for r in fired if catalogue()[r["action"]].undo
        ]
        assert all(r["reason"] == "due" for r in undone)
        # The proxy's own log is the independent observer: every mode was applied and
        # every toxic added, and each undoing mode and toxic removal came after.
        seen = read_jsonl(events).records
        # (The proxy logs a sever as "severed", the way the connection ended.)
        modes = [
            {"severed": "sever"}.get(r["mode"], r["mode"])
            for r in seen
            if r["event"] in ("fault_applied", "fault_removed")
        ]
        for f in faults:
            if f.kind == "mode":
                assert f.name in modes
                if f.undo:
                    assert f.undo in modes[modes.index(f.name) :]
        added = {r["toxic"] for r in seen if r["event"] == "toxic_added"}
        removed = {r["toxic"] for r in seen if r["event"] == "toxic_removed"}
        assert added == removed and len(added) == len([f for f in faults if f.kind == "toxic"])
        await assert_as_found(proxy)
        for s in links:
            await s.aclose()


async def test_a_dry_run_logs_exactly_the_steps_a_real_run_attempts(
    faultnet_proxy, tmp_path: Path
) -> None:
    async with echo_server() as upstream:
        db = await faultnet_proxy(upstream, name="db")
        cache = await faultnet_proxy(upstream, name="cache")
        config = load_config(proxies=["db", "cache"], duration=100, gap=(2, 6))
        plan = make_plan(config, 7)
        assert len(plan.slots) > 10
        proxies = {"db": db, "cache": cache}
        logs = []
        for name, dry in (("dry1", True), ("dry2", True), ("real", False)):
            log = JoinLog(tmp_path / f"{name}.jsonl", seed=7, dry=dry)
            runner = Runner(plan, log, proxies=proxies, dry=dry, time_unit=UNIT, **armed(tmp_path))
            assert (await runner.run()).exit_code == 0
            logs.append(read_jsonl(tmp_path / f"{name}.jsonl").records)
        assert steps(logs[0]) == steps(logs[1]) == steps(logs[2])
        assert all(r["dry"] for r in logs[0]) and not any(r["dry"] for r in logs[2])
        await assert_as_found(db)
        await assert_as_found(cache)


async def test_cancelling_a_run_undoes_every_fault_it_applied(
    faultnet_proxy, tmp_path: Path
) -> None:
    async with echo_server() as upstream:
        proxies = {n: await faultnet_proxy(upstream, name=n) for n in ("a", "b", "c")}
        links = await _open_links(proxies["a"].address)
        latency = {
            "stream": "upstream",
            "type": "latency",
            "attributes": {"latency": 10},
            "name": "chaos_1_1_latency",
        }
        plan = hand_plan(
            [
                (0.0, "freeze", "a@local", 1e6, {"stream": "both"}),
                (1.0, "toxic:latency", "b@local", 1e6, latency),
                (2.0, "refuse", "c@local", 1e6, {}),
            ],
            proxies=("a@local", "b@local", "c@local"),
        )
        log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
        runner = Runner(plan, log, proxies=proxies, time_unit=UNIT, **armed(tmp_path))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await wait_until(lambda: runner.result.counts.get("fault") == 3, 10, "three faults")
            assert proxies["a"].connections()[0].state == "frozen"
            assert proxies["c"].state["refusing"] and proxies["b"].toxics
            nursery.cancel_scope.cancel()
        undone = [r for r in log.records if r["event"] == "undo"]
        assert [(r["action"], r["target"], r["reason"]) for r in undone] == [
            ("restore", "c@local", "exit"),
            ("remove_toxic", "b@local", "exit"),
            ("thaw", "a@local", "exit"),
        ]
        assert log.records[-1]["event"] == "end"
        assert log.records[-1]["detail"]["not_undone"] == []
        for p in proxies.values():
            await assert_as_found(p)
        await links[0].send_all(b"after thaw\n")
        assert await read_exactly(links[0], 11) == b"after thaw\n"


async def test_a_fault_that_cannot_be_undone_is_named_in_the_log(
    faultnet_proxy, tmp_path: Path
) -> None:
    async with echo_server() as upstream:
        proxy = await faultnet_proxy(upstream, name="db")
        port = proxy.address[1]
        plan = hand_plan([(0.0, "refuse", "db@local", 1.0, {})], proxies=("db@local",))
        log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
        runner = Runner(plan, log, proxies={"db": proxy}, time_unit=0.5, **armed(tmp_path))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await wait_until(lambda: runner.result.counts.get("fault") == 1, 10, "refuse")
            # Someone else takes the port while it is refused: restore cannot listen.
            thief = trio.socket.socket()
            await thief.bind(("127.0.0.1", port))
            thief.listen(1)
        with thief:
            assert runner.result.exit_code == 1
            failed = [r for r in log.records if r["event"] == "undo_failed"]
            assert len(failed) == 1 and "remains: refuse on db@local" in failed[0]["reason"]
            assert runner.result.not_undone == ["refuse on db@local"]


async def test_a_once_per_run_fault_is_spent_when_it_fires_not_when_planned(
    sleepers, tmp_path: Path
) -> None:
    a, b = sleepers(), sleepers()
    pids = listed(tmp_path, a=a, b=b)
    plan = process_plan(
        "process:kill",
        (0.0, "ghost", 0.0),  # not listed: a rail skips it
        (1.0, "a", 0.0),  # fires: the budget is spent
        (2.0, "b", 0.0),  # spent: a logged skip
    )
    log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
    result = await Runner(plan, log, allowlist=pids, time_unit=UNIT, **armed(tmp_path)).run()
    assert result.exit_code == 0
    decisions = [
        (r["event"], r["target"], r.get("rail"), r.get("reason"))
        for r in log.records
        if r["event"] in ("fault", "skip")
    ]
    assert decisions == [
        ("skip", "process:ghost", "pid-allowlist", "ghost: not listed"),
        ("fault", "process:a", None, None),
        (
            "skip",
            "process:b",
            None,
            "spent: process:kill runs once per run and fired at counter 10",
        ),
    ]
    assert a.wait(timeout=10) == -signal.SIGKILL
    assert b.poll() is None and proc_state(b.pid) != "T"


async def test_sigstop_is_undone_by_sigcont_at_its_time_and_on_cancel(
    sleepers, tmp_path: Path
) -> None:
    a, b = sleepers(), sleepers()
    pids = listed(tmp_path, a=a)
    # A two-column line, as a shell spawner writes it: pinned at first sight.
    append_line(pids, f"{b.pid}\tb")
    plan = process_plan("process:stop", (0.0, "a", 20.0), (1.0, "b", 1e6))
    log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
    runner = Runner(plan, log, allowlist=pids, time_unit=UNIT, **armed(tmp_path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run)
        await wait_until(lambda: runner.result.counts.get("fault") == 2, 10, "two stops")
        # kill() returns before the target is scheduled to act on SIGSTOP: under load its
        # state reads R for a while (seen at a load average of 10), so wait for the stop.
        await wait_until(lambda: proc_state(b.pid) == "T", 10, "b stopped")
        await wait_until(lambda: runner.result.counts.get("undo") == 1, 10, "a's SIGCONT")
        assert proc_state(a.pid) != "T" and proc_state(b.pid) == "T"
        nursery.cancel_scope.cancel()
    assert proc_state(a.pid) != "T" and proc_state(b.pid) != "T"
    undone = [(r["target"], r["action"], r["reason"]) for r in log.records if r["event"] == "undo"]
    assert undone == [("process:a", "SIGCONT", "due"), ("process:b", "SIGCONT", "exit")]


async def test_a_fault_that_cannot_be_applied_is_an_error_and_fails_the_run(
    faultnet_proxy, tmp_path: Path
) -> None:
    # A real refusal: the proxy already holds a toxic of the name the plan uses. The run
    # must record an error (exit 1), never an applied fault, and so never "undo" (remove)
    # the toxic that was not its own.
    async with echo_server() as upstream:
        proxy = await faultnet_proxy(upstream, name="db")
        theirs = Latency("chaos_1_1_latency", latency=10)
        proxy.add_toxic(theirs)
        latency = {
            "stream": "upstream",
            "type": "latency",
            "attributes": {"latency": 10},
            "name": "chaos_1_1_latency",
        }
        plan = hand_plan([(0.0, "toxic:latency", "db@local", 1.0, latency)], proxies=("db@local",))
        log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
        runner = Runner(plan, log, proxies={"db": proxy}, time_unit=UNIT, **armed(tmp_path))
        result = await runner.run()
        assert result.exit_code == 1
        (error,) = [r for r in log.records if r["event"] == "error"]
        assert error["target"] == "db@local" and "already exists" in error["reason"]
        assert not [r for r in log.records if r["event"] in ("fault", "undo", "undo_failed")]
        assert proxy.toxics == [theirs]


async def test_an_episode_ends_only_the_connections_it_took(faultnet_proxy, tmp_path: Path) -> None:
    """freeze then sever: the links open at the start are frozen, then severed; a link
    made during the outage (a client that reconnected) keeps working."""
    async with echo_server() as upstream:
        proxy = await faultnet_proxy(upstream, name="db")
        old = await _open_links(proxy.address, 2)
        plan = hand_plan(
            [(0.0, "episode:freeze-sever", "db@local", 1e6, {"down": "freeze", "end": "sever"})],
            proxies=("db@local",),
        )
        log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
        runner = Runner(plan, log, proxies={"db": proxy}, time_unit=UNIT, **armed(tmp_path))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await wait_until(lambda: runner.result.counts.get("fault") == 1, 10, "the freeze")
            (new,) = await _open_links(proxy.address, 1)  # made during the outage
            nursery.cancel_scope.cancel()  # the exit undo is the episode's ending
        fault = next(r for r in log.records if r["event"] == "fault")
        undo = next(r for r in log.records if r["event"] == "undo")
        assert fault["result"]["connections"] == 2 and len(fault["result"]["conns"]) == 2
        assert fault["began"] <= fault["mono"]
        assert (undo["action"], undo["result"]["conns"]) == ("sever", fault["result"]["conns"])
        for s in old:  # severed: EOF
            with trio.fail_after(10):
                assert await s.receive_some(100) == b""
        await new.send_all(b"still here\n")
        assert await read_exactly(new, 11) == b"still here\n"
        for s in (*old, new):
            await s.aclose()
