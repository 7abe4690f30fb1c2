"""The planner: a pure function from (seed, plan config) to the whole sequence of faults.

Nothing here touches a socket, a process or a file other than the plan file it is
asked to read, so the plan is complete before a run starts, and ``--dry-run`` prints
the very list a real run walks. Every random choice is a numbered draw
(:mod:`faultnet.chaos._draws`); a slot records the counter of its first draw.

Algorithm, per slot: draw a gap (``gap`` units) after the previous slot's start; stop at
``duration``; draw a fault by weight among those with a target of their kind; draw a
target among those not busy with an earlier slot's fault at that moment (none free: the
slot is a planned skip, reason ``busy``, so two faults never overlap on one target and
an undo never ends another slot's fault); then the fault's duration and, where it takes
one, its stream.

A once-per-run fault stays in the draw: its budget is spent by the run when it FIRES
(see :mod:`faultnet.chaos._run`), so a slot that a rail stopped does not waste it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultnet.chaos._catalogue import Fault, PlanError, catalogue
from faultnet.chaos._draws import Draws
from faultnet.toxics import STREAMS

__all__ = [
    "LOCAL",
    "Plan",
    "PlanConfig",
    "Slot",
    "load_config",
    "make_plan",
    "proxy_key",
    "split_proxy_key",
]

#: The "server" of a proxy in this process (Python API).
LOCAL = "local"
#: Streams a mode that takes one may be given (a toxic takes one of STREAMS).
MODE_STREAMS = ("both", *STREAMS)
#: A plan never has more slots than this, whatever the gaps (a typo of gap = [0, 0]).
MAX_SLOTS = 10_000


def proxy_key(name: str, where: str) -> str:
    """A proxy target as the plan and the join log name it: ``NAME@local``, ``NAME@URL``."""
    return f"{name}@{where}"


def split_proxy_key(key: str) -> tuple[str, str]:
    name, sep, where = key.partition("@")
    if not sep or not name or not where:
        raise PlanError(f"proxy target {key!r} is not NAME@local or NAME@URL")
    return name, where.rstrip("/")


def process_key(name: str) -> str:
    return f"process:{name}"


@dataclass(frozen=True)
class PlanConfig:
    """What the planner needs; every number in time units."""

    faults: Mapping[str, Fault]
    #: Proxy targets, ``NAME@local`` or ``NAME@URL``, in the order given.
    proxies: tuple[str, ...] = ()
    #: Process targets: names in the PID allowlist.
    processes: tuple[str, ...] = ()
    #: Slots start before this many units.
    duration: float = 60.0
    #: (shortest, longest) gap between two slot starts, in units.
    gap: tuple[float, float] = (5.0, 15.0)

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers the plan names, in order of first mention."""
        seen = dict.fromkeys(split_proxy_key(p)[1] for p in self.proxies)
        seen.pop(LOCAL, None)
        return tuple(seen)

    def targets(self, on: str) -> tuple[str, ...]:
        if on == "proxy":
            return self.proxies
        return tuple(process_key(n) for n in self.processes)

    def to_json(self) -> dict[str, Any]:
        return {
            "duration": self.duration,
            "gap": list(self.gap),
            "proxies": list(self.proxies),
            "processes": list(self.processes),
            "faults": {name: f.to_json() for name, f in self.faults.items()},
        }


@dataclass(frozen=True)
class Slot:
    """One planned attempt."""

    index: int
    #: The number of the slot's first draw: the join log's ``counter``.
    counter: int
    #: Start, in units from the run's start.
    at: float
    fault: str
    target: str
    #: How long the fault is held before its undo, in units (0: instant).
    duration: float
    #: What the fault is given: stream, toxic attributes, include_new, signal.
    detail: Mapping[str, Any] = field(default_factory=dict)
    #: A planned skip (``busy``: every target of the fault's kind is held by another
    #: slot): logged, never attempted.
    skip: str | None = None


@dataclass(frozen=True)
class Plan:
    seed: int
    #: True when no seed was given and the planner's caller picked one.
    seed_chosen: bool
    config: PlanConfig
    slots: tuple[Slot, ...]

    def timeline(self) -> list[tuple[float, str, Slot]]:
        """Every step a run takes, in order: ``(at, "fault"|"undo", slot)``. An undo
        comes before a fault due at the same moment (the target is free again)."""
        steps: list[tuple[float, int, int, str, Slot]] = []
        for s in self.slots:
            steps.append((s.at, 1, s.index, "fault", s))
            if s.skip is None and self.config.faults[s.fault].undo is not None:
                steps.append((round(s.at + s.duration, 3), 0, s.index, "undo", s))
        steps.sort(key=lambda t: t[:3])
        return [(at, kind, slot) for at, _, _, kind, slot in steps]


