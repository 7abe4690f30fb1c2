"""Running an experiment in-process from a test, the way its CLI would."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.experiment import Context, Result
from tests import REPO

#: The reference bot, fixed; add ``"--defect", NAME`` for a defect arm.
BOT = [sys.executable, "-m", "harness.bot"]
#: Small enough that CI runs each experiment in seconds.
SCALE = "0.02"


async def run_experiment(
    exp: ModuleType, tmp_path: Path, bot: list[str], *args: str
) -> tuple[int, Result]:
    """Run *exp* against *bot* on a private environment; return (exit code, attempt 1)."""
    out = tmp_path / "out.json"
    code = await exp.amain(
        [
            "--bot-bin", shlex.join(bot),
            "--env", "auto",
            "--time-scale", SCALE,
            "--run-dir", str(tmp_path / "runs"),
            "--out", str(out),
            *args,
        ]
    )  # fmt: skip
    return code, Result.from_json(json.loads(out.read_text())["attempts"][0])


def run_json_command(
    args: list[str], *, code: int, timeout: float, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``python ARGS`` (a ``--json`` command) from the repo root, bounded by *timeout*;
    assert it exited *code* (showing its stderr's tail if not) and return the process and
    its last stdout line parsed as JSON (the document; progress goes to stderr)."""
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.returncode == code, proc.stderr[-4000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


def fake_experiment(run: Callable[[Context], Awaitable[None]], extra: str) -> ModuleType:
    """An experiment module with no bot: *run* fills the result, so the runner's plumbing
    can be seen end to end; it takes one flag, ``--extra`` (default *extra*)."""
    mod = ModuleType("fake_exp")
    mod.NAME = "fake"  # type: ignore[attr-defined]
    mod.DESCRIPTION = "fake experiment"  # type: ignore[attr-defined]
    mod.MAX_REAL_S = 30.0  # type: ignore[attr-defined]

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--extra", default=extra)

    mod.add_arguments = add_arguments  # type: ignore[attr-defined]
    mod.run = run  # type: ignore[attr-defined]
    return mod
