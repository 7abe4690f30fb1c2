"""One real short run for the report tests: the silent-loss pair (the reference bot with
its no-confirm defect vs fixed), run once per session by the pair command as a user
would, its directory kept. Tests that change evidence copy an arm first.

What the run produced and what it concluded are two fixtures, so that a run that ends
with another verdict fails only the tests that read the verdict: under load (~10 on 2
CPUs) a fixed arm once failed a check, and the fixture's one assertion turned that into
30 errors, most of them in tests that only read the run's files. ``pair_base`` and
``pair_dir`` need only the files (both arms' records); ``pair_verdict`` needs the pair
to have passed, and fails, with the pair's output, in the tests that ask for it."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import REPO
from tests.harness.exputil import BOT, SCALE

SEED = 20261130
ARMS = ("no-confirm", "fixed")
#: The pair's bound: it took 10-21 s here at load 4-6 on 2 CPUs (setup of its first user).
PAIR_TIMEOUT_S = 110


@dataclass(frozen=True)
class PairRun:
    """The kept pair: its ``--run-dir``, its exit code (None: killed at the bound) and
    the tail of what it printed."""

    base: Path
    code: int | None
    output: str

    @property
    def attempt(self) -> Path:
        return self.base / f"attempt-001-seed-{SEED}"

    def complete(self) -> bool:
        """Both arms' records are there (whatever the verdict)."""
        return all((self.attempt / arm / "result.json").is_file() for arm in ARMS)


@pytest.fixture(scope="session")
def pair_run(tmp_path_factory: pytest.TempPathFactory) -> PairRun:
    """The pair, run once; never fails itself (its users judge what they need of it)."""
    base = tmp_path_factory.mktemp("report-pair")
    argv = [
        sys.executable, "-m", "harness.pair", "silent_loss",
        "--a", shlex.join([*BOT, "--defect", "no-confirm"]),
        "--b", shlex.join(BOT),
        "--names", ",".join(ARMS),
        "--time-scale", SCALE,
        "--seed", str(SEED),
        "--keep",
        "--run-dir", str(base),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO, timeout=PAIR_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-3000:], (exc.stderr or b"")[-3000:]
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in out)
        return PairRun(base, None, f"killed after {PAIR_TIMEOUT_S} s\n{text}")
    return PairRun(base, proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:])


@pytest.fixture(scope="session")
def pair_base(pair_run: PairRun) -> Path:
    """The ``--run-dir`` of one kept silent-loss pair (attempt-001-seed-SEED inside),
    both arms recorded; its verdict may be anything (see ``pair_verdict``)."""
    assert pair_run.complete(), (
        f"the pair left no complete run (exit {pair_run.code}):\n{pair_run.output}"
    )
    return pair_run.base


@pytest.fixture(scope="session")
def pair_dir(pair_base: Path) -> Path:
    return pair_base / f"attempt-001-seed-{SEED}"


@pytest.fixture
def pair_verdict(pair_run: PairRun, pair_dir: Path) -> Path:
    """``pair_dir``, for a test that reads the pair's verdict: the pair passed (the
    no-confirm arm failed, the fixed arm passed), or this test fails saying so."""
    assert pair_run.code == 0, (
        f"the pair's verdict was not PASS (exit {pair_run.code}); this test reads it:\n"
        f"{pair_run.output}"
    )
    return pair_dir
