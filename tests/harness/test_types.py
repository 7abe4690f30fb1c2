"""The experiment API's types hold: mypy --strict on its modules (harness/experiment,
harness/runner) and on the fidelity suite (harness/fidelity), as CI runs it. Their imports are not all typed, so they are followed
silently (their own errors are not this check's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_experiment_api_is_mypy_strict_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent"]
        + ["harness/experiment", "harness/runner", "harness/fidelity"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
