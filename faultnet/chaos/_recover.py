"""After chaos was killed: read its join log and undo what it left in force.

A run undoes every fault it applied when it ends for any reason it can observe; SIGKILL
(or a host that lost power) is the one it cannot, and then the join log is the only
record of what is still in force. :func:`recover` reads the LAST run of a join log (the
records from its last ``seed`` line on), finds every ``fault`` line that has an undo and
no later ``undo`` line for the same counter and target (an ``undo_failed`` line leaves it
pending), and undoes each, newest first, as the run would have:

* a mode on a server proxy: its undo (``thaw``, ``restore``);
* a toxic: removed by the name the plan gave it (already gone counts as undone);
* an episode: its ending mode on the connections it took (those still open);
* a stopped process: SIGCONT, only if its PID still names the process the run stopped
  (the ``pid`` and ``start_time`` its fault line recorded).

A fault chaos was killed in the middle of (its ``intent`` line written, and no
``fault``, ``skip`` or ``error`` line after it: :mod:`faultnet.chaos._run`'s write-ahead)
may be in force, and is undone the same way; an episode's, whose taken connections were
never logged, by its down mode's undo (``thaw``) on the whole proxy.

A proxy ``NAME@local`` lived in the process that ran chaos; it died with it, so nothing
is left to undo there (logged as such). Each undo is appended to the same join log
(``undo``, reason ``recovered``; ``undo_failed`` with what remains), so running it twice
undoes nothing twice. It refuses while the run's own process is still alive (the
``seed`` line names it): a live run undoes its own faults on SIGTERM.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultnet.chaos._catalogue import Fault, catalogue
from faultnet.chaos._joinlog import JoinLog
from faultnet.chaos._plan import LOCAL, split_proxy_key
from faultnet.chaos._targets import ServerTarget, TargetAbsent, TargetFailed
from faultnet.errors import EnvironmentProblem, UsageError
from faultnet.eventlog import CorruptLogError, read_jsonl
from faultnet.modes import MODES
from faultnet.procs import ProcessIdentity, signal_exact

__all__ = ["last_run", "pending", "recover"]


def last_run(path: Path) -> list[dict[str, Any]]:
    """The records of the last run in the join log *path* (UsageError if it has none)."""
    try:
        records = read_jsonl(path).records
    except FileNotFoundError:
        raise UsageError(f"no join log at {path}") from None
    except (OSError, CorruptLogError) as exc:
        raise UsageError(f"cannot read the join log {path}: {exc}") from None
    starts = [i for i, r in enumerate(records) if r.get("event") == "seed"]
    if not starts:
        raise UsageError(f"{path} is not a chaos join log (no seed record)")
    return records[starts[-1] :]


def pending(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of *run* whose fault may still be in force, newest first: each
    ``fault`` line not undone, and each ``intent`` line that no ``fault``, ``skip`` or
    ``error`` line of its step followed (chaos was killed between applying and
    logging) and not undone."""
    faults = catalogue()

    def key(r: dict[str, Any]) -> tuple[Any, Any]:
        return r.get("counter"), r.get("target")

    done = {key(r) for r in run if r.get("event") == "undo"}
    closed = {key(r) for r in run if r.get("event") in ("fault", "skip", "error")}
    left = [
        r
        for r in run
        if not r.get("dry")
        and r.get("action") in faults
        and faults[r["action"]].undo is not None
        and key(r) not in done
        and (r.get("event") == "fault" or (r.get("event") == "intent" and key(r) not in closed))
    ]
    return left[::-1]


async def _undo_one(rec: dict[str, Any], fault: Fault) -> dict[str, Any]:
    """Undo one fault record; TargetFailed (or TargetAbsent) says why it could not be."""
    detail, result = rec.get("detail") or {}, rec.get("result") or {}
    target = str(rec.get("target", ""))
    intent = rec.get("event") == "intent"
    if fault.kind == "process":
        who = rec["process"] if intent else result
        ident = ProcessIdentity(int(who["pid"]), int(who["start_time"]))
        if not ident.is_alive():
            return {"pid": ident.pid, "note": "not the process stopped any more: nothing to do"}
        if not signal_exact(ident, signal.SIGCONT):
            return {"pid": ident.pid, "note": "gone"}
        return {"pid": ident.pid}
    name, where = split_proxy_key(target)
    if where == LOCAL:
        return {"note": "a proxy in the process that ran chaos: it ended with it"}
    proxy = ServerTarget(target, where, name)
    stream = detail.get("stream", "both")
    if fault.kind == "toxic":
        return await proxy.remove_toxic(detail["name"])
    if fault.kind == "episode" and intent:
        # Which connections its down mode took was never logged: release every one it
        # may hold with the down mode's own undo (thaw), rather than leave one held.
        undo = MODES[fault.down or ""].undone_by or ""
        return await proxy.apply_mode(undo, stream="both", include_new=False)
    if fault.kind == "episode":
        only = list(result.get("conns") or [])
        if not only:
            return {"connections": 0, "conns": [], "note": "the outage took no connection"}
        return await proxy.apply_mode(fault.undo or "", stream="both", include_new=False, only=only)
    return await proxy.apply_mode(fault.undo or "", stream=stream, include_new=False)


async def recover(
    path: Path, *, on_record: Callable[[dict[str, Any]], None] | None = None
) -> tuple[int, int]:
    """Undo what the last run in the join log *path* left; return (undone, failed)."""
    run = last_run(path)
    seed_rec = run[0]
    who = seed_rec.get("chaos") or {}
    if who.get("pid") and ProcessIdentity(int(who["pid"]), int(who["start_time"])).is_alive():
        raise EnvironmentProblem(
            f"the run that wrote {path} is still alive (pid {who['pid']}): stop it with "
            "SIGTERM, which undoes its faults itself"
        )
    todo = pending(run)
    faults = catalogue()
    log = JoinLog(path, seed=int(seed_rec.get("seed", 0)), dry=False)
    log.on_record = on_record
    undone = failed = 0
    try:
        for rec in todo:
            fault = faults[rec["action"]]
            fields = {
                "action": fault.undo or "",
                "target": rec.get("target", ""),
                "counter": rec.get("counter"),
                "detail": rec.get("detail") or {},
            }
            try:
                result = await _undo_one(rec, fault)
            except (TargetAbsent, TargetFailed, KeyError, ValueError, OSError) as exc:
                failed += 1
                remains = f"{rec['action']} on {rec.get('target')}"
                log.write("undo_failed", **fields, reason=f"{exc}; remains: {remains}")
                continue
            undone += 1
            log.write("undo", **fields, reason="recovered", result=result)
    finally:
        log.close()
    return undone, failed
