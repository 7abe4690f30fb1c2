"""The planner: a pure function from (seed, plan config) to the whole sequence of faults.

Nothing here touches a socket, a process or a file other than the plan file it is
asked to read, so the plan is complete before a run starts, and ``--dry-run`` prints
the very list a real run walks. Every random choice is a numbered draw
(:mod:`faultnet.chaos._draws`); a slot records the counter of its first draw.

Algorithm, per slot: draw a gap (``gap`` units) after the previous slot's start; stop at
``duration``; draw a fault by weight among those with a target of their kind; draw a
target among those not busy with an earlier slot's fault at that moment, or within
``rest`` units after it ended (none free: the slot is a planned skip, reason ``busy``,
so two faults never overlap on one target and an undo never ends another slot's fault);
then the fault's duration and, where it takes one, its stream. A plan stops at
:data:`MAX_SLOTS` slots whatever the gaps, and says so (:attr:`Plan.capped`).

With ``waves = N`` the plan is a storm instead: N waves spread evenly over
``duration``, the first ``gap[0]`` units into its share, each hitting EVERY target at
the same instant (a fault drawn per target, held at most 0.8 of a wave's share).

With ``[ensure]`` (``faults = [...]``, ``duration = D``) a plan that drew no slot of one
of those faults held at least D units has its first attempted proxy slot replaced by
the first of them, held ``max(D, its duration)``; a later slot that now overlaps it on
its target becomes a planned skip, and the slot's detail says ``forced``. (What the
fleet's control needs: a plan in which a post CAN be lost.)

A once-per-run fault stays in the draw: its budget is spent by the run when it FIRES
(see :mod:`faultnet.chaos._run`), so a slot that a rail stopped does not waste it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    #: Units a target stays busy after a fault on it ended (time to recover).
    rest: float = 0.0
    #: 0: slots at drawn gaps; N > 0: a storm of N waves (see the module's docstring).
    waves: int = 0
    #: (fault names, shortest duration): a plan has at least one such slot.
    ensure: tuple[tuple[str, ...], float] | None = None

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
            **({"rest": self.rest} if self.rest else {}),
            **({"waves": self.waves} if self.waves else {}),
            **(
                {"ensure": {"faults": list(self.ensure[0]), "duration": self.ensure[1]}}
                if self.ensure
                else {}
            ),
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
    #: True when the plan stopped at :data:`MAX_SLOTS` before its duration was reached.
    capped: bool = False

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
    capped = False
    if config.waves > 0:
        slots = _storm(config, draws, usable, seed)
        capped = len(slots) >= MAX_SLOTS
    else:
        busy_until: dict[str, float] = {}
        t = 0.0
        while usable:
            if len(slots) >= MAX_SLOTS:
                capped = True
                break
            counter = draws.counter
            t = round(t + draws.uniform(*config.gap), 3)
            if t >= config.duration:
                break
            fault = draws.weighted(usable)
            free = [k for k in config.targets(fault.on) if busy_until.get(k, 0.0) <= t]
            if not free:
                slots.append(Slot(len(slots), counter, t, fault.name, "", 0.0, {}, "busy"))
                continue
            slot = _slot(draws, fault, len(slots), counter, t, draws.choice(free), seed)
            busy_until[slot.target] = round(t + slot.duration + config.rest, 3)
            slots.append(slot)
    if config.ensure is not None:
        slots = _ensure(config, slots, *config.ensure)
    return Plan(seed, seed_chosen, config, tuple(slots), capped)


def _slot(
    draws: Draws,
    fault: Fault,
    index: int,
    counter: int,
    t: float,
    target: str,
    seed: int,
    longest: float | None = None,
) -> Slot:
    """The rest of a slot's draws, in a fixed order: duration, then stream."""
    duration = draws.uniform(*fault.duration) if fault.undo is not None else 0.0
    if longest is not None:
        duration = min(duration, longest)
    return Slot(
        index, counter, t, fault.name, target, duration, _detail(draws, fault, counter, seed)
    )


