"""What chaos can do: every fault mode of the table, every toxic of the registry, and two
process faults, each with a weight, a duration range and its undo.

Built, never listed by hand: :func:`catalogue` walks the mode table
(:data:`faultnet.modes.MODES`) and :data:`faultnet.toxics.TOXICS`, so a mode or toxic
added there is in the catalogue at once, with the generic defaults below until it is
given better ones. A test goes red if either source has something the catalogue lacks.

Names: a mode by its own name (``freeze``), a toxic as ``toxic:<type>``, a process fault
as ``process:kill`` (SIGKILL, nothing to undo, once per run by default) or
``process:stop`` (SIGSTOP, undone by SIGCONT), a compound episode as
``episode:<down>-<end>`` (see :data:`EPISODES`). Durations are in time units (see
``--time-unit``); an instant fault (sever, reset, kill) has none.

An *episode* takes the connections open at its start down with one mode (``freeze``,
``blackhole``) and, when its duration is up, ends them with a mode that tears them down
(``sever``, ``reset``) acting ONLY on the connections it took (``only=``): a client that
reconnected meanwhile keeps its new connection. It is the outage a thaw cannot end
well: what was held is lost, so a client that claimed delivery without confirmation
has lost it silently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from faultnet.modes import MODES
from faultnet.toxics import STREAMS, TOXICS

__all__ = ["EPISODES", "Fault", "PlanError", "catalogue", "toxic_attribute_names"]

#: The compound episodes: name -> (the mode that takes connections down, the mode that
#: ends them). Each ending is an instant mode acting on connections by id; a test checks
#: both against the mode table.
EPISODES: dict[str, tuple[str, str]] = {
    "episode:freeze-sever": ("freeze", "sever"),
    "episode:blackhole-reset": ("blackhole", "reset"),
}

#: A fault with no entry in :data:`_DEFAULTS`: weight 1, and, if it can be undone, held
#: for 5 to 30 units.
_GENERIC_DURATION = (5.0, 30.0)

#: Sane defaults, by fault name. Toxic attributes are chosen to be felt, not fatal:
#: each default is what a slow or lossy real link does (Toxiproxy's defaults are no-ops).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "freeze": {"weight": 3},
    "blackhole": {"weight": 2},
    "sever": {"weight": 2},
    "reset": {"weight": 2},
    "drop_syn": {"weight": 1, "duration": (5.0, 20.0)},
    "refuse": {"weight": 1, "duration": (5.0, 20.0)},
    "toxic:latency": {"weight": 2, "attributes": {"latency": 500, "jitter": 100}},
    "toxic:bandwidth": {"weight": 1, "attributes": {"rate": 10}},
    "toxic:slicer": {
        "weight": 1,
        "attributes": {"average_size": 16, "size_variation": 8, "delay": 2000},
    },
    "toxic:limit_data": {"weight": 1, "attributes": {"bytes": 4096}},
    "toxic:slow_close": {"weight": 1, "attributes": {"delay": 3000}},
    "toxic:timeout": {"weight": 1, "attributes": {"timeout": 5000}},
    "toxic:reset_peer": {"weight": 1, "attributes": {"timeout": 2000}},
    "toxic:http_abort": {"attributes": {"status": 503, "percent": 20}},
    "toxic:http_delay": {"attributes": {"delay": 2000, "percent": 20}},
    "toxic:dns": {"attributes": {"action": "servfail", "percent": 20}},
    "toxic:redis": {
        "attributes": {
            "fault": "error",
            "error": "LOADING Redis is loading the dataset in memory",
            "percent": 20,
        }
    },
    "toxic:postgres": {"attributes": {"fault": "error", "sqlstate": "40001", "percent": 20}},
    "process:kill": {"weight": 1, "once": True},
    "process:stop": {"weight": 1, "duration": (2.0, 10.0)},
    "episode:freeze-sever": {"weight": 1},
    "episode:blackhole-reset": {"weight": 1},
}


class PlanError(ValueError):
    """A plan file or plan argument that cannot be used; the message says why."""


@dataclass(frozen=True)
class Fault:
    """One entry of the catalogue."""

    name: str
    #: "mode", "toxic", "process" or "episode".
    kind: str
    #: What it is aimed at: "proxy" or "process".
    on: str
    #: The action that undoes it ("thaw", "restore", "remove_toxic", "SIGCONT"; for an
    #: episode the mode that ends it: "sever", "reset"), or None for an instant fault.
    undo: str | None
    #: Whether a stream is drawn for it (both/upstream/downstream for a mode,
    #: upstream/downstream for a toxic).
    takes_stream: bool = False
    weight: float = 1.0
    #: (shortest, longest) in time units; (0, 0) for an instant fault.
    duration: tuple[float, float] = (0.0, 0.0)
    #: At most once per run: the budget is spent when it FIRES, not when planned.
    once: bool = False
    #: Toxic attributes (a toxic's type checks them), or the mode's include_new.
    attributes: Mapping[str, Any] = field(default_factory=dict)
    include_new: bool = False
    #: Process faults: the signal sent.
    signal: str | None = None
    #: Episodes: the mode that takes the connections down (ended by ``undo``, on them).
    down: str | None = None
    #: The stream it is always given (None: drawn per slot, where it takes one).
    stream: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "on": self.on,
            "undo": self.undo,
            "weight": self.weight,
            "duration": list(self.duration),
            "once": self.once,
            "attributes": dict(self.attributes),
            "include_new": self.include_new,
            **({"down": self.down} if self.down else {}),
            **({"stream": self.stream} if self.stream else {}),
        }


def toxic_attribute_names(type_name: str) -> tuple[str, ...]:
    """The attributes the toxic type *type_name* knows, in its declared order."""
    return tuple(a.name for a in getattr(TOXICS[type_name], "ATTRIBUTES", ()))


def _builtin() -> dict[str, Fault]:
    faults: dict[str, Fault] = {}
    for row in MODES.values():
        if row.acts_on == "undo":
            continue  # thaw and restore are how faults end, not faults
        faults[row.name] = Fault(
            row.name,
            "mode",
            "proxy",
            row.undone_by,
            takes_stream=row.takes_stream,
            duration=_GENERIC_DURATION if row.undone_by else (0.0, 0.0),
        )
    for type_name, cls in TOXICS.items():
        name = f"toxic:{type_name}"
        faults[name] = Fault(
            name,
            "toxic",
            "proxy",
            "remove_toxic",
            takes_stream=True,
            # A protocol's toxics (HTTP, TLS) break a link that speaks another protocol:
            # drawn only when a plan file gives them a weight.
            weight=0.0 if cls.both_streams else 1.0,
            duration=_GENERIC_DURATION,
        )
    faults["process:kill"] = Fault("process:kill", "process", "process", None, signal="SIGKILL")
    faults["process:stop"] = Fault(
        "process:stop",
        "process",
        "process",
        "SIGCONT",
        duration=_GENERIC_DURATION,
        signal="SIGSTOP",
    )
    for name, (down, end) in EPISODES.items():
        faults[name] = Fault(name, "episode", "proxy", end, duration=_GENERIC_DURATION, down=down)
    return faults


# -- one validator per key a plan file may set for a fault: (fault, value, where) -> the
# field's new value, or PlanError naming what is wrong.


def _weight(fault: Fault, w: Any, where: str) -> float:
    if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
        raise PlanError(f"{where}: weight must be a number >= 0, not {w!r}")
    return float(w)


def _duration(fault: Fault, d: Any, where: str) -> tuple[float, float]:
    if isinstance(d, int | float) and not isinstance(d, bool):
        d = (d, d)
    if (
        not isinstance(d, list | tuple)
        or len(d) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in d)
        or not 0 <= d[0] <= d[1]
        or not math.isfinite(d[1])
    ):
        raise PlanError(f"{where}: duration must be [shortest, longest] units, not {d!r}")
    if fault.undo is None and d[1] > 0:
        raise PlanError(f"{where}: {fault.name} is instant: it takes no duration")
    return (float(d[0]), float(d[1]))


def _once(fault: Fault, once: Any, where: str) -> bool:
    if not isinstance(once, bool):
        raise PlanError(f"{where}: once must be true or false")
    return once


def _attributes(fault: Fault, attrs: Any, where: str) -> dict[str, Any]:
    if fault.kind != "toxic" or not isinstance(attrs, Mapping):
        raise PlanError(f"{where}: attributes are a table, for toxics only")
    type_name = fault.name.split(":", 1)[1]
    known = toxic_attribute_names(type_name)
    unknown = sorted(set(attrs) - set(known))
    if unknown:
        # The toxic itself ignores unknown keys (as Toxiproxy does), so a misspelt one
        # would leave its default in force without a word.
        raise PlanError(
            f"{where}: unknown attribute {unknown[0]!r} of toxic {type_name} "
            f"(known: {', '.join(known) or 'none'})"
        )
    try:
        TOXICS[type_name].check_attributes(attrs)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{where}: {exc}") from None
    return {**fault.attributes, **attrs}


def _include_new(fault: Fault, value: Any, where: str) -> bool:
    row = MODES.get(fault.name)
    if row is None or not row.takes_include_new or not isinstance(value, bool):
        raise PlanError(f"{where}: include_new is true or false, for freeze-like modes only")
    return value


def _stream(fault: Fault, value: Any, where: str) -> str:
    allowed = ("both", *STREAMS) if fault.kind == "mode" else STREAMS
    if not fault.takes_stream or value not in allowed:
        raise PlanError(
            f"{where}: stream is one of {', '.join(allowed)}, for a fault that takes one"
        )
    return str(value)


#: Key -> its validator; the keys a plan file may set for one fault.
_SETTINGS: dict[str, Any] = {
    "weight": _weight,
    "duration": _duration,
    "once": _once,
    "attributes": _attributes,
    "include_new": _include_new,
    "stream": _stream,
}


def _with(fault: Fault, settings: Mapping[str, Any], where: str) -> Fault:
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_SETTINGS)})")
    changes = {key: _SETTINGS[key](fault, value, where) for key, value in settings.items()}
    return replace(fault, **changes)


def catalogue(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Fault]:
    """Every fault chaos knows, with the defaults and then *overrides* (a plan file's
    ``[faults.NAME]`` tables) applied. An unknown name or key is a :class:`PlanError`."""
    faults = _builtin()
    for name, settings in _DEFAULTS.items():
        if name in faults:
            faults[name] = _with(faults[name], settings, f"default for {name}")
    for name, table in (overrides or {}).items():
        if name not in faults:
            raise PlanError(f"unknown fault {name!r} (known: {', '.join(faults)})")
        if not isinstance(table, Mapping):
            raise PlanError(f"faults.{name} must be a table")
        faults[name] = _with(faults[name], table, f"faults.{name}")
    return faults
