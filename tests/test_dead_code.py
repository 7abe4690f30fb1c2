"""No definition in faultnet, drivers or harness goes unreferenced: vulture over the
packages and the tests (a name the tests use is used), with tests/dead_code_allowlist.py
for what a framework or a user reads by name. What vulture reports in tests/ itself is
not this check's (fixtures and hypothesis rules are used by name)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("faultnet/", "drivers/", "harness/")
# Name patterns vulture takes as used, each with its reason: the enclave engine
# dispatches a command to its _cmd_<command> method by getattr.
IGNORE_NAMES = ("_cmd_*",)


def unreferenced(*extra: Path) -> list[str]:
    """Vulture's findings in the packages (and in *extra*), one line each."""
    done = subprocess.run(
        [sys.executable, "-m", "vulture", "faultnet", "drivers", "harness", "tests"]
        + [str(p) for p in extra]
        + ["--ignore-names", ",".join(IGNORE_NAMES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # 0: nothing found, 3: dead code found; anything else is vulture failing to run.
    assert done.returncode in (0, 3), done.stdout + done.stderr
    roots = SOURCES + tuple(str(p) for p in extra)
    return [line for line in done.stdout.splitlines() if line.startswith(roots)]


def test_every_definition_is_referenced() -> None:
    found = unreferenced()
    assert not found, "unreferenced (remove it, or say why in the allowlist):\n" + "\n".join(found)


def test_an_unused_function_is_found(tmp_path: Path) -> None:
    # The breakage: a module with a function nothing calls, beside one that is called.
    module = tmp_path / "orphan.py"
    module.write_text(
        "def called() -> int:\n    return 1\n\n\n"
        "def never_called() -> int:\n    return 2\n\n\n"
        "print(called())\n"
    )
    found = unreferenced(module)
    assert [line for line in found if "'never_called'" in line], found
    assert not [line for line in found if "'called'" in line], found
