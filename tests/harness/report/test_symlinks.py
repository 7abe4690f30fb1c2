"""The report reads only regular files inside the run directory, reached through real
directories, and says what it skipped: a symbolic link out of the directory (to a file
of secrets, say) is never read, quoted, linked or written through, and a FIFO never
hangs it (issue 24 item 15)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.report import build
from tests import REPO

SECRET = "root:x:0:0:SECRET-LINE-NOT-EVIDENCE"


def outside(tmp_path: Path) -> Path:
    """A directory beside the run's, holding what a link points at."""
    d = tmp_path / "outside"
    d.mkdir(exist_ok=True)
    return d


def arm_copy(pair_dir: Path, tmp_path: Path, name: str = "no-confirm") -> Path:
    dst = tmp_path / "run" / name
    shutil.copytree(pair_dir / name, dst)
    for f in ("report.html", "report.json", "timeline.png", "timeline.svg", "command.txt"):
        (dst / f).unlink(missing_ok=True)
    return dst


def test_a_command_txt_linked_out_is_not_printed_as_the_replay(
    pair_dir: Path, tmp_path: Path
) -> None:
    secret = outside(tmp_path) / "passwd"
    secret.write_text(SECRET + "\n")
    arm = arm_copy(pair_dir, tmp_path)
    (arm / "command.txt").symlink_to(secret)
    built = build(arm)
    run = built.report.runs[0]
    assert SECRET not in run.replay and not run.replay_recorded
    assert "--seed" in run.replay  # rebuilt from result.json instead
    page = built.html.read_text()
    assert SECRET not in page
    assert any(s.startswith("command.txt: a symbolic link") for s in run.skipped), run.skipped
    assert "command.txt: a symbolic link" in page
    assert "command.txt" not in run.files


def test_a_proxy_log_linked_out_is_not_drawn_quoted_or_linked(
    pair_dir: Path, tmp_path: Path
) -> None:
    arm = arm_copy(pair_dir, tmp_path)
    t0 = min(
        json.loads(line)["mono"]
        for line in (arm / "proxy.jsonl").read_text().splitlines()
        if '"fault_applied"' in line
    )
    foreign = outside(tmp_path) / "log.jsonl"
    rec = {"mono": t0 + 0.5, "event": "fault_applied", "proxy": "evil", "mode": "refuse"}
    foreign.write_text(json.dumps(rec) + "\n" + json.dumps({"event": "x", "note": SECRET}) + "\n")
    (arm / "proxy-evil.jsonl").symlink_to(foreign)
    # A directory linked out: nothing under it is read or linked either.
    (outside(tmp_path) / "calls").mkdir()
    shutil.copytree(arm / "calls" / "worker", outside(tmp_path) / "calls" / "other")
    (arm / "calls" / "other").symlink_to(outside(tmp_path) / "calls" / "other")
    built = build(arm)
    run = built.report.runs[0]
    assert {f.proxy for f in run.faults} == {"proxy"}
    assert run.lane("proxy:evil") is None and run.lane("bot:other") is None
    assert not any(f.startswith(("proxy-evil", "calls/other")) for f in run.files), run.files
    page = built.html.read_text()
    assert SECRET not in page and "proxy-evil.jsonl" in page
    reasons = dict(s.split(": ", 1) for s in run.skipped)
    assert reasons["proxy-evil.jsonl"].startswith("a symbolic link")
    assert reasons["calls/other"].startswith("a symbolic link")


def test_a_fifo_is_skipped_not_read(pair_dir: Path, tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: it must never be opened.
    Run as a subprocess with a bound, so a hang is a failure rather than a stuck suite."""
    arm = arm_copy(pair_dir, tmp_path)
    os.mkfifo(arm / "proxy-fifo.jsonl")
    os.mkfifo(arm / "observer-copy.stderr")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.report", str(arm), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr  # the no-confirm arm fails its check
    assert "proxy-fifo.jsonl: not a regular file, not read" in proc.stderr
    (doc,) = json.loads(proc.stdout)["reports"]
    assert "proxy-fifo.jsonl: not a regular file, not read" in doc["skipped"]


def test_an_output_file_linked_out_is_replaced_not_written_through(
    pair_dir: Path, tmp_path: Path
) -> None:
    arm = arm_copy(pair_dir, tmp_path)
    victim = outside(tmp_path) / "bashrc"
    victim.write_text("keep me\n")
    for name in ("report.html", "report.json", "timeline.png", "timeline.svg"):
        (arm / name).symlink_to(victim)
    build(arm)
    assert victim.read_text() == "keep me\n"
    for name in ("report.html", "report.json", "timeline.png", "timeline.svg"):
        assert not (arm / name).is_symlink() and (arm / name).stat().st_size > 0


def test_a_pair_arm_linked_out_is_not_an_arm(pair_dir: Path, tmp_path: Path) -> None:
    pair = tmp_path / "pair"
    shutil.copytree(pair_dir, pair)
    shutil.move(pair / "fixed", outside(tmp_path) / "fixed")
    (pair / "fixed").symlink_to(outside(tmp_path) / "fixed")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.report", str(pair)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("fixed: a symbolic link, not read"), (
        proc.stderr
    )
