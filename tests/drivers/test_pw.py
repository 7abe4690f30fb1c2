"""``pw``, the per-call recorder: real commands in real processes, records read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from faultnet.eventlog import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
PW = [sys.executable, "-m", "drivers.pw"]


def _env(log_dir: Path, agent: str = "tester") -> dict[str, str]:
    return {
        **os.environ,
        "FAULTNET_CALL_LOG_DIR": str(log_dir),
        "FAULTNET_AGENT": agent,
        "PYTHONPATH": str(ROOT),
    }


def _pw(log_dir: Path, *command: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PW, "--", *command],
        env=_env(log_dir),
        capture_output=True,
        text=True,
        timeout=30,
        **kwargs,
    )


def _records(log_dir: Path, agent: str = "tester") -> list[dict]:
    path = log_dir / f"{agent}.jsonl"
    lines = path.read_text().splitlines()
    read = read_jsonl(path)
    assert read.unreadable == [] and len(read.records) == len(lines)
    return read.records


def test_passes_output_and_exit_code_through_and_records_the_call(tmp_path: Path) -> None:
    r = _pw(tmp_path, "sh", "-c", "echo out; echo problem >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "problem\n")
    (rec,) = _records(tmp_path)
    assert rec["agent"] == "tester" and rec["tool"] == "sh"
    assert rec["argv"] == "sh -c echo out; echo problem >&2; exit 3"
    assert (rec["exit"], rec["sigpipe"], rec["ok"], rec["stderr"]) == (3, False, False, "problem\n")
    assert rec["at"].endswith("Z") and 0 <= rec["secs"] < 30


def test_exit_141_is_recorded_as_sigpipe_and_not_as_a_failure(tmp_path: Path) -> None:
    r = _pw(tmp_path, "sh", "-c", "exit 141")
    assert r.returncode == 141
    # The real shape: the reader (here, this test) closes the pipe after one line and
    # `yes` dies of SIGPIPE; pw reports it as a shell would, 128 + 13.
    proc = subprocess.Popen([*PW, "--", "yes"], env=_env(tmp_path), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"y\n"
    proc.stdout.close()
    assert proc.wait(timeout=30) == 141
    recs = _records(tmp_path)
    assert [(r["tool"], r["exit"], r["sigpipe"], r["ok"]) for r in recs] == [
        ("sh", 141, True, True),
        ("yes", 141, True, True),
    ]


def test_a_multi_line_argument_is_recorded_on_one_line(tmp_path: Path) -> None:
    message = "first line\nsecond\tline\r\nthird"
    r = _pw(tmp_path, "printf", "%s", message)
    assert r.returncode == 0 and r.stdout == message.replace("\r\n", "\n")  # intact (text mode)
    raw = (tmp_path / "tester.jsonl").read_text()
    assert raw.count("\n") == 1 and "\t" not in raw
    (rec,) = _records(tmp_path)
    assert rec["argv"] == "printf %s first line second line  third"


def test_the_stderr_tail_is_bounded(tmp_path: Path) -> None:
    r = _pw(tmp_path, sys.executable, "-c", "import sys; sys.stderr.write('x' * 100000 + 'END')")
    assert r.returncode == 0 and len(r.stderr) == 100003  # passed through whole
    (rec,) = _records(tmp_path)
    assert len(rec["stderr"]) == 2048 and rec["stderr"].endswith("xEND")


def test_not_found_usage_and_help(tmp_path: Path) -> None:
    r = _pw(tmp_path, "/nonexistent/tool", "arg")
    assert r.returncode == 127 and r.stderr == "pw: /nonexistent/tool: command not found\n"
    assert _records(tmp_path)[0]["exit"] == 127
    r = subprocess.run([*PW], env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.endswith("pw: error: no COMMAND given\n")
    r = subprocess.run(
        [str(ROOT / "scripts" / "pw"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and "sort_by(-.secs)" in r.stdout


def test_a_file_that_cannot_be_executed_is_126_and_recorded(tmp_path: Path) -> None:
    # Executable but no format this system runs (ENOEXEC): a shell says 126; pw was an
    # OSError traceback, exit 1, and no record.
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELFnot-really")
    garbage.chmod(0o755)
    r = _pw(tmp_path, str(garbage))
    assert r.returncode == 126, r.stderr
    assert r.stderr == f"pw: {garbage}: Exec format error\n"
    assert _records(tmp_path)[0]["exit"] == 126


def test_without_a_log_dir_it_runs_and_records_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)
    del env["FAULTNET_CALL_LOG_DIR"]
    r = subprocess.run(
        [str(ROOT / "scripts" / "pw"), "true"], env=env, capture_output=True, timeout=30
    )
    assert r.returncode == 0 and os.listdir(tmp_path) == []


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    """Four shells, each calling pw six times at once on one agent's file, each record
    larger than PIPE_BUF (a 3000-byte argument and a 2048-byte stderr tail)."""
    writers, calls = 4, 6
    script = (
        f'for i in $(seq {calls}); do "$@" sh -c \'printf "%03000d" 0 >&2\' "w$W-$i-'
        + "y" * 3000
        + '" 2>/dev/null; done'
    )
    procs = [
        subprocess.Popen(["sh", "-c", script, "sh", *PW, "--"], env={**_env(tmp_path), "W": str(w)})
        for w in range(writers)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0
    recs = _records(tmp_path)
    assert len(recs) == writers * calls
    seen = sorted(r["argv"].split(" ")[-1].split("-y")[0] for r in recs)
    assert seen == sorted(f"w{w}-{i}" for w in range(writers) for i in range(1, calls + 1))
    assert all(len(json.dumps(r)) > 4096 for r in recs)


def test_an_argument_that_is_not_utf8_passes_its_exit_code_and_is_recorded_escaped(
    tmp_path: Path,
) -> None:
    # The kernel's argv is bytes: `pw -- /bin/sh -c 'exit 3' $'\xff'` crashed with
    # UnicodeEncodeError (exit 1, no record) writing the record.
    r = subprocess.run(
        [*PW, "--", "/bin/sh", "-c", "exit 3", b"\xff-caf\xc3\xa9"],
        env=_env(tmp_path),
        capture_output=True,
        timeout=30,
    )
    assert (r.returncode, r.stderr) == (3, b"")
    (rec,) = _records(tmp_path)
    assert rec["argv"] == "/bin/sh -c exit 3 \\xff-café"
    assert rec["exit"] == 3


def test_unicode_line_ends_are_escaped_so_a_record_is_one_line_for_every_reader(
    tmp_path: Path,
) -> None:
    ends = "a\u2028b\u2029c\u0085d\x0be\x1cf"
    r = _pw(tmp_path, sys.executable, "-c", "import sys; sys.stderr.write(sys.argv[1])", ends)
    assert r.returncode == 0
    raw = (tmp_path / "tester.jsonl").read_text(encoding="utf-8")
    assert len(raw.splitlines()) == 1, raw
    (rec,) = _records(tmp_path)
    assert rec["stderr"] == ends  # escaped on the line, intact once decoded
    assert rec["argv"].endswith(ends)