def _detail(draws: Draws, fault: Fault, counter: int, seed: int) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    if fault.kind == "mode" and fault.takes_stream:
        detail["stream"] = fault.stream or draws.choice(MODE_STREAMS)
    elif fault.kind == "toxic":
        detail["stream"] = fault.stream or draws.choice(STREAMS)
        detail["type"] = fault.name.split(":", 1)[1]
        detail["attributes"] = dict(fault.attributes)
        # Unique per run and slot, so two runs on one proxy never remove each other's.
        detail["name"] = f"chaos_{seed}_{counter}_{detail['type']}"
    elif fault.kind == "episode":
        detail["down"], detail["end"] = fault.down, fault.undo
    if fault.include_new:
        detail["include_new"] = True
    if fault.signal is not None:
        detail["signal"] = fault.signal
    return detail


def _storm(
    config: PlanConfig, draws: Draws, usable: list[tuple[Fault, float]], seed: int
) -> list[Slot]:
    slots: list[Slot] = []
    share = config.duration / config.waves
    for wave in range(config.waves):
        t = round(wave * share + config.gap[0], 3)
        if not usable or t >= config.duration:
            break
        for on in dict.fromkeys(f.on for f, _ in usable):
            kinds = [(f, w) for f, w in usable if f.on == on]
            for target in config.targets(on):
                if len(slots) >= MAX_SLOTS:
                    return slots
                counter = draws.counter
                fault = draws.weighted(kinds)
                slot = _slot(draws, fault, len(slots), counter, t, target, seed, 0.8 * share)
                slots.append(slot)
    return slots


def _ensure(
    config: PlanConfig, slots: list[Slot], names: tuple[str, ...], shortest: float
) -> list[Slot]:
    if any(s.skip is None and s.fault in names and s.duration >= shortest for s in slots):
        return slots
    first = next((s for s in slots if s.skip is None and s.target in config.proxies), None)
    if first is None:
        return slots
    fault = config.faults[names[0]]  # a mode or an episode (load_config checks)
    detail: dict[str, Any] = {"stream": "both"} if fault.takes_stream else {}
    if fault.kind == "episode":
        detail = {"down": fault.down, "end": fault.undo}
    detail["forced"] = f"no {' or '.join(names)} of {shortest:g} units was drawn"
    forced = replace(
        first, fault=fault.name, duration=round(max(shortest, first.duration), 3), detail=detail
    )
    until = forced.at + forced.duration + config.rest
    out = []
    for s in slots:
        if s is first:
            out.append(forced)
        elif s.target == forced.target and s.skip is None and forced.at < s.at < until:
            out.append(replace(s, target="", duration=0.0, detail={}, skip="busy"))
        else:
            out.append(s)
    return out


# -- plan files --------------------------------------------------------------------------
#
# The format, key by key, is faultnet/chaos/sample-plan.toml (`faultnet chaos sample`
# prints it; a test plans and dry-runs it, so it cannot drift from this reader).

