"""scripts/bench (``python -m harness.bench``): it runs end to end at tiny sizes and writes
valid JSON, and its checks go red when what they guard is broken. No timing is asserted
here: speed is what the benchmark measures, never what a test requires."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from faultnet.procs import ProcessIdentity
from harness.bench import human_size, make_block, matches_block, parse_size, watch_silence
from tests import REPO
from tests.conftest import run_module
from tests.harness.bench.runs import bench_json

# Tiny sizes: each run is a few seconds, mostly process start-up.
TINY = [
    "--bytes", "3M", "--pings", "100", "--connections", "20", "--rounds", "1",
    "--freeze-window", "0.05", "--requests", "1000", "--churn", "20",
    "--loss-bytes", "32M", "--datagrams", "500", "--callgrind", "0", "--toxic-bytes", "0",
]  # fmt: skip


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("harness.bench", *args, timeout=100)


def checks_by_name(doc: dict[str, Any]) -> dict[str, bool]:
    return {c["name"]: c["ok"] for c in doc["checks"]}


def test_tiny_run_end_to_end_writes_valid_json(tmp_path: Path) -> None:
    out, doc = bench_json(tmp_path, *TINY)
    assert doc["schema"] == "faultnet.bench/1" and doc["ok"] is True
    assert doc["params"]["bytes"] == 3 << 20
    for arm in ("direct", "faultnet"):
        rounds = doc["arms"][arm]["bulk"]["rounds"]
        assert [r["bytes"] for r in rounds] == [3 << 20] and rounds[0]["verified"]
        assert doc["arms"][arm]["rtt"]["samples"] == 100
        assert doc["arms"][arm]["rtt_one_cpu"]["samples"] == 100
        assert doc["arms"][arm]["hold"]["held"] == 20
        assert doc["arms"][arm]["churn"]["rounds"][0]["connections"] == 20
        if Path("/usr/bin/redis-benchmark").exists():
            assert doc["arms"][arm]["reqresp"]["p1_rps"] > 0
            assert doc["arms"][arm]["reqresp"]["p16_rps"] > 0
    loss = doc["arms"]["faultnet"]["loss"]
    assert [loss[f"p{pct}"]["rounds"][0]["bytes"] for pct in (0, 1, 5)] == [32 << 20] * 3
    for pct in (0, 1, 5):
        r = loss[f"p{pct}"]["rounds"][0]
        assert 0 <= r["retransmits_needed"] <= r["retransmits"]
    assert loss["p5"]["retransmits_needed"] > 0  # 5 % of ~512 segments
    assert doc["arms"]["direct"]["loss"] == {"n/a": "loss is a faultnet mode"}
    for arm in ("direct", "faultnet"):
        assert doc["arms"][arm]["udp"]["rounds"][0]["datagrams"] == 500
        assert doc["arms"][arm]["udp"]["per_s"] > 0
    assert "UDP datagrams/s" in out.stdout and "at 5 % loss" in out.stdout
    freeze = doc["arms"]["faultnet"]["freeze"]
    assert freeze["connections"] == 20 and freeze["zero_bytes_crossed"] is True
    assert freeze["delivered_after_thaw"]["right"] == 20
    assert doc["checks"] and all(c["ok"] for c in doc["checks"])
    statuses = {t["status"] for t in doc["targets"]}
    assert statuses <= {"MET", "MISSED", "N/A"} and len(doc["targets"]) == 10
    if shutil.which("cc") or shutil.which("gcc"):  # the RTT line's client is compiled
        assert doc["rtt_client"] == "compiled (pingpong.c)"
    assert len(doc["arms"]["faultnet"]["rtt_one_cpu"]["round_p50_us"]) == 1
    assert len(doc["loadavg"]) == 3
    # The table: three arms, the ratios, every target with its status.
    assert "fn/direct" in out.stdout and "fn/socat" in out.stdout
    assert out.stdout.count("MET") + out.stdout.count("MISSED") + out.stdout.count("N/A") >= 9
    if Path("/usr/bin/socat").exists():
        assert doc["arms"]["socat"]["bulk"]["rounds"][0]["verified"]
        assert doc["arms"]["socat"]["hold"] == {"n/a": "socat forks one process per connection"}


def test_checks_go_red_when_the_proxy_leaks_or_corrupts(tmp_path: Path) -> None:
    # Sabotage: the proxy runner ignores freeze and loss, and the sender flips one byte
    # of the faultnet arm's stream. The socat arm is skipped on request.
    out, doc = bench_json(
        tmp_path, *TINY, "--sabotage", "freeze,corrupt,loss", "--rtt-cpu", "none", "--no-socat",
        code=1,
    )  # fmt: skip
    checks = checks_by_name(doc)
    assert checks["bulk direct: byte count and content"] is True  # the internal control
    assert checks["bulk faultnet: byte count and content"] is False
    assert checks["freeze: zero bytes crossed either way after freeze() returned"] is False
    assert doc["arms"]["faultnet"]["freeze"]["upstream_bytes_received"] > 0
    assert checks["loss: every transfer arrived intact at 0/1/5 % loss"] is True
    [more_at_5] = [ok for name, ok in checks.items() if name.startswith("loss: at 5 %")]
    assert more_at_5 is False
    assert doc["arms"]["socat"]["skipped"] == "--no-socat"
    assert "socat arm skipped: --no-socat" in out.stdout and "FAILED" in out.stdout


def test_usage_errors_are_one_line_exit_2() -> None:
    for args, why in (
        (["--bytes", "lots"], "not a size"),
        (["--connections", "0"], "--connections must be"),
        (["--freeze-window", "-1"], "--freeze-window"),
        (["--rtt-cpu", "9999"], "not usable here"),
    ):
        out = bench(*args)
        assert out.returncode == 2, out
        assert why in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_json_path_that_is_a_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    # Checked up front: found only at the end, it was an IsADirectoryError traceback
    # after a whole benchmark had run.
    out = bench("--json", str(tmp_path))
    assert out.returncode == 2, out
    assert "is a directory" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "[bench]" not in out.stdout + out.stderr  # nothing was measured


def test_script_wrapper_help() -> None:
    out = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and "--quick" in out.stdout and "socat" in out.stdout


def test_parse_size_and_human_size() -> None:
    assert parse_size("1G") == 1 << 30 and parse_size("256M") == 256 << 20
    assert parse_size("64KiB") == 64 << 10 and parse_size("1000") == 1000
    assert human_size(1 << 30) == "1 GiB" and human_size(3 << 20) == "3 MiB"


def test_content_check_sees_one_flipped_byte_at_any_offset() -> None:
    block = make_block(7)
    stream = block * 2
    for offset in (0, 5, len(block) - 3, len(block) + 11):
        chunk = bytearray(stream[offset : offset + 4096])
        assert matches_block(memoryview(chunk), block, offset)
        chunk[100] ^= 1
        assert not matches_block(memoryview(chunk), block, offset)
    # A chunk lost from the stream shifts what follows: seen.
    assert not matches_block(stream[4096 : 4096 + 512], block, 0)


@pytest.mark.parametrize("leak", [False, True])
def test_silence_watch_counts_a_socket_that_got_bytes(leak: bool) -> None:
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        if leak:
            a.send(b"x")  # this is what a leaking freeze looks like to the client
        assert watch_silence([b, d], 0.05) == (1 if leak else 0)
    finally:
        for s in (a, b, c, d):
            s.close()


def test_a_socat_named_but_missing_is_a_usage_error() -> None:
    """--socat PATH that is not there exits 2 in one line before anything runs (was: the
    socat arm silently dropped); without --socat, a socat not on PATH is still skipped."""
    out = bench(*TINY, "--socat", "/nonexistent/socat")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--socat /nonexistent/socat: not an executable file" in out.stderr
    assert "[bench]" not in out.stderr  # nothing started


def test_sigterm_stops_every_process_the_bench_started() -> None:
    # Default sizes: the run is still in its first line when the signal comes.
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.bench", "--rounds", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first progress line names the children
            seen.append(line)
            if " pid " in line:
                break
        pids = [int(p) for p in re.findall(r" pid (\d+)", seen[-1])]
        assert len(pids) >= 2, seen  # upstream and proxy (and socat, when installed)
        children = [ProcessIdentity.of(pid) for pid in pids]
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert "interrupted by SIGTERM; cleaned up" in rest and "Traceback" not in rest
    assert [c for c in children if c.is_alive()] == []


def test_ratios_are_medians_of_per_round_ratios() -> None:
    """Each round's faultnet figure over the other arm's in that same round, then the
    median: a slow round that slowed both arms does not skew it (a ratio of medians
    taken over different rounds would give 150 / 100 = 1.5 here, not 1.0)."""
    from harness.bench._run import _ratios

    arms = {
        "direct": {"bulk": {"rounds": [{"mbps": 100}, {"mbps": 300}, {"mbps": 50}]}},
        "socat": {},
        "faultnet": {"bulk": {"rounds": [{"mbps": 100}, {"mbps": 300}, {"mbps": 150}]}},
    }
    assert _ratios(arms)["throughput_vs_direct"] == 1.0
    assert _ratios(arms)["throughput_vs_socat"] is None


def test_proxy_cpu_is_read_in_nanoseconds_not_ticks() -> None:
    """The frozen-CPU figure: 2 ms of CPU read as 2 ms (in 10 ms ticks: 0 or 10)."""
    from harness.bench._children import proc_cpu_ns

    before, t0 = proc_cpu_ns(os.getpid()), time.thread_time_ns()
    while time.thread_time_ns() - t0 < 2_000_000:
        pass
    spent = proc_cpu_ns(os.getpid()) - before  # type: ignore[operator]
    assert 2_000_000 <= spent < 9_000_000, spent


def test_the_callgrind_dump_total_is_read(tmp_path: Path) -> None:
    from harness.bench._compiled import _totals

    dump = tmp_path / "cg.1.1"
    dump.write_text("version: 1\ncmd: x\nevents: Ir\nfn=main\n1 5\nsummary: 834000\n")
    assert _totals(dump) == 834000


def test_the_bulk_ceiling_is_direct_s_time_over_the_cpu_a_proxied_gib_needs() -> None:
    """Direct moved a GiB in 0.3 s; through the proxy the ends spent 0.6 CPU-s and the
    proxy 0.4: on 2 CPUs at least 0.5 s, so 0.3 / 0.5 = 0.6x is the most any proxy gets."""
    from harness.bench._run import GIB, _ratios

    mbps = GIB / 0.3 / 1e6
    f = {"ends_cpu_s_per_gib": 0.6, "proxy_cpu_s_per_gib": 0.4, "cpus": 2}
    arms = {"direct": {"bulk": {"mbps": mbps}}, "socat": {}, "faultnet": {"bulk": f}}
    assert _ratios(arms)["throughput_ceiling_vs_direct"] == pytest.approx(0.6)
    # Four CPUs: twice the room.
    arms["faultnet"]["bulk"] = {**f, "cpus": 4}
    assert _ratios(arms)["throughput_ceiling_vs_direct"] == pytest.approx(1.2)
    # Not measured (the upstream's CPU unreadable): no ceiling claimed.
    arms["faultnet"]["bulk"] = {**f, "ends_cpu_s_per_gib": None}
    assert _ratios(arms)["throughput_ceiling_vs_direct"] is None
