"""The fault layer's types hold: ``mypy --strict`` on every module of ``faultnet/``, as
CI runs it (issue 37 item 2: 72 errors in 21 files before, 0 after). The seams it
guards are typed interfaces: what a connection asks of its proxy (``Host``), what a
toxic stage asks of its connection (``StageHost``), the compiled plane's stub
(``faultnet/planes/_native.pyi``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def strict_errors(*extra: Path) -> str:
    """mypy --strict's report on faultnet (and on *extra* files); "" when clean."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "faultnet", *map(str, extra)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    return "" if done.returncode == 0 else done.stdout


def test_the_fault_layer_is_mypy_strict_clean() -> None:
    assert strict_errors() == ""


def test_the_check_sees_an_untyped_function(tmp_path: Path) -> None:
    # The breakage: a module beside the package with a function that has no types.
    bad = tmp_path / "untyped_example.py"
    bad.write_text("def double(x):\n    return x * 2\n")
    assert "untyped_example.py:1: error: Function is missing a type annotation" in (
        strict_errors(bad)
    )