_TOP_KEYS = ("duration", "gap", "rest", "waves", "only", "ensure", "targets", "faults")
_TARGET_KEYS = ("proxies", "processes")
_ENSURE_KEYS = ("faults", "duration")


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
        raise PlanError(f"plan file {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, Mapping):
        raise PlanError(f"plan file {path}: expected a table at the top")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise PlanError(
            f"plan file {path}: unknown key {unknown[0]!r} (known: {', '.join(_TOP_KEYS)})"
        )
    return data


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PlanError(f"{what} must be a finite number, not {value!r}")
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


def _gap(value: Any) -> tuple[float, float]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise PlanError(f"gap must be [shortest, longest] units, not {value!r}")
    g = (_number(value[0], "gap"), _number(value[1], "gap"))
    if not 0 < g[0] <= g[1]:
        raise PlanError(f"gap must be [shortest, longest] with 0 < shortest <= longest, not {g}")
    return g


def _faults(data: Mapping[str, Any]) -> dict[str, Fault]:
    """The catalogue with the file's ``[faults.NAME]`` tables applied, then ``only``:
    a table TUNES its fault (every fault it does not name keeps its default weight and
    is drawn); ``only = [...]`` is the list, every other fault's weight becoming 0."""
    tables = data.get("faults", {})
    if not isinstance(tables, Mapping):
        raise PlanError("faults must be a table of [faults.NAME] tables")
    faults = catalogue(tables)
    if "only" in data:
        only = _names(data["only"], "only")
        unknown = [n for n in only if n not in faults]
        if unknown:
            raise PlanError(f"only: unknown fault {unknown[0]!r} (known: {', '.join(faults)})")
        faults = {n: f if n in only else replace(f, weight=0.0) for n, f in faults.items()}
    return faults


def _ensure_of(value: Any, faults: Mapping[str, Fault]) -> tuple[tuple[str, ...], float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != set(_ENSURE_KEYS):
        raise PlanError(f"ensure must be a table of {' and '.join(_ENSURE_KEYS)}")
    names = _names(value["faults"], "ensure.faults")
    for n in names:
        f = faults.get(n)
        if f is None or f.kind not in ("mode", "episode") or f.undo is None:
            raise PlanError(f"ensure.faults: {n!r} is not a mode or episode that is held")
    shortest = _number(value["duration"], "ensure.duration")
    if not names or shortest < 0:
        raise PlanError("ensure needs at least one fault and a duration >= 0")
    return tuple(names), shortest


def load_config(
    path: str | Path | None = None,
    *,
    proxies: Sequence[str] = (),
    processes: Sequence[str] = (),
    servers: Sequence[str] = (),
    duration: float | None = None,
    gap: tuple[float, float] | None = None,
    data: Mapping[str, Any] | None = None,
) -> PlanConfig:
    """A plan config from an optional plan file (TOML, or JSON if it ends in .json), or
    the same keys as *data*, and arguments, which add targets and override the file's
    numbers.

    A proxy target is ``NAME@URL`` (on that server), ``NAME@local`` (in this process),
    or a bare ``NAME``: on each of *servers*, or in this process if none are given.
    Every number must be finite (``--duration 1e400`` is infinity, and refused).
    """
    if data is None:
        data = _read(Path(path)) if path is not None else {}
    elif not isinstance(data, Mapping) or set(data) - set(_TOP_KEYS):
        raise PlanError(f"a plan is a table of {', '.join(_TOP_KEYS)}")
    targets = data.get("targets", {})
    if not isinstance(targets, Mapping) or set(targets) - set(_TARGET_KEYS):
        raise PlanError(f"targets must be a table of {' and '.join(_TARGET_KEYS)}")
    proxy_names = _names(targets.get("proxies", []), "targets.proxies") + list(proxies)
    process_names = _names(targets.get("processes", []), "targets.processes") + list(processes)
    keys = list(dict.fromkeys(k for n in proxy_names for k in _expand(n, servers)))
    dur = _number(duration if duration is not None else data.get("duration", 60.0), "duration")
    if not dur > 0:
        raise PlanError(f"duration must be > 0 units, not {dur}")
    rest = _number(data.get("rest", 0.0), "rest")
    waves = data.get("waves", 0)
    if isinstance(waves, bool) or not isinstance(waves, int) or not 0 <= waves <= MAX_SLOTS:
        raise PlanError(f"waves must be a whole number from 0 to {MAX_SLOTS}, not {waves!r}")
    if rest < 0:
        raise PlanError(f"rest must be >= 0 units, not {rest}")
    faults = _faults(data)
    return PlanConfig(
        faults=faults,
        proxies=tuple(keys),
        processes=tuple(dict.fromkeys(process_names)),
        duration=dur,
        gap=_gap(gap if gap is not None else data.get("gap", (5.0, 15.0))),
        rest=rest,
        waves=waves,
        ensure=_ensure_of(data.get("ensure"), faults),
    )
