"""Fixtures shared by faultnet's tests: every data plane, a real `faultnet server` process."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultnet.planes import available_planes


@pytest.fixture(params=available_planes())
def each_plane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once on every data plane built here (faultnet.planes): every Proxy
    it makes without naming a plane uses this one."""
    monkeypatch.setenv("FAULTNET_DATAPLANE", request.param)
    return str(request.param)


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[str]:
    """A real `faultnet server` subprocess on a free loopback port; yields its URL.
    Stopped with SIGTERM through its own handle."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--loopback-only"]
        + ["--event-log", str(tmp_path / "server-events.jsonl")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(30):
                raise AssertionError("no line from the faultnet server within 30 s")
        line = proc.stdout.readline()
        yield line.split(" listening on ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
