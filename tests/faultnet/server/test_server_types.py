"""The server's API, CLI, client, OpenAPI and metrics modules are mypy --strict clean
(issue 37 item 2, for the files of the server's face). Imports are followed silently:
their own errors are not this check's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "faultnet/server/api.py",
    "faultnet/server/cli.py",
    "faultnet/server/client.py",
    "faultnet/server/openapi.py",
    "faultnet/server/metrics.py",
    "faultnet/cli_proxy.py",
]


def test_the_servers_face_is_mypy_strict_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", *MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
