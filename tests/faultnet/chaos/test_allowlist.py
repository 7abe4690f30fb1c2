"""The allowlist is pinned before the first fault: a PID reused between the spawner's
line and chaos's first signal is never signalled (shown for real, in a PID namespace
where the test chooses the next PID), a line that cannot be pinned is a logged refusal,
and the working-directory rail keeps chaos to the run's own processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from faultnet.chaos import JoinLog, Runner
from faultnet.chaos._allowlist import Allowlist, parse_lines
from faultnet.eventlog import read_jsonl
from faultnet.procs import ProcessIdentity
from faultnet.testing import wait_until
from tests.conftest import in_ci
from tests.faultnet.chaos.conftest import append_line, proc_state, process_plan

ROOT = Path(__file__).resolve().parents[3]
UNIT = 0.01


async def _run(plan, tmp_path: Path, **kw: Any) -> list[dict[str, Any]]:
    marker = tmp_path / ".faultnet-chaos-armed"
    marker.touch()
    log = JoinLog(tmp_path / "chaos.jsonl", seed=plan.seed, dry=kw.pop("dry", False))
    await Runner(plan, log, armed=True, marker=marker, time_unit=UNIT, **kw).run()
    log.close()
    return read_jsonl(tmp_path / "chaos.jsonl").records


def _rails(records: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    return [(r["event"], r["target"], r["rail"], r["reason"]) for r in records if r.get("rail")]


# The scenario of issue 24, in a PID namespace of its own (unshare --pid): a listed
# process exits and its PID is handed to a newcomer (ns_last_pid chooses the next PID)
# after chaos has started and before its first fault.
_REUSE = textwrap.dedent(
    """
    import json, subprocess, sys, trio
    from pathlib import Path
    from faultnet.chaos import JoinLog, Runner
    from tests.faultnet.chaos.conftest import process_plan

    tmp = Path(sys.argv[1])
    listed = subprocess.Popen(["sleep", "120"])
    (tmp / "pids").write_text(f"{listed.pid}\\tvictim\\n")  # the README's plain format
    marker = tmp / "marker"
    marker.touch()
    log = JoinLog(tmp / "chaos.jsonl", seed=1, dry=False)
    newcomer = []

    def reuse(record):
        if record["event"] != "plan":
            return
        listed.kill()
        listed.wait()
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(listed.pid - 1))
        newcomer.append(subprocess.Popen(["sleep", "121"]))
        assert newcomer[0].pid == listed.pid, (newcomer[0].pid, listed.pid)

    log.on_record = reuse
    plan = process_plan("process:stop", (1.0, "victim", 1.0))
    runner = Runner(plan, log, allowlist=tmp / "pids", armed=True, marker=marker,
                    time_unit=0.05)
    trio.run(runner.run)
    log.close()
    newcomer[0].kill()
    print(json.dumps(log.records))
    """
)


def _pid_namespaces() -> bool:
    try:
        r = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _in_pid_namespace(script: str, tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """Run *script* (given *tmp_path* and *args*) as PID 1's child in a PID namespace of
    its own; the records it prints."""
    if not _pid_namespaces():
        if in_ci():
            pytest.fail("unshare --pid is not permitted here (CI runs as root)")
        pytest.skip("unshare --pid is not permitted here (needs root)")
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script]
        + [str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    records: list[dict[str, Any]] = json.loads(r.stdout)
    return records


def test_a_pid_reused_after_the_start_is_never_signalled(tmp_path: Path) -> None:
    records = _in_pid_namespace(_REUSE, tmp_path)
    assert [rec["event"] for rec in records if rec["event"] in ("fault", "skip")] == ["skip"]
    # The newcomer may start in the very clock tick (10 ms) the victim's start time was
    # taken in: then its command line is what tells them apart (seen in 1 suite run).
    ((event, target, rail, reason),) = _rails(records)
    assert (event, target, rail) == ("skip", "process:victim", "pid-allowlist")
    assert reason in (
        "victim: pid reused: start time differs from the listed one",
        "victim: pid reused: command line differs from the listed one",
        "victim: pid reused: the process pinned at the start has exited",
    )


# The worst case of the scenario above, made on purpose: the newcomer started in the
# victim's clock tick (every start time reads the same) and the victim's command line
# was read mid-exec (empty, so not compared). Only the pidfd held since the pin tells
# them apart (a whole-suite run met this once and signalled the newcomer).
_REUSE_SAME_TICK = (
    """
import faultnet.chaos._allowlist as al, faultnet.procs as procs
from faultnet.procs import ProcessIdentity
al.read_start_time = procs.read_start_time = lambda pid: 1
ProcessIdentity.of = classmethod(lambda cls, pid: cls(pid, 1, ()))
"""
    + _REUSE
)


def test_a_successor_in_the_same_tick_is_told_apart_by_the_pinned_pidfd(
    tmp_path: Path,
) -> None:
    records = _in_pid_namespace(_REUSE_SAME_TICK, tmp_path)
    assert [rec["event"] for rec in records if rec["event"] in ("fault", "skip")] == ["skip"]
    ((event, target, rail, reason),) = _rails(records)
    assert (event, target, rail) == ("skip", "process:victim", "pid-allowlist")
    assert reason == "victim: pid reused: the process pinned at the start has exited"


# Issue 35, item 1: the PID is reused BEFORE chaos starts. The listed process exits after
# the allowlist was written and a newcomer takes its PID (ns_last_pid); then chaos runs.
# A plain line used to pin the newcomer, which was stopped; either form must refuse it.
_REUSE_BEFORE = textwrap.dedent(
    """
    import json, os, subprocess, sys, time, trio
    from pathlib import Path
    from faultnet.chaos import JoinLog, Runner
    from faultnet.procs import ProcessIdentity
    from tests.faultnet.chaos.conftest import process_plan

    tmp, form = Path(sys.argv[1]), sys.argv[2]
    listed = subprocess.Popen(["sleep", "120"])
    ident = ProcessIdentity.spawned(listed.pid, listed.args)
    line = f"{listed.pid}\\tvictim"
    if form == "four columns":
        line += f"\\t{ident.start_time}\\t{json.dumps(listed.args)}"
    (tmp / "pids").write_text(line + "\\n")
    written = os.stat(tmp / "pids").st_mtime
    # The newcomer must start measurably after the write: start times count 10 ms ticks.
    while time.time() < written + 0.1:
        time.sleep(0.01)
    listed.kill()
    listed.wait()
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(listed.pid - 1))
    newcomer = subprocess.Popen(["sleep", "121"])
    assert newcomer.pid == listed.pid, (newcomer.pid, listed.pid)
    marker = tmp / "marker"
    marker.touch()
    log = JoinLog(tmp / "chaos.jsonl", seed=1, dry=False)
    plan = process_plan("process:stop", (0.0, "victim", 1.0), (2.0, "victim", 1.0))
    runner = Runner(plan, log, allowlist=tmp / "pids", armed=True, marker=marker,
                    time_unit=0.02)
    trio.run(runner.run)
    log.close()
    newcomer.kill()
    print(json.dumps(log.records))
    """
)


@pytest.mark.parametrize("form", ["two columns", "four columns"])
def test_a_pid_reused_before_chaos_starts_is_refused_in_either_form(
    tmp_path: Path, form: str
) -> None:
    records = _in_pid_namespace(_REUSE_BEFORE, tmp_path, form)
    assert [r for r in records if r["event"] == "fault"] == []  # never stopped
    rails = _rails(records)
    assert [(e, t, rail) for e, t, rail, _ in rails] == [
        ("refuse", "process:victim", "pid-allowlist"),
        ("skip", "process:victim", "pid-allowlist"),
        ("skip", "process:victim", "pid-allowlist"),
    ]
    refusal = rails[0][3]
    if form == "two columns":
        assert refusal.startswith("line 1: started 0.")
        assert "after the allowlist was last written" in refusal
    else:  # the start time it gives is not the newcomer's (refused at verify before)
        assert refusal == "line 1: pid reused: start time differs from the listed one at the pin"


async def test_a_line_that_cannot_be_pinned_is_a_logged_refusal(sleepers, tmp_path: Path) -> None:
    a, gone = sleepers(), sleepers()
    gone.kill()
    gone.wait()
    pids = tmp_path / "pids"
    pids.write_text(f"{a.pid}\ta\n{gone.pid}\tgone\nnot-a-pid\tjunk\n")
    plan = process_plan("process:stop", (0.0, "a", 1.0), (2.0, "gone", 1.0))
    records = await _run(plan, tmp_path, allowlist=pids)
    assert _rails(records) == [
        ("refuse", "process:gone", "pid-allowlist", "line 2: gone at the pin"),
        (
            "refuse",
            "process:junk",
            "pid-allowlist",
            "line 3: malformed: not pid<TAB>name[<TAB>...]",
        ),
        ("skip", "process:gone", "pid-allowlist", "gone: gone at the pin"),
    ]
    assert [r["target"] for r in records if r["event"] == "fault"] == ["process:a"]


async def test_a_plain_line_listed_after_the_pin_is_refused(sleepers, tmp_path: Path) -> None:
    a, late = sleepers(), sleepers()
    pids = tmp_path / "pids"
    pids.write_text(f"{a.pid}\ta\n")
    plan = process_plan("process:stop", (0.0, "a", 1.0), (5.0, "late", 1.0))
    log = JoinLog(tmp_path / "chaos.jsonl", seed=1, dry=False)
    marker = tmp_path / "marker"
    marker.touch()
    runner = Runner(plan, log, allowlist=pids, armed=True, marker=marker, time_unit=UNIT)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner.run)
        await wait_until(lambda: runner.result.counts.get("fault") == 1, 10, "the first stop")
        append_line(pids, f"{late.pid}\tlate")  # after the pin, without a start time
        await wait_until(lambda: runner.result.counts.get("end") == 1, 10, "the end")
    log.close()
    assert _rails(log.records)[-1] == (
        "skip",
        "process:late",
        "pid-allowlist",
        "late: unpinned: a line without a start time listed after the pin",
    )
    assert proc_state(late.pid) == "S"


async def test_a_dry_run_skips_what_the_pin_refused(sleepers, tmp_path: Path) -> None:
    gone = sleepers()
    gone.kill()
    gone.wait()
    pids = tmp_path / "pids"
    pids.write_text(f"{gone.pid}\tgone\n")
    plan = process_plan("process:stop", (0.0, "gone", 1.0))
    records = await _run(plan, tmp_path, allowlist=pids, dry=True)
    assert [r["event"] for r in records if r["event"] in ("fault", "skip")] == ["skip"]


async def test_a_process_working_outside_the_run_directory_is_refused(
    sleepers, tmp_path: Path
) -> None:
    a = sleepers()  # works in the test's own directory, not under tmp_path
    pids = tmp_path / "pids"
    pids.write_text(f"{a.pid}\ta\n")
    plan = process_plan("process:stop", (0.0, "a", 1.0))
    records = await _run(plan, tmp_path, allowlist=pids, pid_cwd=tmp_path)
    ((event, target, rail, reason),) = _rails(records)
    assert (event, target, rail) == ("skip", "process:a", "pid-cwd")
    assert "is not under " in reason and reason.endswith(tmp_path.name)
    assert proc_state(a.pid) == "S"


async def test_without_the_cwd_rail_that_process_is_stopped(sleepers, tmp_path: Path) -> None:
    """The harm the rail prevents: the same plan without it stops the process."""
    a = sleepers()
    pids = tmp_path / "pids"
    pids.write_text(f"{a.pid}\ta\n")
    plan = process_plan("process:stop", (0.0, "a", 1.0))
    records = await _run(plan, tmp_path, allowlist=pids)
    assert [r["result"]["pid"] for r in records if r["event"] == "fault"] == [a.pid]


def test_a_process_under_the_root_passes_the_cwd_rail(tmp_path: Path) -> None:
    work = tmp_path / "run" / "bot"
    work.mkdir(parents=True)
    p = subprocess.Popen(["sleep", "120"], cwd=work)
    try:
        ident = ProcessIdentity.of(p.pid)
        pids = tmp_path / "pids"
        pids.write_text(f"{p.pid}\tbot\t{ident.start_time}\n")
        assert Allowlist(pids, cwd_root=tmp_path / "run").verify("bot").identity is not None
        assert Allowlist(pids, cwd_root=work / "x").verify("bot").rail == "pid-cwd"
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("12", "malformed: not pid<TAB>name[<TAB>...]"),
        ("x\tname", "malformed: not pid<TAB>name[<TAB>...]"),
        ("12\tname\tsoon", "malformed: start time"),
        ("12\tname\t5\t[unclosed", "malformed: command line"),
    ],
)
def test_malformed_lines_are_named(line: str, reason: str) -> None:
    lines, bad = parse_lines(f"\n{line}\n")
    assert lines == [] and [(b.line, b.reason) for b in bad] == [(2, reason)]
