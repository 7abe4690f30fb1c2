"""The `faultnet` command's proxy-side commands: help, version, probe and its exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from faultnet import __version__
from tests.conftest import interrupt_module


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultnet", *args], capture_output=True, text=True, timeout=60
    )


def test_version_and_help() -> None:
    from faultnet.planes import available_planes, default_plane

    line = run("--version").stdout.strip()
    assert line.startswith(f"faultnet {__version__} (data plane: {default_plane()};"), line
    assert line.endswith(f"built here: {', '.join(available_planes())})"), line
    thread = subprocess.run(
        [sys.executable, "-m", "faultnet", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FAULTNET_DATAPLANE": "thread"},
    )
    assert "(data plane: thread;" in thread.stdout, thread.stdout
    for cmd in ([], ["proxy"], ["proxy", "control-test"], ["probe"]):
        out = run(*cmd, "--help")
        assert out.returncode == 0 and "usage:" in out.stdout
    assert run().returncode == 2  # no command: help on stderr, usage error


def test_probe_prints_the_classification() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        out = run("probe", f"127.0.0.1:{port}", "--json")
        assert out.returncode == 0
        assert json.loads(out.stdout)["kind"] == "connected"
    finally:
        listener.close()
    out = run("probe", f"127.0.0.1:{port}")
    assert out.returncode == 0 and "refused" in out.stdout


def test_probe_bad_input_is_one_line_and_exit_2() -> None:
    for args, why in (
        (["probe", "localhost"], "not HOST:PORT"),
        (["probe", "127.0.0.1:99999"], "out of range"),
        (["probe", "127.0.0.1:80", "--timeout", "-1"], "must be positive"),
        (["probe", "no.such.host.invalid:80"], "cannot probe"),
    ):
        out = run(*args)
        assert out.returncode == 2, out
        assert why in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_probe_prints_an_ipv6_address_in_brackets() -> None:
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        out = run("probe", f"[::1]:{port}")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"[::1]:{port} connected"), out.stdout
        out = run("probe", f"[::1]:{port}", "--json")
        assert json.loads(out.stdout)["address"] == f"[::1]:{port}"
    finally:
        listener.close()


def test_udp_probe_prints_answered_silent_and_refused() -> None:
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))
    port = echo.getsockname()[1]
    try:
        # Answered: this thread echoes the one datagram the probe sends.
        echo.settimeout(30)
        answer = threading.Thread(target=lambda: echo.sendto(*echo.recvfrom(65536)))
        answer.start()
        out = run("probe", "--udp", f"127.0.0.1:{port}", "--json")
        answer.join()
        assert out.returncode == 0
        assert json.loads(out.stdout)["kind"] == "answered"
        assert json.loads(out.stdout)["echoed"] is True
        # Bound but never read: the datagram waits in its buffer, nothing answers.
        out = run("probe", "--udp", f"127.0.0.1:{port}", "--timeout", "0.2", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["kind"] == "silent"
    finally:
        echo.close()
    out = run("probe", "--udp", f"127.0.0.1:{port}")
    assert out.returncode == 0 and "refused" in out.stdout


@pytest.mark.parametrize("signals", [1, 2], ids=["one SIGINT", "a second SIGINT in cleanup"])
def test_control_test_interrupted_exits_130_with_one_line(signals: int) -> None:
    """Ctrl-C during control-test cancels it cleanly (was: exit 1 and a KeyboardInterrupt
    traceback); a second Ctrl-C while it unwinds changes nothing."""
    code, out, err = interrupt_module(
        "faultnet", "proxy", "control-test", when="ok ", signals=[signal.SIGINT] * signals
    )
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines() == ["interrupted by SIGINT; cleaned up"]
    assert "PASS" not in out and "FAIL" not in out  # no verdict for a run cut short
