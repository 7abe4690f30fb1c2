"""Every ``faultnet`` call registers every command, so registering must import nothing
heavy: a command's handler imports what it needs when it runs. Measured on this tree
(20 whole-process runs each, medians): ``--version`` 0.63 s -> 0.19 s, ``--help``
1.01 s -> 0.15 s, ``proxies`` 1.18 s -> 0.18 s. Guarded here without timing: the
modules a command loads are listed after it ran, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import REPO

#: What no command's registration may import: the event loop, the HTTP server stack,
#: the proxy, the plotting library and the harness's experiment machinery.
HEAVY = (
    "trio",
    "starlette",
    "hypercorn",
    "faultnet.proxy",
    "faultnet.controltest",
    "faultnet.server.api",
    "matplotlib",
    "harness._runner",
    "harness.env",
    "harness.pair",
)

_SCRIPT = """
import contextlib, io, json, sys
from faultnet.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["--help"],
        ["server", "--help"],
        ["chaos", "--help"],
        ["proxies", "--api", "http://127.0.0.1:1"],  # refused: one line, exit 2
    ],
)
def test_a_command_that_needs_no_event_loop_imports_none_of_the_heavy_modules(
    argv: list[str],
) -> None:
    loaded = _modules_after(*argv)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
    assert heavy == [], f"faultnet {' '.join(argv)} imported {heavy}"


def test_the_help_still_lists_every_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faultnet", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    for command in ("proxy", "probe", "server", "proxies", "toxic", "fault", "chaos"):
        assert f"    {command} " in done.stdout or f"    {command}\n" in done.stdout, command
