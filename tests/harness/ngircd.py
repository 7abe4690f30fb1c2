"""Debian's ngircd as a test's own IRC server: a standard server nobody here wrote.

:func:`open_ngircd` writes a config in the test's directory, starts
``ngircd -n -f CONFIG`` (no daemon: the child we started IS the server) on 127.0.0.1
and a free port, records its identity (PID + start time), and stops exactly that
process when the block ends. It never touches a system ngircd (Debian's package may
run one on 6667 with ``/run/ngircd/ngircd.pid``): its own port, its own pid file.

Running as root, ngircd refuses to stay root and switches to ``nobody`` before writing
its pid file, so the pid file lives in a private directory handed to that user.
ngircd accepts no PING/PONG timeout under 5 s; both are set to that minimum.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from faultnet.procs import ProcessIdentity, stop_exact
from faultnet.testing import wait_until
from tests.conftest import require_program

#: ngircd's own floor for PingTimeout and PongTimeout (a lower value is raised to it).
PING_TIMEOUT_S = 5

_CONFIG = """\
[Global]
	Name = ngircd.faultnet.test
	Info = faultnet test server
	AdminInfo1 = faultnet test suite
	AdminInfo2 = loopback only
	AdminEMail = nobody@localhost
	Listen = 127.0.0.1
	Ports = {port}
	PidFile = {pid_file}
	MotdPhrase = faultnet test server
{password}
[Limits]
	PingTimeout = {ping}
	PongTimeout = {ping}
	MaxNickLength = 30
	MaxConnectionsIP = 0
[Options]
	PAM = no
	DNS = no
	Ident = no
"""


@dataclass(frozen=True)
class Ngircd:
    host: str
    port: int
    password: str | None
    ident: ProcessIdentity
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def ngircd_binary() -> str:
    """The ngircd program; skips the test outside CI (fails in CI) when it is missing."""
    found = shutil.which("ngircd") or shutil.which("ngircd", path="/usr/sbin")
    return require_program(found, "Debian's ngircd (apt-get install ngircd)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _configure(directory: Path, port: int, pid_file: Path, password: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"ngircd-{port}.conf"
    login = f"\tPassword = {password}" if password else ""
    text = _CONFIG.format(port=port, pid_file=pid_file, ping=PING_TIMEOUT_S, password=login)
    config.write_text(text)
    return config


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)


@asynccontextmanager
async def open_ngircd(directory: Path, *, password: str | None = None) -> AsyncIterator[Ngircd]:
    """Run ngircd for the block; *password* is its server password (``PASS``)."""
    binary = ngircd_binary()
    run_dir = Path(tempfile.mkdtemp(prefix="faultnet-ngircd-"))
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(run_dir, nobody.pw_uid, nobody.pw_gid)
    pid_file = run_dir / "ngircd.pid"
    try:
        # A free port can be taken between our look and ngircd's bind: try a few.
        for _attempt in range(3):
            port = _free_port()
            config = _configure(directory, port, pid_file, password)
            log = directory / f"ngircd-{port}.log"
            argv = [binary, "-n", "-f", str(config)]
            proc = _start(argv, log)
            ident = ProcessIdentity.spawned(proc.pid, argv)
            try:
                listening = f"Now listening on [127.0.0.1]:{port}"
                await wait_until(
                    lambda: listening in log.read_text() or proc.poll() is not None,  # noqa: B023
                    10,
                    "ngircd listening",
                )
                if proc.poll() is None:
                    await wait_until(pid_file.exists, 5, "ngircd's pid file")
                    assert int(pid_file.read_text()) == proc.pid, "another process's pid file"
                    yield Ngircd("127.0.0.1", port, password, ident, log)
                    return
                if "already in use" not in log.read_text():
                    raise RuntimeError(f"ngircd exited {proc.returncode}: {log.read_text()}")
            finally:
                report = await trio.to_thread.run_sync(stop_exact, ident)
                proc.wait(timeout=10)
                assert report.ended, report
        raise RuntimeError("ngircd found no free port in 3 tries")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
