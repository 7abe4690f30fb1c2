"""Running an experiment in-process from a test, the way its CLI would."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

from harness._report import Result

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
