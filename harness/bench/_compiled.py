"""The bench's compiled instruments: a C ping-pong client for the RTT line, and the
callgrind line (user-space instructions a proxy executes per 64-byte round trip).

* **The client.** ``pingpong.c`` (beside this module) is built with the system's C
  compiler once per run, into a temporary directory. A Python client spends ~15 us of
  CPU per round trip; on one CPU that is added to every arm and hides the proxy's own
  work (issue 22: a C loop measured 0.88x socat's added RTT with C endpoints, 0.71x with
  Python ones). Without a compiler the RTT line falls back to the Python client and
  says so.
* **The callgrind line.** A proxy (socat, or a faultnet proxy process) is started under
  ``valgrind --tool=callgrind`` in front of the same upstream; the compiled client warms
  up, the proxy's counters are zeroed (``callgrind_control -z``), the client makes
  ``count`` round trips, and they are dumped (``callgrind_control -d``): the dump's total
  over ``count``. Instruction counts do not move with the machine's load, unlike time.
  socat forks a process per connection: its child is the one measured.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from faultnet.errors import EnvironmentProblem
from harness.bench._children import Child, _self_argv, proc_children, start_listening
from harness.bench._stream import CHILD_START_S, HOST, IO_TIMEOUT_S, SOCAT_BUFFER

SOURCE = Path(__file__).with_name("pingpong.c")
#: A proxy under callgrind runs ~50x slower: its start and each command get this long.
CALLGRIND_START_S = 240.0
CALLGRIND_CLIENT_S = 300.0


class Compiled:
    """The built client (``path``), or why there is none (``why``); ``close()`` removes it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="faultnet-bench-")
        self.path: str | None = None
        self.why: str | None = None
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.why = "no C compiler (cc) found"
            return
        out = str(Path(self._dir) / "pingpong")
        try:
            done = subprocess.run(
                [cc, "-O2", "-o", out, str(SOURCE)], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.why = f"{cc} failed: {exc}"
            return
        if done.returncode != 0:
            self.why = f"{cc} failed: {done.stderr.strip().splitlines()[-1:]}"
            return
        self.path = out

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def pingpong_compiled(path: str, addr: tuple[str, int], count: int, warmup: int) -> list[int]:
    """RTT samples in ns from the compiled client (started from the calling thread, so
    it inherits the thread's CPU mask); OSError if it failed."""
    try:
        done = subprocess.run(
            [path, addr[0], str(addr[1]), str(count), str(warmup)],
            capture_output=True,
            text=True,
            timeout=IO_TIMEOUT_S + count * 0.01,
        )
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"the compiled client timed out: {exc}") from None
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"the compiled client exited {done.returncode}")
    return [int(x) for x in done.stdout.split()]


def pingpong_paced(
    path: str, addr: tuple[str, int], count: int, warmup: int, interval_ns: int
) -> list[int]:
    """RTT samples in ns of *count* messages sent open loop, one every *interval_ns*
    (after *warmup* untimed ones, paced alike); OSError if the client failed."""
    try:
        done = subprocess.run(
            [path, addr[0], str(addr[1]), str(count), str(warmup), "pace", str(interval_ns)],
            capture_output=True,
            text=True,
            timeout=IO_TIMEOUT_S + (count + warmup) * (interval_ns / 1e9 + 0.01),
        )
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"the compiled client timed out: {exc}") from None
    if done.returncode != 0:
        raise OSError(done.stderr.strip() or f"the compiled client exited {done.returncode}")
    return [int(x) for x in done.stdout.split()]


@contextlib.contextmanager
def _paused(argv: list[str], failed: Callable[[str], Exception]) -> Iterator[subprocess.Popen[str]]:
    """The compiled client of *argv* in its ``pause`` mode, connected and warm (it said
    ``ready``); :func:`_go` runs its round trips, ``bye`` on its stdin ends it. Killed on
    the way out if it still runs. *failed* makes the error of a client that stopped
    early from its stderr."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _expect(proc, "ready", failed)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _expect(proc: subprocess.Popen[str], word: str, failed: Callable[[str], Exception]) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != word:
        raise failed(proc.communicate()[1])


def _go(proc: subprocess.Popen[str], failed: Callable[[str], Exception]) -> None:
    """Let the paused client make its round trips; back once it said ``done``."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    _expect(proc, "done", failed)


def pingpong_around(
    path: str, addr: tuple[str, int], count: int, warmup: int, between: Callable[[], None]
) -> list[int]:
    """RTT samples in ns of *count* round trips on one connection, timed after its
    *warmup* ones and after ``between()`` ran (the connection open and warm meanwhile)."""

    def failed(err: str) -> Exception:
        return OSError(f"the compiled client failed: {err.strip()}")

    argv = [path, addr[0], str(addr[1]), str(count), str(warmup), "pause"]
    try:
        with _paused(argv, failed) as proc:
            between()
            _go(proc, failed)
            out, err = proc.communicate("bye\n", timeout=IO_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"the compiled client timed out: {exc}") from None
    if proc.returncode != 0:
        raise OSError(err.strip() or f"the compiled client exited {proc.returncode}")
    return [int(x) for x in out.split()]


# -- the callgrind line -------------------------------------------------------------------


def _totals(out_file: Path) -> int:
    text = out_file.read_text(errors="replace")
    m = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if m is None:
        raise EnvironmentProblem(f"no totals in {out_file.name}")
    return int(m.group(1))


def _control(*args: str) -> None:
    tool = shutil.which("callgrind_control")
    if tool is None:
        raise EnvironmentProblem("callgrind_control not found")
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise EnvironmentProblem(f"callgrind_control {' '.join(args)}: {done.stderr.strip()}")


