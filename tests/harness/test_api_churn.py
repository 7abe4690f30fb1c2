"""The bench line for the control plane under churn: it runs, and reports what it
measured in the shape the benchmark's report takes (the targets are judged by the bench
run itself, on a quiet machine, not here)."""

from __future__ import annotations

import json

from tests.conftest import run_module


def test_the_churn_bench_reports_api_latency_failures_and_the_churn_rate() -> None:
    done = run_module(
        "harness.api_churn", "--seconds", "1.5", "--workers", "1", "--json", timeout=120
    )
    assert done.returncode in (0, 1), done.stderr  # 1: a target missed on a busy machine
    result = json.loads(done.stdout)
    assert result["connections_per_s"] > 0 and result["churn_failures"] == 0
    assert result["requests"] > 0 and result["failed"] == len(result["failures"])
    assert 0 < result["version_p50_ms"] <= result["version_p99_ms"]
    assert 0 < result["toxic_p50_ms"] <= result["toxic_p99_ms"]
    assert result["met"] == (
        result["failed"] == 0 and max(result["version_p99_ms"], result["toxic_p99_ms"]) <= 20
    )


def test_usage_errors_are_one_line_and_exit_2() -> None:
    done = run_module("harness.api_churn", "--seconds", "-1")
    assert done.returncode == 2 and "--seconds" in done.stderr
    assert "Traceback" not in done.stderr
