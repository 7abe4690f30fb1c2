"""The call record: one JSONL line per request, one file per driven process.

Written with :class:`faultnet.eventlog.JsonlWriter` (one ``os.write`` per record on an
``O_APPEND`` file), so a record is whole or absent, and ``jq -s . FILE`` reads the file.

Every record has ``wall``, ``mono``, ``event``, ``pid``, ``start_time`` and
``command``. ``event`` is:

* ``request``: one per client request (``initialize``, ``tools/list``, ``tools/call``,
  ``ping``...) with ``method``, ``tool`` (or null), ``arguments`` (the tool's arguments,
  or the params for other methods, flattened to one line of JSON text), ``id``,
  ``seconds`` (send to outcome), ``outcome`` (``ok``, ``error``, ``is_error``,
  ``timeout``, ``cancelled``, ``process_exited``), ``error_code``, ``error_message``,
  and ``result_text``: for a ``tools/call`` that got a result (``ok`` or ``is_error``),
  the text it answered (first 500 characters), i.e. the claim the caller was given;
  null otherwise;
* ``server_request``: a request the server sent us and how it was answered;
* ``stdout_problem``: a stdout line that was not a usable JSON-RPC message;
* ``handshake_refused``: the server counter-offered a version outside the handshake era;
* ``exit``: how the process was closed (``how``, ``returncode``, ``signals``).

JSON encoding escapes every newline and tab inside strings, so no record spans lines.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from faultnet.eventlog import JsonlWriter, flatten
from faultnet.procs import ProcessIdentity

__all__ = ["CALL_LOG_ENV", "CallRecord", "OUTCOMES"]

#: Environment variable naming the call-record directory when none is passed.
CALL_LOG_ENV = "FAULTNET_CALL_LOG_DIR"

OUTCOMES = ("ok", "error", "is_error", "timeout", "cancelled", "process_exited")


def resolve_dir(call_log_dir: str | os.PathLike[str] | None) -> Path | None:
    if call_log_dir is not None:
        return Path(call_log_dir)
    env = os.environ.get(CALL_LOG_ENV)
    return Path(env) if env else None


class CallRecord:
    """Appends the records of one driven process to ``DIR/mcp-PID-STARTTIME.jsonl``.

    With no directory (argument or ``FAULTNET_CALL_LOG_DIR``) it records nothing.
    """

    def __init__(
        self,
        call_log_dir: str | os.PathLike[str] | None,
        identity: ProcessIdentity,
        argv: list[str],
    ) -> None:
        directory = resolve_dir(call_log_dir)
        self.path = (
            directory / f"mcp-{identity.pid}-{identity.start_time}.jsonl" if directory else None
        )
        self._writer = JsonlWriter(
            self.path,
            pid=identity.pid,
            start_time=identity.start_time,
            command=shlex.join(argv),
        )

    def request(
        self,
        *,
        method: str,
        request_id: int,
        tool: str | None,
        arguments: Any,
        seconds: float,
        outcome: str,
        error_code: int | None = None,
        error_message: str | None = None,
        result_text: str | None = None,
    ) -> dict[str, Any]:
        assert outcome in OUTCOMES, outcome
        return self._writer.write(
            "request",
            method=method,
            tool=tool,
            arguments=flatten(arguments if arguments is not None else {}),
            id=request_id,
            seconds=round(seconds, 6),
            outcome=outcome,
            error_code=error_code,
            error_message=error_message,
            result_text=result_text,
        )

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        return self._writer.write(event, **fields)

    def close(self) -> None:
        self._writer.close()
