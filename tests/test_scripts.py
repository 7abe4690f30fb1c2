"""The shell scripts in scripts/ run on the interpreter faultnet is installed in, not on
whatever `python3` PATH has (scripts/_python.sh): on stock Debian that one has no trio,
and the README's test command failed there, every time, in the two tests that ran
scripts/bench and scripts/env-up.sh (CI passed only because its python3 had trio).

Each test here runs a script as on such a machine: `python3` and `python` on PATH are an
interpreter that cannot import trio (``bare_python_env``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.conftest import bare_python_env


def in_a_venv() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite runs outside a virtual environment")


def run(argv: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environ)


def checkout_copy(tmp_path: Path, *, venv: bool) -> Path:
    """A checkout of this tree (scripts copied, packages linked), with a `.venv` whose
    python is this suite's interpreter when *venv*: the README's layout when no virtual
    environment is active."""
    co = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", co / "scripts")
    for pkg in ("faultnet", "harness", "drivers"):
        (co / pkg).symlink_to(REPO / pkg)
    if venv:
        (co / ".venv" / "bin").mkdir(parents=True)
        py = co / ".venv" / "bin" / "python"
        py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        py.chmod(0o755)
    return co


def test_scripts_use_the_active_virtual_environment(tmp_path: Path) -> None:
    in_a_venv()
    environ = {**bare_python_env(tmp_path), "VIRTUAL_ENV": sys.prefix}
    r = run([str(REPO / "scripts" / "bench"), "--help"], environ)
    assert r.returncode == 0 and "--quick" in r.stdout, r.stderr
    r = run([str(REPO / "scripts" / "demo"), "--help"], environ)
    assert r.returncode == 0 and "silent" in r.stdout, r.stderr


def test_scripts_use_the_checkouts_venv(tmp_path: Path) -> None:
    # The README's command with no environment active: `"$V/bin/python" -m pytest` with
    # V=.venv, so the scripts' children see no VIRTUAL_ENV at all.
    co = checkout_copy(tmp_path, venv=True)
    r = run([str(co / "scripts" / "bench"), "--help"], bare_python_env(tmp_path))
    assert r.returncode == 0 and "--quick" in r.stdout, r.stderr


def test_no_usable_python_is_one_line_and_exit_2(tmp_path: Path) -> None:
    co = checkout_copy(tmp_path, venv=False)
    environ = bare_python_env(tmp_path)
    for script in ("bench", "env-up.sh", "demo"):
        r = run([str(co / "scripts" / script), "--help"], environ)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r
        assert r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"scripts/{script}: error: no Python here can import")
        assert "PYTHON=" in r.stderr and "activate" in r.stderr
    # $PYTHON names one outright.
    environ["PYTHON"] = sys.executable
    r = run([str(co / "scripts" / "bench"), "--help"], environ)
    assert r.returncode == 0 and "--quick" in r.stdout, r.stderr


def test_memcheck_help_and_usage() -> None:
    # --help was an unknown mode: usage on stderr and exit 2.
    r = run([str(REPO / "scripts" / "memcheck"), "--help"], dict(os.environ))
    assert r.returncode == 0 and "AddressSanitizer" in r.stdout, r
    assert "Example: scripts/memcheck" in r.stdout
    r = run([str(REPO / "scripts" / "memcheck"), "nosuch"], dict(os.environ))
    assert r.returncode == 2 and r.stderr.startswith("usage: scripts/memcheck"), r


def test_bench_report_runs_again_on_the_installed_python(tmp_path: Path) -> None:
    # Its shebang's python3 is the bare one here: it found no matplotlib and failed.
    in_a_venv()
    environ = {**bare_python_env(tmp_path), "VIRTUAL_ENV": sys.prefix}
    r = run([str(REPO / "scripts" / "bench-report"), str(tmp_path / "missing")], environ)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r
    assert "not a directory" in r.stderr and "Traceback" not in r.stderr
