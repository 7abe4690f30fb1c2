"""Suite-wide configuration. The fixtures every test may use come from faultnet's pytest
plugin (``faultnet_proxy``, ``faultnet_server``, ...) and the helpers from
:mod:`faultnet.testing`; what is here is only what the suite itself needs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def in_ci() -> bool:
    """CI sets CI=true: there a test whose third-party program is missing fails (the
    .ci/run script installs it), elsewhere it skips with the reason."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_program(path: str | None, what: str) -> str:
    """Return *path*, or skip (outside CI) / fail (in CI) saying *what* is missing."""
    if path:
        return path
    if in_ci():
        pytest.fail(f"{what} is missing; .ci/run installs it")
    pytest.skip(f"{what} is not installed (.ci/run installs it in CI)")


def run_module(module: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``python -m MODULE ARGS`` (this interpreter) to completion, output captured as
    text; ``subprocess.TimeoutExpired`` after *timeout* seconds."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )
