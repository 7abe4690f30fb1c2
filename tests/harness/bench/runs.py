"""One bench run from the tests: ``python -m harness.bench ARGS --json FILE``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import run_module


def bench_json(
    tmp_path: Path, *args: str, code: int = 0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A bench run with *args* and its JSON document (written in *tmp_path*), once the
    run exited *code* (its stderr the message otherwise)."""
    out_path = tmp_path / "bench.json"
    out = run_module("harness.bench", *args, "--json", str(out_path), timeout=100)
    assert out.returncode == code, out.stderr
    doc: dict[str, Any] = json.loads(out_path.read_text())
    return out, doc
