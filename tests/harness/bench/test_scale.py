"""The bench's scale lines (issue 36, item 5): a tiny run prints every line and every
target (N/A at sizes other than the targets'), the rows read their figures from the
section, and the levels are capped by the descriptor limit. No speed is asserted: the
bench measures it, tests never require it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from harness.bench._scale import connection_cap
from harness.bench._scale_targets import SCALE_TARGETS
from harness.bench._targets import TARGETS, Facts, Figure, Target, judge
from tests.conftest import run_module
from tests.harness.bench.runs import bench_json

# Only the scale section beside the lines every run has, at tiny sizes.
TINY_SCALE = [
    "--bytes", "1M", "--pings", "100", "--connections", "10", "--rounds", "1",
    "--freeze-window", "0.05", "--requests", "0", "--churn", "0", "--loss-bytes", "0",
    "--datagrams", "0", "--callgrind", "0", "--toxic-bytes", "0", "--rtt-cpu", "none",
    "--no-socat", "--scale", "3", "--scale-connections", "10,20",
]  # fmt: skip


def test_a_tiny_run_prints_every_scale_line_with_its_target(tmp_path: Path) -> None:
    out, doc = bench_json(tmp_path, *TINY_SCALE)
    scale = doc["scale"]
    assert doc["params"]["scale"] == 3 and doc["params"]["scale_connections"] == [10, 20]
    px = scale["proxies"]
    assert px["proxies"] == 3 and px["create_s"] > 0 and px["get_proxies_p50_ms"] > 0
    assert px["threads"] >= 1 and px["rss_mib"] > 0
    levels = scale["connections"]["levels"]
    assert [lv["connections"] for lv in levels] == [10, 20]
    for lv in levels:
        assert lv["freeze_p50_ms"] > 0 and lv["faults_p50_ms"] > 0
        assert lv["toxic_add_first_ms"] > 0 and lv["toxic_remove_first_ms"] > 0
    assert [lv["connections"] for lv in scale["idle"]["levels"]] == [10, 20]
    checks = {c["name"]: c["ok"] for c in doc["checks"]}
    assert checks["scale lines: every API answer was a success, every freeze total"] is True
    rows = doc["targets"][len(TARGETS) :]
    assert len(rows) == len(SCALE_TARGETS) == 11
    for t in rows:
        assert t["status"] == "N/A" and "judged at" in t["note"], t  # not the targets' sizes
        assert f"{t['status']:6}  {t['target']}: {t['shown']}" in out.stdout
    assert "scale lines (faultnet servers" in out.stdout
    assert "10 connections: freeze p50" in out.stdout
    assert "RSS per idle connection, KiB" in out.stdout


def test_the_levels_are_capped_by_the_descriptor_limit() -> None:
    assert connection_cap(20_000, 1) == 9249  # issue 36's machine: 9,000 fits
    assert connection_cap(4096, 1) == 1297
    assert connection_cap(1024, 1) == 0


@pytest.mark.parametrize("text", ["lots", "5000,1000"])
def test_levels_that_are_not_increasing_counts_are_a_usage_error(text: str) -> None:
    out = run_module("harness.bench", "--scale", "1", "--scale-connections", text, timeout=30)
    assert out.returncode == 2 and "--scale-connections" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


# -- the rows -----------------------------------------------------------------------------


def _doc(good: bool, proxies: int = 1000, top: int = 9000) -> dict[str, Any]:
    """A scale section's figures all inside (or all outside) issue 36's targets."""

    def pick(inside: float, outside: float) -> float:
        return inside if good else outside

    return {
        "connection_cap": 9249,
        "proxies": {"proxies": proxies, "rss_mib": pick(30, 333), "create_s": pick(0.5, 3.9),
                    "get_proxies_p50_ms": pick(3, 15.2), "toxic_add_p50_ms": pick(0.2, 1.54),
                    "toxic_remove_p50_ms": pick(0.2, 1.05)},
        "connections": {"levels": [
            {"connections": 1000, "freeze_p50_ms": 1.0},
            {"connections": top, "toxic_add_first_ms": pick(150, 683),
             "toxic_add_again_ms": pick(150, 1305), "toxic_remove_first_ms": pick(190, 3202),
             "freeze_p50_ms": pick(40, 206), "faults_p50_ms": pick(1, 154)},
        ]},
        "idle": {"levels": [{"connections": top, "rss_per_connection_kib": pick(4.4, 6.5)}]},
    }  # fmt: skip


def _facts(doc: dict[str, Any]) -> Facts:
    return Facts({"direct": {}, "socat": {}, "faultnet": {}}, {}, extra=doc)


@pytest.mark.parametrize("good", [True, False])
def test_the_scale_rows_read_their_figures_from_the_section(good: bool) -> None:
    """Issue 36's own "before" figures are each MISSED; figures inside the bounds MET."""
    verdicts = [judge(row, _facts(_doc(good))) for row in SCALE_TARGETS]
    assert {v["status"] for v in verdicts} == {"MET" if good else "MISSED"}, verdicts


def test_at_other_sizes_the_rows_show_their_figures_unjudged() -> None:
    verdicts = [judge(row, _facts(_doc(True, proxies=10, top=5000))) for row in SCALE_TARGETS]
    assert all(v["status"] == "N/A" and v["value"] is not None for v in verdicts), verdicts
    assert "at 10 proxies: judged at 1,000" in verdicts[0]["note"]
    assert "descriptor limit allows 9,249" in verdicts[-1]["note"]
    assert verdicts[-1]["target"].endswith("(at 5,000 connections)")


@pytest.mark.parametrize("row", SCALE_TARGETS, ids=[r.name for r in SCALE_TARGETS])
def test_each_scale_row_is_met_below_its_bound_and_missed_above(row: Target) -> None:
    assert isinstance(row.bound, float | int)
    for value, status in (
        (row.bound * 0.9, "MET"),
        (row.bound, "MET"),
        (row.bound * 1.1, "MISSED"),
    ):
        fixed = dataclasses.replace(row, figure=lambda f, v=value: Figure(v))
        assert judge(fixed, _facts({}))["status"] == status, (row.name, value)
