"""Environment lifecycle: start, inspect and stop one enclave server per state directory.

    python -m harness.env up [--state DIR] [--json]      # prints the state directory
    python -m harness.env status [--state DIR] [--json]
    python -m harness.env down [--state DIR] [--json] [--by-port]

``up`` mints the leader's token into a fresh registry, starts ``python -m
harness.enclave`` detached (its own session, so it outlives ``up``; stderr to
``DIR/server.log``) on a free loopback port chosen by the kernel (``--port 0`` plus
``--port-file``: no probe-then-bind race), waits until the port accepts a connection,
and writes ``DIR/state.env``::

    HOST=127.0.0.1
    PORT=41234
    PID=12345
    START_TIME=987654       # /proc/PID/stat field 22: PID + this names one process
    CMDLINE=["/usr/bin/python3", "-m", "harness.enclave", ...]
    STATE_DIR=/tmp/enclave-env-abc
    LEADER_NICK=leader
    LEADER_TOKEN=<64 hex>
    CHANNEL=#enclave
    MARKER=<32 hex>         # also in the server's environment as ENCLAVE_ENV_MARKER

Values are raw (split each line at its first ``=``); the file is written atomically
(temp file + rename) with mode 0600 because it holds a token. Without ``--state`` (or
``$ENCLAVE_STATE_DIR``), ``up`` makes a temporary directory, and ``down`` removes it once
the server is gone (``down --keep`` keeps it).

Safety rules:

* ``up`` refuses to start over a live environment in the same directory (exit 2). A
  stale one (its server is gone) is replaced; its log is kept as ``server.log.prev``.
  Concurrent ``up`` calls on one directory are serialised by a lock file.
* ``down`` signals exactly the recorded process, and only once every test holds: the
  PID is not init, the caller or an ancestor of it; it still has the recorded start
  time; the recorded command line is an enclave server for this state directory and is
  the one it runs; and its environment (``/proc/PID/environ``) carries the random
  marker ``up`` gave it and recorded. A state file can be made to name any process by
  its PID, start time and command line; it cannot give that process the marker. The
  signals go through a pidfd (:func:`faultnet.procs.stop_exact`): SIGTERM, then SIGKILL
  after ``term_timeout``. A process already gone is reported, not an error; a recorded
  process that is not ours is left alone, reported, and ``down`` exits 1 naming
  ``--by-port``.
* ``down --by-port`` is the fallback when the recorded PID no longer names the server:
  it finds the process listening on the recorded port (``/proc/net/tcp{,6}`` LISTEN
  entries matched to ``/proc/PID/fd`` socket inodes) and signals it only if it passes
  the same tests (the marker above all).

Environments in different state directories are independent and can run side by side.
Exit codes: 0 ok, 1 check failed (``status``: not running; ``down``: survived SIGKILL,
or the recorded process is not ours),
2 usage or environment error (one line, never a traceback).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultnet.cliargs import examples, keep_examples, positive_number
from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail
from faultnet.procs import ProcessIdentity, read_cmdline, read_start_time, stop_exact
from harness.enclave import REGISTRY_FILE, Registry, RegistryError

__all__ = [
    "DEFAULT_CHANNEL",
    "DEFAULT_LEADER_NICK",
    "STATE_FILE",
    "DownReport",
    "EnvState",
    "StatusReport",
    "down",
    "listeners_on_port",
    "main",
    "read_state",
    "status",
    "up",
]

STATE_FILE = "state.env"
LOG_FILE = "server.log"
PORT_FILE = "port"
LOCK_FILE = ".env.lock"
#: Present in a state directory `up` made itself (no --state): `down` removes the
#: directory once the server is stopped, unless told to keep it.
MADE_BY_UP = ".made-by-up"
DEFAULT_LEADER_NICK = "leader"
DEFAULT_CHANNEL = "#enclave"
#: Environment variable naming the state directory when --state is not given.
STATE_ENV_VAR = "ENCLAVE_STATE_DIR"
_KEYS = (
    "HOST",
    "PORT",
    "PID",
    "START_TIME",
    "CMDLINE",
    "STATE_DIR",
    "LEADER_NICK",
    "LEADER_TOKEN",
    "CHANNEL",
)
#: Written by every `up` since the marker exists; a file without it is still readable,
#: but `down` never signals the process it names (nothing proves it is ours).
_OPTIONAL_KEYS = ("MARKER",)
#: The environment variable through which `up` gives the server its unguessable marker;
#: `down` reads it back from /proc/PID/environ before any signal.
MARKER_ENV_VAR = "ENCLAVE_ENV_MARKER"
_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Server processes started by this Python process, so ``down`` can reap them (no zombie).
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class EnvState:
    """What ``state.env`` records about one running environment."""

    host: str
    port: int
    pid: int
    start_time: int
    cmdline: tuple[str, ...]
    state_dir: Path
    leader_nick: str
    leader_token: str
    channel: str
    #: The random token `up` put in the server's environment (MARKER_ENV_VAR); "" when
    #: the state file predates it.
    marker: str = ""

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_time, self.cmdline)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    def to_json(self) -> dict[str, Any]:
        """Its fields, in their order; the two JSON does not take as they are made so."""
        return {**asdict(self), "cmdline": list(self.cmdline), "state_dir": str(self.state_dir)}

    def to_env_text(self) -> str:
        values = {
            "HOST": self.host,
            "PORT": str(self.port),
            "PID": str(self.pid),
            "START_TIME": str(self.start_time),
            "CMDLINE": json.dumps(list(self.cmdline)),
            "STATE_DIR": str(self.state_dir),
            "LEADER_NICK": self.leader_nick,
            "LEADER_TOKEN": self.leader_token,
            "CHANNEL": self.channel,
            "MARKER": self.marker,
        }
        return "".join(f"{k}={values[k]}\n" for k in (*_KEYS, *_OPTIONAL_KEYS))


def read_state(state_dir: str | os.PathLike[str]) -> EnvState:
    """Parse ``DIR/state.env``. Raises EnvironmentProblem if it is missing or malformed."""
    path = Path(state_dir) / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"no environment in {state_dir} ({STATE_FILE} not found)"
        ) from None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read {path}: {exc}") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if eq:
            values[key.strip()] = value
    missing = [k for k in _KEYS if k not in values]
    if missing:
        raise EnvironmentProblem(f"{path}: missing {', '.join(missing)}")
    try:
        cmdline = json.loads(values["CMDLINE"])
        if not isinstance(cmdline, list) or not all(isinstance(x, str) for x in cmdline):
            raise ValueError("CMDLINE is not a JSON list of strings")
        return EnvState(
            host=values["HOST"],
            port=int(values["PORT"]),
            pid=int(values["PID"]),
            start_time=int(values["START_TIME"]),
            cmdline=tuple(cmdline),
            state_dir=Path(values["STATE_DIR"]),
            leader_nick=values["LEADER_NICK"],
            leader_token=values["LEADER_TOKEN"],
            channel=values["CHANNEL"],
            marker=values.get("MARKER", ""),
        )
    except ValueError as exc:
        raise EnvironmentProblem(f"{path}: malformed: {exc}") from None


def _write_state(state: EnvState) -> None:
    path = state.state_dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(state.to_env_text())
    os.replace(tmp, path)


def _is_enclave_for(cmdline: Sequence[str], state_dir: Path) -> bool:
    """Is *cmdline* an enclave server (``-m harness.enclave``) for *state_dir*?"""
    pairs = list(zip(cmdline, cmdline[1:], strict=False))
    return ("-m", "harness.enclave") in pairs and ("--state", str(state_dir)) in pairs


def _protected_pids() -> set[int]:
    """PIDs `down` never signals: init, this process and every ancestor of it."""
    pids, pid = {1}, os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            status_text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        ppid = next(
            (ln.split()[1] for ln in status_text.splitlines() if ln.startswith("PPid:")), "0"
        )
        pid = int(ppid)
    return pids


def _environ_has(pid: int, name: str, value: str) -> bool:
    """Does /proc/PID/environ hold ``NAME=VALUE`` (the process's environment at exec)?"""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{name}={value}".encode() in raw.split(b"\0")


def _why_not_ours(ident: ProcessIdentity, st: EnvState) -> str | None:
    """Why the process *ident* is not the server of *st* (None: it is, and may be
    signalled). Every test must pass: not init, the caller or an ancestor of it; alive
    with the recorded start time; a recorded and a live command line that are both this
    enclave server for this state directory; and the marker `up` gave it, read back
    from its environment (a PID, a start time and a command line can all be copied into
    a state file; the marker is a 128-bit secret only the server's environment holds)."""
    if ident.pid in _protected_pids():
        return f"pid {ident.pid} is init, this process or one of its ancestors"
    if not ident.is_alive():
        return f"pid {ident.pid} is not the process recorded (gone, or another start time)"
    if not _is_enclave_for(ident.cmdline, st.state_dir):
        return f"the recorded command line is not an enclave server for {st.state_dir}"
    if tuple(read_cmdline(ident.pid) or ()) != ident.cmdline:
        return f"pid {ident.pid} runs another command line than the one recorded"
    if not st.marker:
        return "the state file records no marker, so nothing proves the process is ours"
    if not _environ_has(ident.pid, MARKER_ENV_VAR, st.marker):
        return f"pid {ident.pid} does not carry this environment's marker"
    return None


def _is_server(st: EnvState) -> bool:
    """True iff the recorded process is this environment's server (see _why_not_ours)."""
    return _why_not_ours(st.identity, st) is None


@contextmanager
def _dir_lock(state_dir: Path) -> Iterator[None]:
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvironmentProblem(f"another `up` is in progress in {state_dir}") from None
        yield
    finally:
        os.close(fd)


def _accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(tail)


def up(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    ping_interval: float = 90.0,
    ping_timeout: float = 60.0,
    leader_nick: str = DEFAULT_LEADER_NICK,
    channel: str = DEFAULT_CHANNEL,
    host: str = "127.0.0.1",
    timeout: float = 15.0,
) -> EnvState:
    """Start a fresh environment in *state_dir* (default: a new temp dir); return it.

    Returns once the server accepts connections and ``state.env`` is written. Raises
    EnvironmentProblem if a live environment already runs there or the server fails to start
    within *timeout* seconds (the server is then stopped, and a temp dir made here removed:
    the error carries the tail of the server's log).
    """
    if state_dir is not None:
        root = Path(state_dir)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot create state directory {root}: {exc}") from None
        return _up_in(root, ping_interval, ping_timeout, leader_nick, channel, host, timeout)
    root = Path(tempfile.mkdtemp(prefix="enclave-env-"))
    (root / MADE_BY_UP).touch()
    try:
        return _up_in(root, ping_interval, ping_timeout, leader_nick, channel, host, timeout)
    except EnvironmentProblem:
        # Each of these leaves no server behind (it never started, exited, or was stopped).
        shutil.rmtree(root, ignore_errors=True)
        raise


def _up_in(
    root: Path,
    ping_interval: float,
    ping_timeout: float,
    leader_nick: str,
    channel: str,
    host: str,
    timeout: float,
) -> EnvState:
    root = root.resolve()
    with _dir_lock(root):
        if (root / STATE_FILE).exists():
            try:
                old = read_state(root)
            except EnvironmentProblem:
                old = None
            if old is not None and _is_server(old):
                raise EnvironmentProblem(
                    f"a live environment already runs in {root} (pid {old.pid}, "
                    f"port {old.port}); run `python -m harness.env down --state {root}` first"
                )
            _clear_stale(root)
        try:
            registry = Registry(root)
            try:
                token = registry.mint_leader(leader_nick)
            finally:
                registry.close()
        except RegistryError as exc:
            raise EnvironmentProblem(f"cannot mint leader {leader_nick!r}: {exc}") from None
        return _start_server(
            root, token, leader_nick, channel, host, ping_interval, ping_timeout, timeout
        )


def _clear_stale(root: Path) -> None:
    """Remove what a previous, dead environment left, keeping its log as .prev."""
    log = root / LOG_FILE
    if log.exists():
        os.replace(log, root / (LOG_FILE + ".prev"))
    for name in (
        STATE_FILE,
        PORT_FILE,
        REGISTRY_FILE,
        REGISTRY_FILE + "-journal",
        REGISTRY_FILE + "-wal",
        REGISTRY_FILE + "-shm",
    ):
        try:
            (root / name).unlink()
        except FileNotFoundError:
            pass


def _start_server(
    root: Path,
    token: str,
    leader_nick: str,
    channel: str,
    host: str,
    ping_interval: float,
    ping_timeout: float,
    timeout: float,
) -> EnvState:
    port_file = root / PORT_FILE
    port_file.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "harness.enclave",
        "--host", host, "--port", "0", "--state", str(root),
        "--port-file", str(port_file),
        "--ping-interval", repr(float(ping_interval)),
        "--ping-timeout", repr(float(ping_timeout)),
    ]  # fmt: skip
    env = os.environ.copy()
    marker = secrets.token_hex(16)
    env[MARKER_ENV_VAR] = marker
    # The server must import this very checkout, installed or not, from any cwd.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    with open(root / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=root,
            env=env,
            start_new_session=True,  # its own session: outlives `up`, no terminal signals
            close_fds=True,
        )
    _children[proc.pid] = proc
    deadline = time.monotonic() + timeout
    ident = ProcessIdentity.spawned(proc.pid, argv)
    port: int | None = None
    while True:
        if proc.poll() is not None:
            raise EnvironmentProblem(
                f"server exited with {proc.returncode} before listening: "
                f"{_log_tail(root / LOG_FILE)}"
            )
        if port is None and port_file.exists():
            port = int(port_file.read_text().strip())
        if port is not None and _accepts(host, port):
            break
        if time.monotonic() >= deadline:
            stop_exact(ident, term_timeout=2.0, kill_timeout=2.0)
            _reap(ident.pid)
            raise EnvironmentProblem(
                f"server did not accept connections within {timeout} s; stopped it"
            )
        time.sleep(0.02)  # polling another process's progress, bounded by the deadline
    state = EnvState(
        host=host,
        port=port,
        pid=ident.pid,
        start_time=ident.start_time,
        cmdline=ident.cmdline,
        state_dir=root,
        leader_nick=leader_nick,
        leader_token=token,
        channel=channel,
        marker=marker,
    )
    _write_state(state)
    return state


