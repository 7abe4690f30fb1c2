"""The bench's toxic lines (issue 32, item 7): a tiny run prints every line and judges
every target, and the target table's judge puts a figure on the right side of each
row's bound. No speed is asserted: the bench measures it, tests never require it."""

from __future__ import annotations

import dataclasses
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from harness.bench import _httpclient
from harness.bench._http import Nginx, _fetch, _nginx, _p50_ms
from harness.bench._targets import TARGETS, Facts, Figure, Target, judge
from harness.bench._toxic import LATENCY_MS
from harness.bench._toxic_targets import TOXIC_TARGETS
from tests.conftest import run_module
from tests.harness.bench.runs import bench_json

# Only the toxic section beside the lines every run has, at tiny sizes (~4 s).
TINY_TOXIC = [
    "--bytes", "1M", "--pings", "100", "--connections", "10", "--rounds", "1",
    "--freeze-window", "0.05", "--requests", "0", "--churn", "0", "--loss-bytes", "0",
    "--datagrams", "0", "--callgrind", "0", "--toxic-bytes", "1M",
]  # fmt: skip
LINES = ("latency0", "latency5", "slicer", "bandwidth", "after_removal", "redis", "hop", "postgres",
         "http1", "http2", "http_bulk")  # fmt: skip


def test_a_tiny_run_prints_every_toxic_line_with_its_target(tmp_path: Path) -> None:
    out, doc = bench_json(tmp_path, *TINY_TOXIC)
    toxic = doc["toxic"]
    assert doc["params"]["toxic_bytes"] == 1 << 20 and tuple(toxic)[2:] == LINES
    assert toxic["latency0"]["rtt"]["toxic"]["samples"] == 100
    assert toxic["latency0"]["rtt"]["direct"]["samples"] == 100
    for pacing in ("1000us", "200us"):
        paced = toxic["latency5"]["paced"][pacing]
        assert paced["samples"] == 100
        assert paced["p50_ms"] >= LATENCY_MS  # the toxic delays by at least what it asks
    for line, arm in (("latency5", "toxic"), ("slicer", "toxic"), ("bandwidth", "toxic")):
        assert toxic[line]["bulk"][arm]["mbps"] > 0, line
    assert toxic["bandwidth"]["achieved_vs_asked"] > 0
    assert toxic["after_removal"]["rtt"]["removed"]["samples"] == 100
    assert toxic["after_removal"]["added_vs_fresh"] is not None
    assert toxic["hop"]["rtt"]["hop"]["samples"] == 100
    assert toxic["hop"]["bulk_vs_bare"] is not None
    assert toxic["redis"] == {"skipped": "--requests 0"}  # redis-benchmark's GETs: none
    checks = {c["name"]: c["ok"] for c in doc["checks"]}
    assert checks["toxic lines: every transfer and echo came back intact"] is True
    # The bench's ten targets, then the toxic lines' seventeen, each with its status.
    names = [t["target"] for t in doc["targets"]]
    assert len(names) == len(TARGETS) + len(TOXIC_TARGETS) == 27
    assert all(t["status"] in {"MET", "MISSED", "N/A"} for t in doc["targets"])
    for t in doc["targets"][len(TARGETS) :]:
        assert f"{t['status']:6}  {t['target']}: {t['shown']}" in out.stdout
    assert "toxic lines (a second faultnet proxy" in out.stdout
    assert "hop: bulk MB/s, faultnet / hop:" in out.stdout
    # A line's ratio is None only when no round's bare proxy added time over direct (a
    # tiny run's noise: bare 0.03-0.04 ms faster than direct, seen for pgbench and HTTP).
    pg = toxic["postgres"]
    if "skipped" not in pg:
        _ratio_none_only_without_bare_time(pg, pg["round_added_ms"]["faultnet"])
    assert "postgres: pgbench -S latency average ms" in out.stdout
    for name in ("http1", "http2"):
        line = toxic[name]
        if "skipped" not in line:
            assert None not in line["round_p50_ms"]["toxic"], line
            _ratio_none_only_without_bare_time(line, line["round_added_ms"]["bare"])
        assert line.get("instructions", {}).get("skipped") == "not run (--callgrind 0)" or (
            "skipped" in line
        )
    bulk = toxic["http_bulk"]
    assert "skipped" in bulk or bulk["bulk_vs_bare"] is not None, bulk
    assert "HTTP/2 (non-matching toxic): keep-alive request p50 ms" in out.stdout
    assert "HTTP/1.1 download (non-matching toxic): MB/s" in out.stdout


