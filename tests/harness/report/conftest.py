"""One real short run for the report tests: the silent-loss pair (the reference bot with
its no-confirm defect vs fixed), run once per session by the pair command as a user
would, its directory kept. Tests that change evidence copy an arm first."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.harness.exputil import BOT, SCALE

SEED = 20261130


@pytest.fixture(scope="session")
def pair_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``--run-dir`` of one kept silent-loss pair (attempt-001-seed-SEED inside)."""
    base = tmp_path_factory.mktemp("report-pair")
    proc = subprocess.run(
        [
            sys.executable, "-m", "harness.pair", "silent_loss",
            "--a", shlex.join([*BOT, "--defect", "no-confirm"]),
            "--b", shlex.join(BOT),
            "--names", "no-confirm,fixed",
            "--time-scale", SCALE,
            "--seed", str(SEED),
            "--keep",
            "--run-dir", str(base),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return base


@pytest.fixture(scope="session")
def pair_dir(pair_base: Path) -> Path:
    return pair_base / f"attempt-001-seed-{SEED}"
