"""Fault intervals from a proxy's event log: when each fault was in force on the proxy,
and where it stopped holding the clients behind it.

A removal ends the faults faultnet's table of modes says it undoes; a mode nothing undoes
(sever, reset) is an instant. A fault on the connections open when it was applied, and
on no new ones, stops mattering to a client once that client left the connection it
held (see :class:`~harness.report._model.FaultInterval`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from faultnet.modes import MODES
from harness.report._model import FaultInterval

__all__ = ["INSTANT_MODES", "UNDOES", "fault_intervals", "mark_left", "released_at"]

#: Which faults each removal ends, from faultnet's one table of modes. A mode nothing
#: undoes (sever, reset) acts once: an instant, not an interval. The proxy logs a sever
#: as "severed" (the close's name). A toxic lasts from toxic_added to toxic_removed.
UNDOES = {m.name: m.undoes for m in MODES.values() if m.acts_on == "undo"}
INSTANT_MODES = (
    *(m.name for m in MODES.values() if m.acts_on != "undo" and m.undone_by is None),
    "severed",
)


#: A connection's client has left it: it closed its end (its FIN or RST held by the
#: fault, on the stream from the client), the peer reset it, or it closed.
def _left_by_client(r: dict[str, Any]) -> bool:
    ev = r.get("event")
    if ev in ("held_fin", "held_rst"):
        return r.get("stream") == "upstream"
    return ev in ("conn_close", "peer_reset")


def _holds_only_open_connections(r: dict[str, Any]) -> bool:
    """Does this fault_applied record act on the connections it lists and on no new
    ones? (``include_new`` off, and a mode that leaves new connections unchanged, from
    faultnet's table of modes; a partition, say, also drops new SYNs.)"""
    m = MODES.get(str(r.get("mode", "")))
    return (
        m is not None
        and m.acts_on == "connections"
        and m.new_connections.startswith("unchanged")
        and not r.get("include_new")
        and bool(r.get("connections"))
    )


def released_at(iv: FaultInterval, leaves: dict[Any, list[float]]) -> float | None:
    """When every connection *iv* held had been left by its client (*leaves*: each
    connection's leaving times), if before *iv* ended; else None."""
    times = []
    for c in iv.connections or []:
        after = [t for t in leaves.get(c, []) if t >= iv.start]
        if not after:
            return None
        times.append(min(after))
    if not times:
        return None
    last = max(times)
    return last if iv.end is None or last < iv.end else None


def mark_left(f: FaultInterval, lane_id: str, drops: Iterable[float]) -> None:
    """Record on *f* when the bot of *lane_id* left the connection it held: its first
    drop (*drops*: its ``disconnected`` times) while *f* was in force, if *f* held open
    connections only (whatever it connects next is new, so not behind *f*)."""
    if f.catches_new:
        return
    inside = [t for t in drops if f.start <= t and (f.end is None or t < f.end)]
    if inside:
        f.left[lane_id] = min(inside)


def _closed_with(conns: Any, held: FaultInterval) -> bool:
    """Did an instant fault on *conns* close every connection *held* acts on?"""
    return bool(conns and held.connections and set(held.connections) <= set(conns))


def _removal_ends(r: dict[str, Any], iv: FaultInterval) -> bool:
    """Does the fault_removed record *r* end the open interval *iv*? (its mode undoes
    *iv*'s, on *iv*'s stream, and on some of *iv*'s connections: a thaw of other
    connections only leaves *iv* in force)."""
    mode = str(r.get("mode", ""))
    stream, conns = str(r.get("stream", "both")), r.get("connections")
    if iv.mode not in UNDOES.get(mode, (mode,)):
        return False
    if stream != "both" and iv.stream != stream:
        return False
    return not (conns and iv.connections and not set(conns) & set(iv.connections))


def _end_where(
    open_: list[FaultInterval], t: float, mode: str, ends: Callable[[FaultInterval], bool]
) -> None:
    """End, at *t* and by *mode*, every open interval *ends* picks; they leave *open_*."""
    for iv in list(open_):
        if ends(iv):
            iv.end, iv.removed_by = t, mode
            open_.remove(iv)


def fault_intervals(
    records: Iterable[dict[str, Any]], proxy: str, t0: float
) -> list[FaultInterval]:
    """Fault intervals of one proxy from its event records (in time order).

    A fault never removed has ``end=None``; sever/reset are instants (``end == start``).
    A fault on open connections only has ``released`` set when its clients left them
    all before it ended (see :class:`FaultInterval`).
    """
    records = list(records)
    out: list[FaultInterval] = []
    open_: list[FaultInterval] = []
    toxics: dict[str, FaultInterval] = {}
    scoped: list[FaultInterval] = []
    leaves: dict[Any, list[float]] = {}
    for r in records:
        if _left_by_client(r):
            leaves.setdefault(r.get("conn"), []).append(float(r.get("mono", 0.0)) - t0)
        ev, t = r.get("event"), float(r.get("mono", 0.0)) - t0
        mode = str(r.get("mode", ""))
        if ev == "fault_applied":
            conns = r.get("connections")
            iv = FaultInterval(proxy, mode, t, None, str(r.get("stream", "both")), conns)
            if _holds_only_open_connections(r):
                iv.catches_new = False
                scoped.append(iv)
            if mode in INSTANT_MODES:
                iv.end = t
                # The connections it closed take their freeze or blackhole with them.
                _end_where(open_, t, mode, functools.partial(_closed_with, conns))
            else:
                open_.append(iv)
            out.append(iv)
        elif ev == "fault_removed":
            _end_where(open_, t, mode, functools.partial(_removal_ends, r))
        elif ev == "toxic_added":
            name = str(r.get("toxic"))
            iv = FaultInterval(proxy, f"{r.get('type', 'toxic')} toxic", t, None)
            iv.stream = str(r.get("stream", "both"))
            toxics[name] = iv
            out.append(iv)
        elif ev == "toxic_removed":
            iv = toxics.pop(str(r.get("toxic")), None)
            if iv is not None:
                iv.end, iv.removed_by = t, "toxic_removed"
    for iv in scoped:
        iv.released = released_at(iv, leaves)
    return out
