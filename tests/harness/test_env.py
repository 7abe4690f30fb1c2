"""harness.env through real processes: up/status/down, side-by-side environments, and
the guarantee that a PID which no longer names the recorded server is never signalled."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultnet.errors import EnvironmentProblem
from faultnet.procs import ProcessIdentity, read_start_time, stop_exact
from harness import env
from harness.env import STATE_FILE, read_state
from tests import REPO
from tests.conftest import bare_python_env, run_module


def run_env(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_module("harness.env", *args, timeout=timeout)


def env_up(state: Path, *extra: str) -> dict:
    r = run_env("up", "--state", str(state), "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def env_down(state: Path, *extra: str, code: int = 0) -> dict:
    r = run_env("down", "--state", str(state), "--json", *extra)
    assert r.returncode == code, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def cleanup() -> Iterator[list[ProcessIdentity]]:
    """Identities to stop (exactly) at the end of a test, whatever happened."""
    idents: list[ProcessIdentity] = []
    yield idents
    for ident in idents:
        if ident.is_alive():
            stop_exact(ident, term_timeout=3, kill_timeout=3)


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def rewrite_state(state: Path, **changes: str) -> None:
    path = state / STATE_FILE
    lines = []
    for line in path.read_text().splitlines():
        key = line.split("=", 1)[0]
        lines.append(f"{key}={changes[key]}" if key in changes else line)
    path.write_text("\n".join(lines) + "\n")


def start_sleeper(
    ignore_term: bool = False, args: tuple[str, ...] = (), environ: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """A process of our own that stands in for 'someone else' holding a recycled PID
    (*args* after its code shape its command line; *environ* its environment)."""
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(120)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=environ,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_up_status_down_cli(tmp_path: Path, cleanup: list[ProcessIdentity]) -> None:
    state = tmp_path / "env"
    st = env_up(state)
    cleanup.append(ProcessIdentity(st["pid"], st["start_time"], tuple(st["cmdline"])))
    assert st["state_dir"] == str(state.resolve())
    assert re.fullmatch(r"[0-9a-f]{64}", st["leader_token"])
    assert st["channel"] == "#enclave" and st["leader_nick"] == "leader"
    assert st["host"] == "127.0.0.1" and accepts(st["port"])
    # Detached: its own session, so it outlived `up` and ignores our terminal.
    assert os.getsid(st["pid"]) == st["pid"]
    assert (state / STATE_FILE).stat().st_mode & 0o777 == 0o600
    parsed = read_state(state)
    assert parsed.port == st["port"] and parsed.identity.is_alive()
    assert parsed.identity.start_time == read_start_time(st["pid"])
    assert "LISTENING 127.0.0.1" in (state / "server.log").read_text()

    r = run_env("status", "--state", str(state), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["running"] is True

    # A second `up` over a live environment is refused, in one line.
    r = run_env("up", "--state", str(state))
    assert r.returncode == 2
    assert "live environment already runs" in r.stderr and r.stderr.count("\n") == 1

    rep = env_down(state)
    assert rep["outcome"] == "stopped" and rep["signals"] == ["SIGTERM"]
    assert not parsed.identity.is_alive() and not accepts(st["port"])
    r = run_env("status", "--state", str(state))
    assert r.returncode == 1 and "enclave down" in r.stdout
    # Down again: the process is gone; that is reported, not an error.
    rep = env_down(state)
    assert rep["outcome"] == "gone" and rep["signals"] == []

    # The stale environment is replaced by a fresh one (new token, new registry).
    st2 = env_up(state)
    cleanup.append(ProcessIdentity(st2["pid"], st2["start_time"], tuple(st2["cmdline"])))
    assert st2["leader_token"] != st["leader_token"]
    assert (state / "server.log.prev").exists()
    assert env_down(state)["outcome"] == "stopped"


def test_up_default_state_dir_and_scripts(tmp_path: Path, cleanup: list) -> None:
    # As after the README's install on stock Debian: `python3` on PATH cannot import trio
    # (the scripts called it and failed there), the venv is active only as $VIRTUAL_ENV.
    # stdout is the state directory alone, so the scripts compose; the human lines go to
    # stderr (they were four lines on stdout and `--state "$(env-up.sh)"` failed).
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite runs outside a virtual environment")
    environ = {**bare_python_env(tmp_path), "TMPDIR": str(tmp_path), "VIRTUAL_ENV": sys.prefix}
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "env-up.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=environ,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and "enclave up: 127.0.0.1:" in r.stderr, r
    state = Path(r.stdout.strip())
    assert state.parent == tmp_path.resolve() and state.name.startswith("enclave-env-")
    st = read_state(state)
    cleanup.append(st.identity)
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "env-down.sh"), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )
    assert r.returncode == 0 and "enclave down (stopped)" in r.stdout, r.stderr
    assert not st.identity.is_alive()
    # `up` made the directory, so `down` removed it: nothing is left in $TMPDIR.
    assert "removed the temporary state directory" in r.stdout and not state.exists()

    # The two composed, as the scripts' comments say.
    scripts = REPO / "scripts"
    r = subprocess.run(
        ["bash", "-c", f'"{scripts}/env-down.sh" --state "$("{scripts}/env-up.sh")"'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=environ,
    )
    for left in tmp_path.glob("enclave-env-*/" + STATE_FILE):  # should down have failed
        cleanup.append(read_state(left.parent).identity)
    assert r.returncode == 0 and "enclave down (stopped)" in r.stdout, r
    assert [p.name for p in tmp_path.iterdir()] == ["bare-bin"]


def test_an_empty_state_variable_is_unset(tmp_path: Path, cleanup: list) -> None:
    # ENCLAVE_STATE_DIR="" was the path ".": `up` wrote state.env and its log into the
    # current directory (a checkout, typically) and started the server there. Empty is
    # unset, as `down` already read it: a temporary directory of its own.
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "harness.env", "up", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, env.STATE_ENV_VAR: "", "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    cleanup.append(ProcessIdentity(st["pid"], st["start_time"], tuple(st["cmdline"])))
    assert list(cwd.iterdir()) == [], "up wrote into the current directory"
    state = Path(st["state_dir"])
    assert state.parent == tmp_path.resolve() and state.name.startswith("enclave-env-")
    assert env_down(state)["outcome"] == "stopped"
    # An empty --state (an unset shell variable) is a usage error, not ".".
    r = run_env("up", "--state", "")
    assert r.returncode == 2 and "--state: empty" in r.stderr and "Traceback" not in r.stderr


def test_two_environments_side_by_side(tmp_path: Path, cleanup: list) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sa, sb = env_up(a), env_up(b)
    for s in (sa, sb):
        cleanup.append(ProcessIdentity(s["pid"], s["start_time"], tuple(s["cmdline"])))
    assert sa["port"] != sb["port"] and sa["pid"] != sb["pid"]
    assert env_down(a)["outcome"] == "stopped"
    assert not accepts(sa["port"])
    assert read_state(b).identity.is_alive() and accepts(sb["port"])
    assert run_env("status", "--state", str(b)).returncode == 0
    assert env_down(b)["outcome"] == "stopped"


def test_recycled_pid_is_never_signalled(tmp_path: Path, cleanup: list) -> None:
    state = tmp_path / "env"
    st = env_up(state)
    server = ProcessIdentity(st["pid"], st["start_time"], tuple(st["cmdline"]))
    cleanup.append(server)
    sleeper = start_sleeper()
    try:
        # The recorded PID now names another process (the sleeper), with a start time
        # that is not the recorded one.
        rewrite_state(state, PID=str(sleeper.pid), START_TIME=str(st["start_time"] + 12345))
        rep = env_down(state, code=1)
        assert rep["outcome"] == "not-ours" and rep["signals"] == []
        assert "not signalled" in rep["message"] and "--by-port" in rep["message"]
        assert sleeper.poll() is None, "the sleeper was signalled"
        # Same PID and the *right* start time, but another command line: still not ours.
        real_start = read_start_time(sleeper.pid)
        rewrite_state(state, START_TIME=str(real_start))
        rep = env_down(state, code=1)
        assert rep["outcome"] == "not-ours" and sleeper.poll() is None
        assert server.is_alive()

        # --by-port finds the real server by its listening socket and verifies its
        # command line before signalling; the sleeper is untouched.
        rep = env_down(state, "--by-port")
        assert rep["outcome"] == "stopped" and rep["found_by"] == "port"
        assert rep["pid"] == st["pid"]
        assert not server.is_alive() and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_by_port_leaves_a_listener_that_is_not_the_server(tmp_path: Path, cleanup: list) -> None:
    state = tmp_path / "env"
    st = env_up(state)
    server = ProcessIdentity(st["pid"], st["start_time"], tuple(st["cmdline"]))
    cleanup.append(server)
    assert env_down(state)["outcome"] == "stopped"
    # Someone else now listens on a port; point the state file at it.
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert other.stdout is not None
        port = int(other.stdout.readline())
        assert env.listeners_on_port(port) == [other.pid]
        rewrite_state(state, PORT=str(port))
        rep = env_down(state, "--by-port")
        assert rep["outcome"] == "gone" and rep["signals"] == []
        assert "no process listening on port" in rep["message"]
        assert other.poll() is None, "a listener that is not the server was signalled"
    finally:
        other.kill()
        other.wait()


def fake_state(state: Path, ident: ProcessIdentity, marker: str = "") -> None:
    """Write a state file naming *ident* (with *marker*), as a forger could."""
    state.mkdir(exist_ok=True)
    fake = env.EnvState(
        "127.0.0.1", 1, ident.pid, ident.start_time, ident.cmdline, state, "l", "0" * 64, "#e"
    )
    env._write_state(dataclasses.replace(fake, state_dir=state.resolve(), marker=marker))


def test_term_ignored_escalates_to_kill(tmp_path: Path) -> None:
    """Breaks the polite path on purpose: a process that ignores SIGTERM gets SIGKILL.
    The stand-in passes every identity test: an enclave command line for this state
    directory, and the marker in its environment."""
    state = (tmp_path / "env").resolve()
    marker = "ab" * 16
    stubborn = start_sleeper(
        ignore_term=True,
        args=("-m", "harness.enclave", "--state", str(state)),
        environ={**os.environ, env.MARKER_ENV_VAR: marker},
    )
    try:
        fake_state(state, ProcessIdentity.of(stubborn.pid), marker)
        t0 = time.monotonic()
        rep = env.down(state, term_timeout=0.3, kill_timeout=5)
        assert rep.outcome == "killed" and rep.signals == ["SIGTERM", "SIGKILL"]
        assert time.monotonic() - t0 < 5
        assert stubborn.wait(timeout=5) == -9
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()


def test_a_forged_state_file_gets_no_process_signalled(tmp_path: Path) -> None:
    """What a state file can copy (PID, start time, command line, even an enclave
    command line for this directory) never gets a process signalled without the marker
    `up` put in the server's environment. Was: the first three were killed."""
    state = (tmp_path / "env").resolve()
    lookalike = ("-m", "harness.enclave", "--state", str(state))
    sleepers = [
        start_sleeper(),
        start_sleeper(args=lookalike),
        start_sleeper(args=lookalike, environ={**os.environ, env.MARKER_ENV_VAR: "cd" * 16}),
    ]
    try:
        real = [ProcessIdentity.of(s.pid) for s in sleepers]
        forgeries = [
            dataclasses.replace(real[0], cmdline=()),  # CMDLINE=[] and a real start time
            real[0],  # a sleep, named by its PID, start time and command line
            real[1],  # an enclave-looking command line for this very directory
            real[2],  # ...carrying a marker, but not the recorded one
        ]
        for forged, marker in zip(forgeries, ["", "", "", "ef" * 16], strict=True):
            fake_state(state, forged, marker)
            rep = env_down(state, code=1)
            assert rep["outcome"] == "not-ours" and rep["signals"] == [], rep
            assert "--by-port" in rep["message"]
        assert all(s.poll() is None for s in sleepers), "a forged state file got a kill"
    finally:
        for s in sleepers:
            s.kill()
            s.wait()


