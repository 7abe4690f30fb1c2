"""Suite-wide configuration. The fixtures every test may use come from faultnet's pytest
plugin (``faultnet_proxy``, ``faultnet_server``, ...) and the helpers from
:mod:`faultnet.testing`; what is here is only what the suite itself needs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from _pytest.outcomes import Skipped

# Every event a proxy or the server writes is checked against faultnet.events (in this
# process and in every child it starts): an undeclared event or field raises.
os.environ.setdefault("FAULTNET_STRICT_EVENTS", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the project's own packages once, in the controller, before any
    worker starts. Where PYTHONDONTWRITEBYTECODE is set (this machine's environment
    sets it) nothing writes bytecode for an editable install, so every process the
    suite starts (servers, bots, CLIs: hundreds) compiled faultnet and harness from
    source again: importing the server, CLI, fleet and bot took 0.74-1.02 s of CPU a
    process, 0.60 s from bytecode. compileall writes whatever that variable says, and
    skips what is already fresh; __pycache__ is git-ignored."""
    import compileall

    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller did it
    root = Path(__file__).resolve().parents[1]
    for package in ("faultnet", "drivers", "harness"):
        compileall.compile_dir(root / package, quiet=2, workers=0)


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


def _leaf_skip(exc: BaseException | None) -> Skipped | None:
    """The one Skipped inside the exception group *exc* (pytest-trio's context), if any."""
    queue = [exc]
    leaves: list[BaseException] = []
    while queue:
        ex = queue.pop()
        if isinstance(ex, BaseExceptionGroup):
            queue.extend(ex.exceptions)
        elif ex is not None:
            leaves.append(ex)
    if len(leaves) == 1 and isinstance(leaves[0], Skipped):
        return leaves[0]
    return None


def _caller_of_skip(tb: TracebackType | None) -> tuple[str, int] | None:
    """Where the code that skipped is: the innermost frame outside pytest's own files."""
    found = None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if "/_pytest/" not in path and "/pytest_trio/" not in path:
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Give a skip raised in a trio test its own reason and place in the report.

    pytest-trio 0.8 catches the exception group trio raises around a test's one
    ``Skipped`` and calls ``pytest.skip()`` again with no reason, so ``pytest -rs``
    printed ``_pytest/python.py:187: Skipped`` for every trio test skipped by
    :func:`require_program`. The original ``Skipped`` is that bare one's context: its
    message and the line that skipped are put back.
    """
    report = yield
    excinfo = call.excinfo
    if report.skipped and excinfo is not None and isinstance(excinfo.value, Skipped):
        leaf = _leaf_skip(excinfo.value.__context__)
        if leaf is not None and leaf.msg:
            where = _caller_of_skip(leaf.__traceback__)
            path, line = where if where else (str(item.path), 0)
            report.longrepr = (path, line, f"Skipped: {leaf.msg}")
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a collection in which two tests share a node id. pytest-xdist (the suite
    runs on several workers: pyproject.toml) schedules by node id, and of the 23 tests that
    schemathesis's ``schema.parametrize()`` made under one id it ran 1 and reported the
    run green."""
    shared = sorted(n for n, k in Counter(item.nodeid for item in items).items() if k > 1)
    if shared:
        raise pytest.UsageError(
            "tests share a node id (pytest-xdist would run one test of each);"
            f" {len(shared)} shared: {', '.join(shared[:5])}"
        )


def run_module(module: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``python -m MODULE ARGS`` (this interpreter) to completion, output captured as
    text; ``subprocess.TimeoutExpired`` after *timeout* seconds."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )


def bare_python_env(where: Path) -> dict[str, str]:
    """``os.environ`` as on a stock Debian machine with no virtual environment active:
    ``python3`` and ``python`` on PATH are an interpreter that cannot import trio or
    faultnet (a shim in *where* running this one with ``-I -S``: no site-packages,
    PYTHONPATH ignored), and VIRTUAL_ENV and PYTHON are unset."""
    shims = where / "bare-bin"
    shims.mkdir()
    real = os.path.realpath(sys.executable)
    for name in ("python3", "python"):
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} -I -S "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON")}
    env["PATH"] = f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"
    return env


def interrupt_module(
    module: str,
    *args: str,
    when: str,
    signals: Sequence[int],
    merge_stderr: bool = False,
    **popen: Any,
) -> tuple[int, str, str]:
    """Run ``python -m MODULE ARGS``; once a stdout line contains *when*, send it
    *signals* back to back and wait for it (60 s at most; killed through its Popen if it
    is still there). Returns (exit status, all of stdout, stderr; "" if *merge_stderr*)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        **popen,
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the test's timeout; the command itself ends
            seen.append(line)
            if when in line:
                break
        for signum in signals:
            proc.send_signal(signum)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(seen) + rest, err or ""
