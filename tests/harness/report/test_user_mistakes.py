"""User mistakes on the report's front doors: `faultnet report` (here `python -m
harness.report`, the same command) and `scripts/bench-report`. Each is one line on
stderr and exit 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bench_report_on_a_missing_or_empty_directory(tmp_path: Path) -> None:
    script = str(REPO / "scripts" / "bench-report")
    assert_one_line_exit_2(run(script, str(tmp_path / "missing"), "-n", "1"), "not a directory")
    assert_one_line_exit_2(run(script, str(tmp_path), "-n", "1"), "not a run directory")
    # A usage error is argparse's, as in every command: usage, then the one error line.
    proc = run(script, str(tmp_path), "-n", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.splitlines()[-1]
        == "bench-report: error: argument -n: at least 1 warm build, not 0"
    )


def copied(src: Path, dst: Path) -> Path:
    """*dst*, made a copy of the tree *src*."""
    shutil.copytree(src, dst)
    return dst


def copy_arm(pair_dir: Path, tmp_path: Path, name: str = "fixed") -> Path:
    return copied(pair_dir / name, tmp_path / name)


#: result.json documents of the wrong shape, and a word the one line must say.
BAD_RESULTS = [
    ("[1, 2]", "object"),
    ('{"checks": "x"}', "checks"),
    ('{"checks": [{"passed": false}]}', "checks"),
    ('{"details": []}', "details"),
    ('{"details": {"posts": 3}}', "details"),
    ('{"time_scale": "x"}', "time_scale"),
    ('{"seed": "five"}', "seed"),
    ('{"headline": [1]}', "headline"),
    ('{"controls": [1]}', "controls"),
    ('{"bot_argv": "python -m bot"}', "bot_argv"),
    ('{"error": 3}', "error"),
]


def test_report_on_a_verdict_json_of_the_wrong_shape(pair_dir: Path, tmp_path: Path) -> None:
    arm = copy_arm(pair_dir, tmp_path)
    (arm / "verdict.json").write_text('{"ok": true, "checks": "all"}')
    assert_one_line_exit_2(run("-m", "harness.report", str(arm)), "verdict.json", "checks")


def test_a_truncated_result_json_is_still_drawn_with_a_note(pair_dir: Path, tmp_path: Path) -> None:
    """Not JSON at all is what a killed writer leaves: drawn from the rest, and said."""
    arm = copy_arm(pair_dir, tmp_path)
    (arm / "result.json").write_text('{"experiment": "silent_lo')
    proc = run("-m", "harness.report", str(arm), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads((arm / "report.json").read_text())
    assert any("result.json" in n for n in doc["runs"][0]["notes"])


BAD_PAIRS = [
    ("[]", "object"),
    ('{"names": "ab"}', "names"),
    ('{"names": []}', "names"),
    ('{"names": ["../../etc"]}', "names"),
    ('{"names": ["no-confirm", "fixed"], "outcome": []}', "outcome"),
    ('{"names": ["no-confirm", "fixed"], "outcome": {"drifts": [1]}}', "drifts"),
    ('{"names": ["no-confirm", "fixed"], "verdict": "x"}', "verdict"),
    ('{"names": ["no-confirm", "fixed"], "verdict": [true]}', "verdict"),
    ('{"names": ["no-confirm", "fixed"], "command": 7}', "command"),
    ('{"names": ["no-confirm", "fixed"], "title": ["t"]}', "title"),
]


@pytest.mark.parametrize(
    "name,doc,word",
    [("result.json", *row) for row in BAD_RESULTS] + [("pair.json", *row) for row in BAD_PAIRS],
)
def test_report_on_an_evidence_file_of_the_wrong_shape(
    pair_dir: Path, tmp_path: Path, name: str, doc: str, word: str
) -> None:
    """An arm's result.json or a pair's pair.json of the wrong shape: one line naming
    the file and the field, exit 2."""
    run_dir = (
        copy_arm(pair_dir, tmp_path)
        if name == "result.json"
        else copied(pair_dir, tmp_path / "pair")
    )
    (run_dir / name).write_text(doc)
    assert_one_line_exit_2(run("-m", "harness.report", str(run_dir)), name, word)