def _ratio_none_only_without_bare_time(line: dict[str, Any], bare_added: list[float]) -> None:
    no_bare = all(added is None or added <= 0 for added in bare_added)
    assert (line["added_vs_bare"] is None) == no_bare, line


def test_the_toxic_check_goes_red_when_a_transfer_through_a_toxic_is_corrupted(
    tmp_path: Path,
) -> None:
    out, doc = bench_json(
        tmp_path, *TINY_TOXIC, "--sabotage", "corrupt", "--rtt-cpu", "none", "--no-socat",
        code=1,
    )  # fmt: skip
    [check] = [c for c in doc["checks"] if c["name"].startswith("toxic lines:")]
    assert check["ok"] is False and "content differs" in check["detail"], check
    assert doc["toxic"]["latency5"]["bulk"]["toxic"]["mbps"] is None  # not counted


def test_a_toxic_size_that_is_not_one_is_a_usage_error() -> None:
    out = run_module("harness.bench", "--toxic-bytes", "lots", timeout=30)
    assert out.returncode == 2 and "not a size" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


# -- the judge ----------------------------------------------------------------------------


def _sides(row: Target) -> list[tuple[float, str]]:
    """A figure on each side of *row*'s bound (and inside a range), with its verdict."""
    if isinstance(row.bound, tuple):
        lo, hi = row.bound
        return [(lo * 0.9, "MISSED"), ((lo + hi) / 2, "MET"), (hi * 1.1, "MISSED")]
    b = row.bound
    better, worse = (b * 1.1, b * 0.9) if row.direction == ">=" else (b * 0.9, b * 1.1)
    return [(better, "MET"), (worse, "MISSED"), (b, "MET")]  # the bound itself is met


ALL_ROWS = TARGETS + TOXIC_TARGETS


@pytest.mark.parametrize("row", ALL_ROWS, ids=[r.name for r in ALL_ROWS])
def test_each_row_is_met_on_its_side_of_the_bound_and_missed_on_the_other(row: Target) -> None:
    facts = Facts({"direct": {}, "socat": {}, "faultnet": {}}, {})
    for value, status in _sides(row):
        fixed = dataclasses.replace(row, figure=lambda f, v=value: Figure(v))
        assert judge(fixed, facts)["status"] == status, (row.name, value)
    unmeasured = dataclasses.replace(row, figure=lambda f: Figure(None, "not run"))
    verdict = judge(unmeasured, facts)
    assert verdict["status"] == "N/A" and verdict["shown"] == "-" and verdict["note"] == "not run"


def _toxic_doc(good: bool) -> dict[str, Any]:
    """A toxic section's figures all inside (or all outside) issues 32's and 33's
    targets."""

    def pick(inside: float, outside: float) -> float:
        return inside if good else outside

    return {
        "latency0": {"added_vs_socat": pick(1.1, 3.09), "one_cpu": True,
                     "rtt": {"socat": {"added_p50_us": 20.0}},
                     "instructions": {"per_rtt": pick(2400, 235410)}},
        "latency5": {"bulk_vs_socat": pick(0.7, 0.11),
                     "paced": {"1000us": {"p50_ms": pick(5.2, 9.6)},
                               "200us": {"p50_ms": pick(5.1, 4.9)}}},
        "slicer": {"bulk_vs_socat": pick(0.12, 0.08)},
        "bandwidth": {"achieved_vs_asked": pick(0.99, 0.89)},
        "after_removal": {"added_vs_fresh": pick(1.05, 2.56)},
        "hop": {"added_vs_bare": pick(1.9, 7.0), "bulk_vs_bare": pick(0.65, 0.29),
                "instructions": {"skipped": "not run"}},
        "redis": {"added_vs_bare": pick(1.8, 2.6)},
        "postgres": {"added_vs_bare": pick(1.5, 3.0)},
        # issue 33's "before": 1.14 M instructions a keep-alive request
        **{name: {"added_vs_bare": pick(2.5, 4.3),
                  "instructions": {"per_rtt": pick(240_000, 1_140_000), "bare_per_rtt": 864}}
           for name in ("http1", "http2")},
        "http_bulk": {"bulk_vs_bare": pick(0.6, 0.3)},
    }  # fmt: skip