# ------------------------------------------------------------------------------ down


@dataclass
class DownReport:
    """What ``down`` did. ``outcome`` is one of:

    * ``"stopped"``: SIGTERM sent, the process exited within ``term_timeout``;
    * ``"killed"``: it survived SIGTERM, SIGKILL sent, it exited;
    * ``"gone"``: the recorded process no longer exists; nothing was signalled;
    * ``"not-ours"``: the recorded PID names a process that fails the identity tests
      (another start time or command line, no marker, init or the caller); it was NOT
      signalled (exit 1);
    * ``"survived"``: still alive after SIGKILL and ``kill_timeout`` (exit 1).
    """

    state_dir: Path
    pid: int
    outcome: str
    message: str
    signals: list[str] = field(default_factory=list)
    found_by: str | None = None  # "pid" | "port" | None (nothing signalled)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """False (exit 1) when the server survived, or the recorded process is not ours."""
        return self.outcome not in ("survived", "not-ours")

    def to_json(self) -> dict[str, Any]:
        """Its fields, in their order (the time to the ms), then ``ok``."""
        doc = asdict(self)
        doc.update(state_dir=str(self.state_dir), elapsed_s=round(self.elapsed_s, 3))
        return {**doc, "ok": self.ok}


def _reap(pid: int) -> None:
    """Reap *pid* if this process started it with :func:`up` (never a bare waitpid:
    that would steal the exit status from whoever else owns the child)."""
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        del _children[pid]