#: A client's argv in its ``pause`` mode, given the port it connects to and its count.
ClientArgv = Callable[[int, int], list[str]]


def pingpong_argv(client: str) -> ClientArgv:
    """The compiled client's argv: *count* round trips after 200 warm ones, paused."""
    return lambda port, count: [client, HOST, str(port), str(count), "200", "pause"]


def _measure(
    client: ClientArgv, port: int, pid_of_connection: Callable[[], int], out_dir: Path, count: int
) -> int:
    """Instructions per round trip of the process ``pid_of_connection()`` names once the
    client (any that speaks the compiled client's ``pause`` protocol) is connected and
    warm."""

    def failed(err: str) -> Exception:
        return EnvironmentProblem(f"the client failed: {err}")

    with _paused(client(port, count), failed) as proc:
        pid = pid_of_connection()
        before = set(out_dir.iterdir())
        _control("-z", str(pid))
        _go(proc, failed)
        _control("-d", str(pid))
        # The dump is cg.PID.N; a file cg.PID written meanwhile (a forked child's
        # own, at its exit) is not it.
        dump = re.compile(rf"cg\.{pid}\.\d+$")
        dumps = sorted(
            (f for f in set(out_dir.iterdir()) - before if dump.match(f.name)),
            key=lambda f: int(f.name.rsplit(".", 1)[1]),
        )
        if not dumps:
            raise EnvironmentProblem("callgrind wrote no dump")
        instructions = _totals(dumps[-1])
        proc.communicate("bye\n", timeout=CALLGRIND_CLIENT_S)
        return round(instructions / count)


def callgrind_line(
    client: str, up_port: int, socat: str | None, proxy_argv: list[str], count: int
) -> dict[str, Any]:
    """Instructions per round trip of socat's connection process and of the faultnet
    proxy process (every thread), each under callgrind, or why not."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"skipped": "valgrind is not installed"}
    out: dict[str, Any] = {"round_trips": count}
    with tempfile.TemporaryDirectory(prefix="faultnet-callgrind-") as tmp:
        out_dir = Path(tmp)
        cg = [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p"]
        if socat is not None:

            def socat_argv(port: int) -> list[str]:
                return [*cg, "--trace-children=yes", socat, "-b", str(SOCAT_BUFFER),
                        f"TCP-LISTEN:{port},bind={HOST},reuseaddr,fork",
                        f"TCP:{HOST}:{up_port}"]  # fmt: skip

            child, port = start_listening(socat_argv, "socat (callgrind)")
            try:

                def socat_connection() -> int:
                    deadline = time.monotonic() + CALLGRIND_START_S
                    while not (kids := proc_children(child.pid)):
                        if time.monotonic() > deadline:
                            raise EnvironmentProblem("socat forked no connection process")
                        time.sleep(0.01)  # another process's fork: no event to wait on
                    return kids[0]

                out["socat"] = _measure(
                    pingpong_argv(client), port, socat_connection, out_dir, count
                )
            except (EnvironmentProblem, OSError, subprocess.SubprocessError) as exc:
                out["socat_error"] = str(exc)
            finally:
                with contextlib.suppress(Exception):
                    for kid in proc_children(child.pid):
                        with contextlib.suppress(OSError):
                            _control("-k", str(kid))
                child.stop(grace=10.0)
        try:
            out["faultnet"] = _proxy_under(
                cg, pingpong_argv(client), up_port, proxy_argv, count, (), out_dir
            )
        except (EnvironmentProblem, OSError, subprocess.SubprocessError) as exc:
            out["faultnet_error"] = str(exc)
    return out


def _proxy_under(
    cg: list[str],
    client: ClientArgv,
    up_port: int,
    proxy_argv: list[str],
    count: int,
    setup: Sequence[str],
    out_dir: Path,
) -> int:
    """A faultnet proxy process under the callgrind argv *cg*, given the *setup*
    commands before the client connects: its instructions per round trip."""
    proxy = Child(
        [*cg, *_self_argv("--role", "proxy", "--upstream-port", str(up_port), *proxy_argv)],
        "faultnet proxy (callgrind)",
    )
    try:
        hello = proxy.read_json(max(CHILD_START_S, CALLGRIND_START_S))
        for command in setup:
            proxy.request(command, timeout=CALLGRIND_START_S)
        port = int(hello["address"][1])
        return _measure(client, port, lambda: proxy.pid, out_dir, count)
    finally:
        proxy.stop(grace=30.0)


def proxy_instructions(
    client: str | ClientArgv,
    up_port: int,
    proxy_argv: list[str],
    count: int,
    setup: Sequence[str],
) -> dict[str, Any]:
    """``{"per_rtt": N}``: user instructions per round trip of a faultnet proxy process
    given *setup* (its role's commands: a toxic, a hop), or why not (``skipped``,
    ``error``). *client* is the compiled client's path, or the argv of another client
    that speaks its ``pause`` protocol (a round trip is then whatever that client's
    one exchange is: an HTTP request and its response)."""
    if isinstance(client, str):
        client = pingpong_argv(client)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"skipped": "valgrind is not installed"}
    with tempfile.TemporaryDirectory(prefix="faultnet-callgrind-") as tmp:
        cg = [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p"]
        try:
            n = _proxy_under(cg, client, up_port, proxy_argv, count, setup, Path(tmp))
        except (EnvironmentProblem, OSError, subprocess.SubprocessError) as exc:
            return {"error": str(exc)}
    return {"per_rtt": n, "round_trips": count}
