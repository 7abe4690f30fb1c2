"""The battery of user mistakes (issue 24): every public command answers ``--help``
with exit 0, and an unknown option or a missing file with exit 2, never a traceback.

The commands are read from the ``faultnet`` argparse tree itself (every subcommand,
nested ones included) and from the modules run as ``python -m``; a command added later
is covered without editing this file (the list is checked to be non-trivial)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultnet.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
MISSING = "/nonexistent/faultnet-battery"

#: The modules that are commands of their own (``python -m MODULE``).
MODULES = [
    "drivers.mcp",
    "drivers.pw",
    "harness.api_churn",
    "harness.bench",
    "harness.enclave",
    "harness.env",
    "harness.exp_chatty_vs_silent",
    "harness.exp_confirm_latency",
    "harness.exp_fd_flatness",
    "harness.exp_silent_loss",
    "harness.fidelity",
    "harness.fleet",
    "harness.fleet_verify",
    "harness.pair",
    "harness.report",
]


def _faultnet_commands() -> list[list[str]]:
    found: list[list[str]] = [[]]

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


FAULTNET = _faultnet_commands()


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-2000:]


def test_the_battery_covers_every_faultnet_command() -> None:
    names = {" ".join(c) for c in FAULTNET}
    assert {"proxy control-test", "server", "fault", "toxic add", "chaos", "report"} <= names


COMMANDS = [[sys.executable, "-m", "faultnet", *c] for c in FAULTNET] + [
    [sys.executable, "-m", m] for m in MODULES
]
IDS = [" ".join(c[2:]) or "faultnet" for c in COMMANDS]


@pytest.mark.parametrize("argv", COMMANDS, ids=IDS)
def test_help_is_exit_0_and_an_unknown_option_is_exit_2(argv: list[str]) -> None:
    done = _run([*argv, "--help"])
    _no_traceback(done)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "--help printed nothing"
    done = _run([*argv, "--no-such-option-at-all"])
    _no_traceback(done)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "faultnet", "report", MISSING],
        ["-m", "faultnet", "chaos", "run", "--process", "x", "--pids", MISSING],
        ["-m", "faultnet", "chaos", "run", "--target", "db", "--duration", "1"],
        ["-m", "faultnet", "chaos", "plan", "--duration", "1e400", "--target", "db"],
        ["-m", "faultnet", "server", "--token", ""],
        ["-m", "faultnet", "server", "--token-file", MISSING],
        ["-m", "harness.fleet_verify", MISSING],
        ["-m", "harness.fidelity", "--mode", "no-such-mode"],
        # Said before any request is made: no server is needed to be told.
        ["-m", "faultnet", "fault", "p", "loss", "--both-ways", "--stream", "upstream"],
        ["-m", "faultnet", "fault", "p", "freeze", "--both-ways"],
        ["-m", "harness.fleet", "--chaos-plan", MISSING],
        ["-m", "harness.enclave", "--port", "99999", "--state", "STATE"],
        ["-m", "harness.enclave", "--port", "-1", "--state", "STATE"],
    ],
    ids=lambda a: " ".join(a[1:]),
)
def test_a_missing_file_or_a_bad_value_is_one_line_and_exit_2(
    args: list[str], tmp_path: Path
) -> None:
    args = [str(tmp_path / "state.db") if a == "STATE" else a for a in args]
    done = _run([sys.executable, *args])
    _no_traceback(done)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip(), "no word of what was wrong"
