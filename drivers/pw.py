"""``pw``: run any command and append one JSON line recording the call.

    python -m drivers.pw [--agent NAME] [--log-dir DIR] -- COMMAND [ARGS...]
    scripts/pw COMMAND [ARGS...]

The record goes to ``DIR/<agent>.jsonl`` (``DIR`` is ``--log-dir`` or
``$FAULTNET_CALL_LOG_DIR``; ``agent`` is ``--agent`` or ``$FAULTNET_AGENT``). One file per
agent, so a fleet of agents does not contend on one log; one ``os.write`` per record on
an ``O_APPEND`` file (the rule of :mod:`faultnet.eventlog`), so concurrent calls of one
agent never interleave. Fields:

* ``at``: the start, UTC ISO-8601 to the millisecond; ``agent``; ``tool``: the basename
  of COMMAND;
* ``argv``: the command line as ONE line: newlines, carriage returns and TABs become
  spaces (a multi-line argument such as a commit message must not tear the record, and
  a raw TAB is as invalid inside a JSON string as a raw newline); bytes that are not
  UTF-8 are written as ``\\xNN`` (an argument is bytes to the kernel, a record is text);
* ``secs``: wall time from start to exit; ``exit``: the exit code as a shell reports it
  (128+N for death by signal N, 127 not found, 126 not executable);
* ``sigpipe``: true for 141 (SIGPIPE, e.g. the caller's own ``| head`` closed the pipe).
  ``ok`` is ``exit == 0 or sigpipe``: a SIGPIPE is the reader leaving, not the tool
  failing, so it is not counted as a failure;
* ``stderr``: the last :data:`STDERR_TAIL_BYTES` bytes of the command's stderr.

A record is one line for every reader: besides what JSON escapes anyway (every control
character below U+0020), U+0085, U+2028 and U+2029 are written as ``\\u`` escapes, since
Python's ``str.splitlines`` (and every reader built on it) ends a line at each.

The command's stdin and stdout are the caller's own (so a SIGPIPE reaches the command
as it would without pw); its stderr is copied through as it arrives. pw exits with the
command's exit code. A log that cannot be opened or written is one warning line: the
command still runs and its exit code still comes back.

pw does not import :mod:`faultnet`: importing the package imports trio, which costs
0.44 s per call (measured with ``-X importtime``), and pw runs once per tool call while
timing it. The record is written by :func:`append_record`, which keeps the event log's
rules (one write, O_APPEND, a failed write is one warning and never the caller's error).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "AGENT_ENV",
    "LOG_DIR_ENV",
    "STDERR_TAIL_BYTES",
    "append_record",
    "as_text",
    "encode_record",
    "flatten_argv",
    "main",
    "run",
]

LOG_DIR_ENV = "FAULTNET_CALL_LOG_DIR"
AGENT_ENV = "FAULTNET_AGENT"
DEFAULT_AGENT = "agent"
#: Enough for the error message a failing tool prints last; small enough that a chatty
#: tool's records stay small (and jq -s over thousands of them stays quick).
STDERR_TAIL_BYTES = 2048
SIGPIPE_EXIT = 128 + signal.SIGPIPE  # 141
PROG = "pw"


def as_text(arg: str) -> str:
    """*arg* as printable UTF-8 text: the bytes of a command-line argument that are not
    UTF-8 (Python holds them as lone surrogates, ``surrogateescape``) become ``\\xNN``."""
    try:
        raw = arg.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: not from the kernel
        return arg.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def flatten_argv(argv: Sequence[str]) -> str:
    """The command line as one line: CR, LF and TAB inside arguments become spaces, bytes
    that are not UTF-8 become ``\\xNN`` (:func:`as_text`)."""
    return " ".join(as_text(a) for a in argv).translate({0x0A: " ", 0x0D: " ", 0x09: " "})


#: Line ends to some readers that JSON does not escape by itself (U+0085 NEL, U+2028
#: LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR); they can only occur inside strings.
_UNICODE_LINE_ENDS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def encode_record(record: dict[str, Any]) -> bytes:
    """*record* as one JSON line (UTF-8, ending in a newline, no other line end of any
    reader's inside it). Strings holding lone surrogates are written via
    :func:`as_text`, so encoding never fails."""
    clean = {k: as_text(v) if isinstance(v, str) else v for k, v in record.items()}
    text = json.dumps(clean, separators=(",", ":"), ensure_ascii=False)
    return (text.translate(_UNICODE_LINE_ENDS) + "\n").encode("utf-8", "backslashreplace")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--agent NAME] [--log-dir DIR] [--] COMMAND [ARGS...]",
        description=(
            "Run COMMAND (stdin, stdout and stderr passed through, exit code passed back) "
            "and append one JSON line recording the call to DIR/AGENT.jsonl: at, agent, "
            "tool, argv (one line), secs, exit, sigpipe (exit 141, not a failure), ok, "
            "and the tail of stderr."
        ),
        epilog=(
            f"DIR is --log-dir or ${LOG_DIR_ENV} (neither: nothing is recorded); AGENT is "
            f"--agent or ${AGENT_ENV} (default {DEFAULT_AGENT!r}). Exit status: COMMAND's "
            "own (127 not found, 126 not executable, 128+N killed by signal N); 2 for a "
            "usage error of pw itself. Slowest calls: "
            "jq -rs 'sort_by(-.secs)[:10][] | \"\\(.secs)\\t\\(.exit)\\t\\(.argv)\"' DIR/*.jsonl"
        ),
    )
    parser.add_argument("--agent", default=os.environ.get(AGENT_ENV) or DEFAULT_AGENT)
    parser.add_argument("--log-dir", default=os.environ.get(LOG_DIR_ENV) or None)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    return parser


def _warn(message: str) -> None:
    try:
        os.write(2, f"pw: warning: {message}\n".encode())
    except OSError:
        pass


def append_record(path: Path, record: dict[str, Any]) -> bool:
    """Append *record* as one JSON line to *path* in one ``os.write`` (O_APPEND).

    Returns False, after one warning line, when it could not be written whole.
    """
    data = encode_record(record)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            n = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        _warn(f"cannot write the call record to {path}: {exc.strerror or exc}")
        return False
    if n != len(data):
        _warn(f"short write of the call record to {path}: {n} of {len(data)} bytes")
        return False
    return True


def _copy_stderr(fd: int) -> bytes:
    """Copy *fd* to our stderr until EOF; return the last STDERR_TAIL_BYTES bytes."""
    tail = bytearray()
    passing = True
    while chunk := os.read(fd, 65536):
        if passing:
            try:
                os.write(2, chunk)
            except OSError:  # our own stderr is gone: keep draining, keep the tail
                passing = False
        tail += chunk
        if len(tail) > 2 * STDERR_TAIL_BYTES:
            del tail[: len(tail) - STDERR_TAIL_BYTES]
    return bytes(tail[-STDERR_TAIL_BYTES:])


def run(command: Sequence[str], log: Path | None, agent: str) -> int:
    """Run *command*, record it in *log* (None: nowhere), return its exit code as a
    shell reports it."""
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    start = time.monotonic()
    tail = b""
    try:
        proc = subprocess.Popen(list(command), stderr=subprocess.PIPE)
    except FileNotFoundError:
        code, tail = 127, f"{PROG}: {command[0]}: command not found\n".encode()
        os.write(2, tail)
    except PermissionError:
        code, tail = 126, f"{PROG}: {command[0]}: permission denied\n".encode()
        os.write(2, tail)
    except OSError as exc:  # e.g. ENOEXEC, not a format this system runs: 126, as a shell
        code, tail = 126, f"{PROG}: {command[0]}: {exc.strerror or exc}\n".encode()
        os.write(2, tail)
    else:
        # pw stands in for the command: a SIGTERM or SIGHUP meant for it goes to the
        # command (by the PID just started); SIGINT from a terminal reaches the whole
        # process group already, so pw only waits for the command to act on it.
        def forward(signum: int, _frame: Any) -> None:
            proc.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert proc.stderr is not None
        tail = _copy_stderr(proc.stderr.fileno())
        proc.stderr.close()
        rc = proc.wait()
        code = 128 - rc if rc < 0 else rc
    secs = time.monotonic() - start
    sigpipe = code == SIGPIPE_EXIT
    if log is not None:
        append_record(
            log,
            {
                "at": at,
                "agent": agent,
                "tool": as_text(os.path.basename(command[0])),
                "argv": flatten_argv(command),
                "secs": round(secs, 4),
                "exit": code,
                "sigpipe": sigpipe,
                "ok": code == 0 or sigpipe,
                "stderr": tail.decode("utf-8", errors="replace"),
            },
        )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: no COMMAND given", file=sys.stderr)
        return 2
    if not args.agent or "/" in args.agent or args.agent in (".", ".."):
        print(f"{PROG}: error: --agent must be a plain file name: {args.agent!r}", file=sys.stderr)
        return 2
    log = Path(args.log_dir) / f"{args.agent}.jsonl" if args.log_dir else None
    return run(command, log, args.agent)


if __name__ == "__main__":
    sys.exit(main())
