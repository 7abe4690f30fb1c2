"""The fleet's fault plan: a ``faultnet chaos`` plan document, planned by chaos.

The fleet has no planner of its own. It writes the plan as chaos reads it
(:func:`plan_document`: the keys of a plan file) and hands it to
:func:`faultnet.chaos.load_config` and :func:`faultnet.chaos.make_plan`; the run keeps
the document as ``chaos-plan.json``, so ``faultnet chaos plan --plan chaos-plan.json
--target w01 ...`` prints the very plan a run walked (the targets there are the run's
bot labels, proxies in the fleet's process).

Two documents, by ``--planner``:

* ``episodes`` (the default): outages of a link that end one of two ways, or an instant
  fault -- ``freeze``/``blackhole`` then ``thaw`` (held bytes delivered late),
  ``episode:freeze-sever``/``episode:blackhole-reset`` (the outage ends with the
  connections it took torn down: what was held is lost, the case that turns a post
  claimed without confirmation into silent loss), ``sever``/``reset`` alone. A link
  rests :data:`GAP`\\[0] after an episode (to reconnect and post again). ``main`` and
  ``control`` draw at gaps and :data:`ENSURED` one lossy outage of three post intervals
  (the control must be able to lose a post, or its passing says nothing); ``storm`` is
  :data:`STORM_WAVES` waves, each taking every link down at the same instant;
* ``chaos``: the link faults (freeze, blackhole, sever, reset) at chaos's own weights.

``--chaos-plan FILE`` replaces the document with the file. Time units are seconds at
time scale 1.0 (the runner's time unit is the scale factor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faultnet.chaos import Plan, PlanConfig, load_config, make_plan

__all__ = [
    "ENSURED",
    "EPISODE_WEIGHTS",
    "FAULT_PHASE",
    "GAP",
    "LOSSY",
    "OUTAGE",
    "POST_INTERVAL",
    "STORM_WAVES",
    "fleet_config",
    "fleet_plan",
    "plan_document",
    "slots_json",
]

#: Scenario timings in seconds at time scale 1.0 (the bot's own are in _timescale.REAL).
POST_INTERVAL = 5.0  # a bot's mean gap between posts; each bot's own pace is 0.6-1.4x
FAULT_PHASE = 240.0  # how long the schedule runs
OUTAGE = (8.0, 120.0)  # an outage episode's length: either side of the 90 s detection
GAP = (4.0, 16.0)  # main: between episode starts (on any link)
STORM_WAVES = 3

#: The episodes planner's faults and weights: the mix the fleet drew when it planned for
#: itself (a freeze's two endings twice as likely as any other kind).
EPISODE_WEIGHTS: dict[str, float] = {
    "freeze": 2.0,
    "episode:freeze-sever": 2.0,
    "blackhole": 1.0,
    "episode:blackhole-reset": 1.0,
    "sever": 1.0,
    "reset": 1.0,
}
#: The outages that end by tearing the connection down: held bytes are lost.
LOSSY = ("episode:freeze-sever", "episode:blackhole-reset")
#: What a main or control plan always has: a lossy outage of three post intervals.
ENSURED = {"faults": [LOSSY[0]], "duration": 3 * POST_INTERVAL}
#: The faults a link has, for ``--planner chaos``.
CHAOS_LINK_FAULTS = ("freeze", "blackhole", "sever", "reset")
_HELD = ("freeze", "blackhole", *LOSSY)


def plan_document(mode: str, planner: str, phase: float = FAULT_PHASE) -> dict[str, Any]:
    """The plan, as the keys of a chaos plan file (pure)."""
    if planner == "chaos":
        return {
            "duration": phase,
            "gap": list(GAP),
            "only": list(CHAOS_LINK_FAULTS),
            "faults": {n: {"duration": list(OUTAGE)} for n in ("freeze", "blackhole")},
        }
    doc: dict[str, Any] = {
        "duration": phase,
        "gap": list(GAP),
        "rest": GAP[0],
        "only": list(EPISODE_WEIGHTS),
        "faults": {
            name: {"weight": w}
            | ({"duration": list(OUTAGE)} if name in _HELD else {})
            # An outage takes the whole link down, as it always has in the fleet.
            | ({"stream": "both"} if name == "freeze" else {})
            for name, w in EPISODE_WEIGHTS.items()
        },
    }
    if mode == "storm":
        doc["waves"] = STORM_WAVES
    else:
        doc["ensure"] = dict(ENSURED)
    return doc


def fleet_config(
    labels: list[str],
    mode: str,
    planner: str,
    phase: float = FAULT_PHASE,
    chaos_plan: Path | None = None,
) -> tuple[PlanConfig, dict[str, Any] | None]:
    """The plan's config on the links *labels*, and the document it came from (None when
    it came from the file *chaos_plan*). :class:`faultnet.chaos.PlanError` if the file
    cannot be used."""
    if chaos_plan is not None:
        return load_config(chaos_plan, proxies=labels, duration=phase), None
    doc = plan_document(mode, planner, phase)
    return load_config(data=doc, proxies=labels), doc


def fleet_plan(
    seed: int, labels: list[str], mode: str, planner: str = "episodes", phase: float = FAULT_PHASE
) -> Plan:
    """The whole schedule, computed before anything is touched (pure)."""
    return make_plan(fleet_config(labels, mode, planner, phase)[0], seed)


def slots_json(plan: Plan) -> list[dict[str, Any]]:
    """The plan as the manifest keeps it: one entry per slot."""
    return [
        {
            "counter": sl.counter,
            "fault": sl.fault,
            "target": sl.target,
            "at_units": sl.at,
            "duration_units": sl.duration,
            "skip": sl.skip,
        }
        for sl in plan.slots
    ]
