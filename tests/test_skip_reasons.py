"""A skip says why: the reason given to :func:`tests.conftest.require_program` reaches
``pytest -rs`` for a trio test, as it does for a plain one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SAMPLE = """
from contextlib import asynccontextmanager

import trio

from tests.conftest import require_program


@asynccontextmanager
async def server():
    require_program(None, "the sample server")
    yield


async def test_skips_in_a_nursery():
    async with trio.open_nursery():
        async with server():
            pass


def test_skips_plainly():
    require_program(None, "the plain sample server")
"""


def test_pytest_rs_reports_a_trio_tests_skip_reason_and_the_line_that_skipped(
    tmp_path: Path,
) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(_SAMPLE)
    repo = Path(__file__).resolve().parents[1]
    # Skip, not fail (CI), and no options meant for the outer run (PYTEST_ADDOPTS).
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest"]
        + ["-o", "trio_mode=true", "-rs", "--rootdir", str(tmp_path), str(sample)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, done.stdout + done.stderr
    assert all("_pytest" not in line for line in skipped), skipped
    conftest = "conftest.py:"
    trio_line = next(line for line in skipped if "plain" not in line)
    assert "the sample server is not installed" in trio_line, skipped
    assert conftest in trio_line, skipped  # where require_program skipped
