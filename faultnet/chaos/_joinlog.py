"""The join log: one JSONL line per decision chaos makes, skips and refusals included.

An analysis joins each fault to its effects and each non-effect to its reason; a rail
that refused silently would make "chaos did nothing here" look like "a rail stopped
it", so every refusal is a line. Written through :class:`faultnet.eventlog.JsonlWriter`:
one ``write()`` per record on ``O_APPEND``.

Every record has ``ts`` (UTC, ISO 8601, ms), ``seed``, ``counter`` (the draw that made the
decision; null for run-level lines), ``event``, ``action``, ``target``, ``detail``
(the planned parameters: the same in a dry run and a real one), ``dry``; a skip or a
refusal adds ``rail`` (a rail of :mod:`faultnet.chaos._rails`) or ``reason``; what a step
did adds ``result`` and ``began`` (CLOCK_MONOTONIC when its call began; ``mono``, from
the writer, is when it returned). A process fault's ``result`` has the ``pid`` and
``start_time`` it signalled; an episode's the ids of the connections it took
(``conns``). The ``seed`` record names the process that ran chaos (``chaos``: ``pid``,
``start_time``). ``event`` is one of:

=============  ==========================================================================
``seed``       the seed, and whether it was given or chosen
``plan``       the plan's size, config and time unit
``check``      a dry run's verdict on a rail it does not enforce (e.g. arming)
``refuse``     a run-level refusal (an unarmed run, a server or proxy not in the plan,
               an allowlist line that could not be pinned)
``intent``     real runs: a fault about to be applied, written before the call or signal
               (write-ahead; a process fault's has the ``process`` it will signal: ``pid``,
               ``start_time``); its ``fault``, ``skip`` or ``error`` line follows
``fault``      a fault applied (or, dry, to be attempted)
``skip``       a planned step not taken, with its rail or reason
``undo``       a fault undone (on time, or at exit with ``reason`` "exit")
``undo_failed`` a fault chaos could not undo: what remains, and why
``error``      a step that was attempted and failed
``signal``     a signal that ended the run early
``end``        the run's summary
=============  ==========================================================================
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from typing import Any

from faultnet.eventlog import JsonlWriter

__all__ = ["PRINTED_KEYS", "JoinLog"]

#: What a run prints of each record: the decision, never its timing, so two dry runs of
#: one plan print the same text.
PRINTED_KEYS = (
    "event",
    "counter",
    "at",
    "action",
    "target",
    "detail",
    "rail",
    "reason",
    "result",
)


def _ts() -> str:
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class JoinLog:
    """Writes decisions to a JSONL file (or nowhere, with *path* None) and keeps them."""

    def __init__(self, path: str | os.PathLike[str] | None, *, seed: int, dry: bool) -> None:
        self._writer = JsonlWriter(path)
        self.seed = seed
        self.dry = dry
        self.records: list[dict[str, Any]] = []
        #: Called with each record as it is written (the CLI prints it).
        self.on_record: Callable[[dict[str, Any]], None] | None = None

    @property
    def path(self) -> str | None:
        return str(self._writer.path) if self._writer.path is not None else None

    def write(
        self,
        event: str,
        *,
        action: str,
        target: str = "",
        counter: int | None = None,
        at: float | None = None,
        detail: dict[str, Any] | None = None,
        rail: str | None = None,
        reason: str | None = None,
        result: dict[str, Any] | None = None,
        began: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "ts": _ts(),
            "seed": self.seed,
            "counter": counter,
            "at": at,
            "action": action,
            "target": target,
            "detail": detail or {},
            "dry": self.dry,
        }
        # A field that does not apply is left out, not written as null.
        optional = {"rail": rail, "reason": reason, "result": result, "began": began}
        optional.update(extra or {})
        fields.update((k, v) for k, v in optional.items() if v is not None)
        record = self._writer.write(event, **fields)
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def close(self) -> None:
        self._writer.close()
