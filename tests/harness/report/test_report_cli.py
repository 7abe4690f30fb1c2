"""`faultnet report RUN_DIR` (here `python -m harness.report`, the same command: the
entry point reaches it only after a reinstall): exit codes, one-line errors, --json."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.report import cli
from tests import REPO


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.report", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_pair_directory_rebuilds_and_exits_with_its_verdict(pair_dir: Path) -> None:
    proc = report(str(pair_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)["reports"]
    assert doc["kind"] == "pair" and doc["passed"]
    assert doc["verdicts"]["fixed"] == "PASS"
    assert doc["verdicts"]["no-confirm"].startswith("FAIL")
    assert doc["posts"]["silent_loss"] >= 1 and doc["posts"]["unconfirmed"] >= 1
    assert Path(doc["report"]).is_file()


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_failing_arm_exits_1_and_a_run_dir_base_builds_each_attempt(
    pair_base: Path, pair_dir: Path
) -> None:
    proc = report(str(pair_dir / "no-confirm"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("FAIL: ")
    assert f"report: {pair_dir / 'no-confirm' / 'report.html'}" in proc.stdout
    # The --run-dir base: one report per attempt inside.
    proc = report(str(pair_base))
    assert proc.returncode == 0, proc.stderr
    assert f"report: {pair_dir / 'report.html'}" in proc.stdout


def test_not_a_run_directory_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "something.txt").write_text("not evidence")
    for target in (tmp_path, tmp_path / "missing"):
        proc = report(str(target))
        assert proc.returncode == 2
        assert proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert "not a" in proc.stderr
    assert report("--help").returncode == 0
    assert report().returncode == 2


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_the_command_registers_as_faultnet_report(pair_dir: Path) -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["faultnet.commands"]["report"] == "harness.report.cli:register"
    parser = argparse.ArgumentParser(prog="faultnet")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(pair_dir), "--json"])
    assert args.func(args) == 0