def test_down_never_signals_init_the_caller_or_its_ancestors(tmp_path: Path) -> None:
    state = tmp_path / "env"
    # The CLI's ancestors include this test process; in-process, the caller is us.
    for pid in (1, os.getpid()):
        fake_state(state, ProcessIdentity.of(pid), marker="00" * 16)
        rep = env_down(state, code=1)
        assert rep["outcome"] == "not-ours" and rep["signals"] == []
        assert "init, this process or one of its ancestors" in rep["message"]
        rep_in = env.down(state)
        assert rep_in.outcome == "not-ours" and not rep_in.ok


def test_python_api_up_down(tmp_path: Path) -> None:
    st = env.up(tmp_path / "api", ping_interval=5, ping_timeout=5)
    try:
        assert st.identity.is_alive()
        assert read_state(st.state_dir) == st
        with pytest.raises(EnvironmentProblem, match="live environment"):
            env.up(tmp_path / "api")
        rep = env.status(st.state_dir)
        assert rep.running
    finally:
        rep2 = env.down(st.state_dir)
    assert rep2.outcome == "stopped" and rep2.ok
    assert not st.identity.is_alive()
    assert st.pid not in env._children  # reaped: no zombie left behind


def test_an_up_that_fails_removes_the_temp_dir_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # No time to start: the server is stopped, and the directory made for it goes too.
    with pytest.raises(EnvironmentProblem, match="did not accept connections"):
        env.up(timeout=0.0)
    assert list(tmp_path.iterdir()) == []
    # A directory the caller named is theirs: kept, with the server's log in it.
    named = tmp_path / "named"
    with pytest.raises(EnvironmentProblem, match="did not accept connections"):
        env.up(named, timeout=0.0)
    assert (named / env.LOG_FILE).exists()


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    r = run_env("down", "--state", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no environment" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = run_env("status", "--state", str(tmp_path / "nothing"), "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["ok"] is False
    r = subprocess.run(
        [sys.executable, "-m", "harness.env", "down"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != env.STATE_ENV_VAR},
    )
    assert r.returncode == 2 and "--state DIR is required" in r.stderr
    r = run_env("--help")
    assert r.returncode == 0 and "up" in r.stdout and "down" in r.stdout
    r = run_env("up", "--ping-interval", "-1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