def make_plan(config: PlanConfig, seed: int, *, seed_chosen: bool = False) -> Plan:
    """The whole plan for *seed*: pure (same config and seed, same plan, on any host)."""
    draws = Draws(seed)
    usable = [
        (f, f.weight) for f in config.faults.values() if f.weight > 0 and config.targets(f.on)
    ]
    slots: list[Slot] = []
    busy_until: dict[str, float] = {}
    t = 0.0
    while usable and len(slots) < MAX_SLOTS:
        counter = draws.counter
        t = round(t + draws.uniform(*config.gap), 3)
        if t >= config.duration:
            break
        fault = draws.weighted(usable)
        free = [k for k in config.targets(fault.on) if busy_until.get(k, 0.0) <= t]
        if not free:
            slots.append(Slot(len(slots), counter, t, fault.name, "", 0.0, {}, "busy"))
            continue
        target = draws.choice(free)
        duration = draws.uniform(*fault.duration) if fault.undo is not None else 0.0
        detail: dict[str, Any] = {}
        if fault.kind == "mode" and fault.takes_stream:
            detail["stream"] = draws.choice(MODE_STREAMS)
        elif fault.kind == "toxic":
            detail["stream"] = draws.choice(STREAMS)
            detail["type"] = fault.name.split(":", 1)[1]
            detail["attributes"] = dict(fault.attributes)
            # Unique per run and slot, so two runs on one proxy never remove each other's.
            detail["name"] = f"chaos_{seed}_{counter}_{detail['type']}"
        if fault.include_new:
            detail["include_new"] = True
        if fault.signal is not None:
            detail["signal"] = fault.signal
        busy_until[target] = round(t + duration, 3)
        slots.append(Slot(len(slots), counter, t, fault.name, target, duration, detail))
    return Plan(seed, seed_chosen, config, tuple(slots))


# -- plan files --------------------------------------------------------------------------

_TOP_KEYS = ("duration", "gap", "targets", "faults")
_TARGET_KEYS = ("proxies", "processes")


def _read(path: Path) -> Mapping[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read plan file {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(raw)
        else:
            data = tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan file {path}: {exc}") from None
    if not isinstance(data, Mapping):
        raise PlanError(f"plan file {path}: expected a table at the top")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise PlanError(f"plan file {path}: unknown key {unknown[0]!r}")
    return data


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{what} must be a number, not {value!r}")
    return float(value)


def _names(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PlanError(f"{what} must be a list of names")
    return list(value)


def _expand(name: str, servers: Sequence[str]) -> list[str]:
    if "@" in name:
        n, where = split_proxy_key(name)
        return [proxy_key(n, where)]
    return [proxy_key(name, s.rstrip("/")) for s in servers] or [proxy_key(name, LOCAL)]


def load_config(
    path: str | Path | None = None,
    *,
    proxies: Sequence[str] = (),
    processes: Sequence[str] = (),
    servers: Sequence[str] = (),
    duration: float | None = None,
    gap: tuple[float, float] | None = None,
) -> PlanConfig:
    """A plan config from an optional plan file (TOML, or JSON if it ends in .json) and
    arguments, which add targets and override the file's numbers.

    A proxy target is ``NAME@URL`` (on that server), ``NAME@local`` (in this process),
    or a bare ``NAME``: on each of *servers*, or in this process if none are given.
    """
    data = _read(Path(path)) if path is not None else {}
    targets = data.get("targets", {})
    if not isinstance(targets, Mapping) or set(targets) - set(_TARGET_KEYS):
        raise PlanError(f"targets must be a table of {' and '.join(_TARGET_KEYS)}")
    proxy_names = _names(targets.get("proxies", []), "targets.proxies") + list(proxies)
    process_names = _names(targets.get("processes", []), "targets.processes") + list(processes)
    keys = list(dict.fromkeys(k for n in proxy_names for k in _expand(n, servers)))
    dur = duration if duration is not None else _number(data.get("duration", 60.0), "duration")
    if not dur > 0:
        raise PlanError(f"duration must be > 0 units, not {dur}")
    g = gap if gap is not None else data.get("gap", (5.0, 15.0))
    if not isinstance(g, list | tuple) or len(g) != 2:
        raise PlanError(f"gap must be [shortest, longest] units, not {g!r}")
    g = (_number(g[0], "gap"), _number(g[1], "gap"))
    if not 0 < g[0] <= g[1]:
        raise PlanError(f"gap must be [shortest, longest] with 0 < shortest <= longest, not {g}")
    faults = data.get("faults", {})
    if not isinstance(faults, Mapping):
        raise PlanError("faults must be a table of [faults.NAME] tables")
    return PlanConfig(
        faults=catalogue(faults),
        proxies=tuple(keys),
        processes=tuple(dict.fromkeys(process_names)),
        duration=dur,
        gap=g,
    )