def _remove_if_made(state_dir: Path, outcome: str, keep: bool) -> str:
    """Remove *state_dir* if `up` made it and its server is gone; say so ("" if not)."""
    if keep or outcome not in ("stopped", "killed", "gone"):
        return ""
    if not (state_dir / MADE_BY_UP).exists():
        return ""
    shutil.rmtree(state_dir, ignore_errors=True)
    return f"; removed the temporary state directory {state_dir} (--keep keeps it)"


def tcp_listen_inodes(port: int) -> set[str]:
    """Socket inodes of TCP sockets in LISTEN state on *port* (any local address)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def listeners_on_port(port: int) -> list[int]:
    """PIDs holding a TCP socket that listens on *port* (those whose fds we can read)."""
    wanted = {f"socket:[{inode}]" for inode in tcp_listen_inodes(port)}
    if not wanted:
        return []
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in wanted:
                        pids.append(int(entry.name))
                        break
                except OSError:
                    continue
    return pids


def down(
    state_dir: str | os.PathLike[str],
    *,
    by_port: bool = False,
    term_timeout: float = 5.0,
    kill_timeout: float = 5.0,
    keep: bool = False,
) -> DownReport:
    """Stop the environment recorded in *state_dir* (see the module docstring). A state
    directory `up` made itself is removed once its server is gone, unless *keep*."""
    t0 = time.monotonic()
    st = read_state(state_dir)
    ident = st.identity
    target: ProcessIdentity | None = None
    found_by: str | None = None
    why = _why_not_ours(ident, st) or ""
    now_start = read_start_time(ident.pid)
    if not why:
        target, found_by = ident, "pid"
    elif now_start is None or not ProcessIdentity(ident.pid, now_start).is_alive():
        why = f"recorded server pid {ident.pid} is gone"
        outcome = "gone"
    else:
        why = f"{why}: not signalled"
        outcome = "not-ours"
        if not by_port:
            why += (
                "; if the server still runs, find it by the port it listens on: "
                f"python -m harness.env down --state {st.state_dir} --by-port"
            )
    if target is None and by_port:
        for pid in listeners_on_port(st.port):
            try:
                candidate = ProcessIdentity.of(pid)
            except ProcessLookupError:
                continue
            if _why_not_ours(candidate, st) is None:
                target = candidate
                found_by = "port"
                why += f"; found the server by port {st.port} (its marker matches): pid {pid}"
                break
        else:
            why += f"; no process listening on port {st.port} is this environment's server"
    if target is None:
        why += _remove_if_made(st.state_dir, outcome, keep)
        return DownReport(
            st.state_dir, ident.pid, outcome, why.lstrip("; "), elapsed_s=time.monotonic() - t0
        )
    stopped = stop_exact(target, term_timeout=term_timeout, kill_timeout=kill_timeout)
    _reap(target.pid)
    result, sent = stopped.outcome, list(stopped.signals)
    messages = {
        "stopped": f"stopped server pid {target.pid} (SIGTERM)",
        "killed": f"killed server pid {target.pid} (SIGKILL after {term_timeout} s of SIGTERM)",
        "gone": f"server pid {target.pid} exited before it was signalled",
        "not-ours": f"pid {target.pid} changed hands before it was signalled: not signalled",
        "survived": f"server pid {target.pid} is still alive after SIGKILL",
    }
    return DownReport(
        st.state_dir,
        target.pid,
        result,
        (why.lstrip("; ") + "; " if why else "")
        + messages[result]
        + _remove_if_made(st.state_dir, result, keep),
        sent,
        found_by,
        time.monotonic() - t0,
    )


# ------------------------------------------------------------------------------ status


@dataclass
class StatusReport:
    state: EnvState
    alive: bool  # the recorded process (pid + start time + command line) is running
    accepting: bool  # its port accepts a TCP connection now

    @property
    def running(self) -> bool:
        return self.alive and self.accepting

    def to_json(self) -> dict[str, Any]:
        d = self.state.to_json()
        d.update(alive=self.alive, accepting=self.accepting, running=self.running)
        return d


def status(state_dir: str | os.PathLike[str]) -> StatusReport:
    st = read_state(state_dir)
    alive = _is_server(st)
    return StatusReport(st, alive, alive and _accepts(st.host, st.port))


# ------------------------------------------------------------------------------ CLI


def _state_arg(text: str) -> Path:
    # Path("") is ".": an empty --state (an unset shell variable) would put the state
    # files and the server in the current directory.
    if not text:
        raise argparse.ArgumentTypeError("empty: name a directory")
    return Path(text)


#: The subcommands: name -> (help, description, example), in the order help lists them.
_COMMANDS = {
    "up": (
        "start a fresh environment",
        "Start a fresh environment; print its state directory (alone on stdout).",
        "python -m harness.env up --state /tmp/enclave --ping-interval 5",
    ),
    "down": (
        "stop exactly the recorded server",
        "Stop exactly the server recorded in the state directory.",
        "python -m harness.env down --state /tmp/enclave --json",
    ),
    "status": (
        "is the recorded server running?",
        "Is the recorded server running? Exit 0 if it is, 1 if not.",
        "python -m harness.env status --state /tmp/enclave",
    ),
}


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state",
        type=_state_arg,
        default=None,
        help=f"state directory (default: ${STATE_ENV_VAR}; for up, a new temp dir)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    p = argparse.ArgumentParser(
        prog="python -m harness.env",
        description="Start, inspect and stop an enclave server environment.",
        epilog=examples(
            'state="$(python -m harness.env up)"',
            'python -m harness.env down --state "$state"',
        ),
    )
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(_COMMANDS) + "}")
    u, d, _ = (
        sub.add_parser(
            name, parents=[common], help=short, description=long, epilog=examples(example)
        )
        for name, (short, long, example) in _COMMANDS.items()
    )
    u.add_argument("--ping-interval", type=positive_number, default=90.0)
    u.add_argument("--ping-timeout", type=positive_number, default=60.0)
    u.add_argument("--leader-nick", default=DEFAULT_LEADER_NICK)
    u.add_argument("--channel", default=DEFAULT_CHANNEL)
    u.add_argument(
        "--timeout",
        type=positive_number,
        default=15.0,
        help="seconds to wait for the server to accept (default 15)",
    )
    d.add_argument(
        "--by-port",
        action="store_true",
        help="if the recorded PID is not the server, find it by its port",
    )
    d.add_argument(
        "--keep",
        action="store_true",
        help="keep a state directory `up` made itself (default: removed once the server is gone)",
    )
    d.add_argument("--term-timeout", type=positive_number, default=5.0)
    d.add_argument("--kill-timeout", type=positive_number, default=5.0)
    keep_examples(p)
    return p


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state is not None:
        return args.state
    env = os.environ.get(STATE_ENV_VAR)
    if env:
        return Path(env)
    raise UsageError(f"--state DIR is required (or set ${STATE_ENV_VAR})")


def _print(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(json.dumps(doc) if args.json else text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "up":
            # An empty $ENCLAVE_STATE_DIR is unset (as `down` and `status` read it): as a
            # path it was ".", and `up` wrote its state and started its server in the
            # current directory, a checkout included.
            where = args.state if args.state is not None else os.environ.get(STATE_ENV_VAR) or None
            opts = ("ping_interval", "ping_timeout", "leader_nick", "channel", "timeout")
            st = up(where, **{k: getattr(args, k) for k in opts})
            if args.json:
                print(json.dumps(st.to_json()))
                return 0
            # stdout is the state directory alone, for `--state "$(env-up.sh)"`; what a
            # person reads goes to stderr.
            print(
                f"enclave up: {st.host}:{st.port} pid {st.pid}\n"
                f"leader: {st.leader_nick} (token in {st.state_dir / STATE_FILE})\n"
                f"channel: {st.channel}  log: {st.log_path}",
                file=sys.stderr,
            )
            print(st.state_dir)
            return 0
        state_dir = _state_dir(args)
        if args.command == "down":
            opts = ("by_port", "term_timeout", "kill_timeout", "keep")
            report = down(state_dir, **{k: getattr(args, k) for k in opts})
            _print(args, report.to_json(), f"enclave down ({report.outcome}): {report.message}")
            return 0 if report.ok else 1
        rep = status(state_dir)
        st = rep.state
        what = "running" if rep.running else ("not accepting" if rep.alive else "down")
        _print(
            args,
            rep.to_json(),
            f"enclave {what}: {st.host}:{st.port} pid {st.pid} state {st.state_dir}",
        )
        return 0 if rep.running else 1
    except CommandError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": str(exc)}))
        return fail("harness.env", exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