@pytest.mark.parametrize("good", [True, False])
def test_the_toxic_rows_read_their_figures_from_the_section(good: bool) -> None:
    """Issue 32's own "before" figures are each MISSED; figures inside the bounds MET."""
    arms = {"direct": {}, "socat": {"bulk": {}}, "faultnet": {}}
    facts = Facts(arms, {}, extra=_toxic_doc(good))
    verdicts = [judge(row, facts) for row in TOXIC_TARGETS]
    assert {v["status"] for v in verdicts} == {"MET" if good else "MISSED"}, verdicts
    assert verdicts[0]["target"].endswith("(all on one CPU)")


def test_without_socat_the_rows_against_it_are_not_judged() -> None:
    facts = Facts({"direct": {}, "socat": {}, "faultnet": {}}, {}, extra=_toxic_doc(False))
    verdicts = {v["target"]: v for v in (judge(row, facts) for row in TOXIC_TARGETS)}
    against_socat = [v for name, v in verdicts.items() if "socat" in name]
    assert len(against_socat) == 3
    assert all(v["note"] == "socat arm skipped" for v in against_socat)


def test_a_row_with_a_direction_the_judge_does_not_know_is_refused() -> None:
    row = Target("x", lambda f: Figure(1.0), 1.0, "==")
    with pytest.raises(ValueError, match="direction"):
        judge(row, Facts({"direct": {}, "socat": {}, "faultnet": {}}, {}))


# -- the HTTP lines' own checks -----------------------------------------------------------


def test_a_download_that_differs_from_the_file_is_not_counted(tmp_path: Path) -> None:
    """The HTTP bulk line's check: what curl got through the proxy is compared with the
    file byte for byte; a file that differs from the one served (here: one byte) fails."""
    exe = _nginx()
    if exe is None or shutil.which("curl") is None:
        pytest.skip("nginx or curl is not installed")
    served = bytes(range(256)) * 4096
    (tmp_path / "bulk").write_bytes(served)
    nginx = Nginx(exe, tmp_path, http2=False)
    try:
        same = tmp_path / "same"
        same.write_bytes(served)
        mbps, why = _fetch(nginx.port, same, len(served))
        assert mbps is not None and mbps > 0 and why == ""
        other = tmp_path / "other"
        other.write_bytes(served[:-1] + b"x")
        assert _fetch(nginx.port, other, len(served)) == (
            None,
            f"content differs ({len(served)} of {len(served)} bytes)",
        )
        assert _fetch(nginx.port, same, len(served) + 1)[0] is None  # a short body
    finally:
        nginx.stop()


@pytest.mark.parametrize("protocol", ["h1", "h2"])
def test_the_keep_alive_client_fails_on_a_status_that_is_not_200(
    tmp_path: Path, protocol: str
) -> None:
    """A request the bench's nginx does not answer 200 (here: no such path) is a failed
    request, not a sample."""
    exe = _nginx()
    if exe is None:
        pytest.skip("nginx is not installed")
    nginx = Nginx(exe, tmp_path, http2=protocol == "h2")
    try:
        ok = run_module("harness.bench._httpclient", protocol, "127.0.0.1", str(nginx.port),
                        "20", "2", timeout=60)  # fmt: skip
        assert ok.returncode == 0 and len(ok.stdout.split()) == 20, ok.stderr
        assert _p50_ms(protocol, nginx.port, 20, 2) is not None
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_httpclient, "PATH", "/no-such-path")
            sock = socket.create_connection(("127.0.0.1", nginx.port))
            with sock, pytest.raises(OSError, match="status"):
                {"h1": _httpclient._h1, "h2": _httpclient._h2}[protocol](sock, "x")()
    finally:
        nginx.stop()
