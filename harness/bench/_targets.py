"""The ratios a run's arms give, and the targets judged on them.

The targets are one table (:data:`TARGETS`): each row names a figure of the result, the
bound it is held to and which way (``>=`` or ``<=``), how it is shown and what note goes
with it; :func:`judge` is the one loop that turns a row and its figure into MET, MISSED
or N/A. A figure that was not measured, or that a run could not judge (socat skipped,
fewer connections asked than the target), is N/A with the reason in its note.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.bench._reqresp import PIPELINES
from harness.bench._stream import (
    GIB,
    SOCAT_BUFFER,
    TARGET_CHURN_VS_SOCAT,
    TARGET_CONNECTIONS,
    TARGET_FREEZE_MS,
    TARGET_FROZEN_CPU_PCT,
    TARGET_INSTR_VS_SOCAT,
    TARGET_REQRESP_VS_SOCAT,
    TARGET_RTT_ADDED_VS_SOCAT,
    TARGET_TPUT_VS_DIRECT,
    TARGET_TPUT_VS_SOCAT,
)

__all__ = ["GIB", "TARGETS", "Figure", "Target", "judge", "judge_all", "ratios"]

Arms = dict[str, dict[str, Any]]

# ---------------------------------------------------------------------------------------
# Ratios: faultnet's figures over the other arms'

#: Per-round figures by ratio key: where each arm keeps one value per round.
_ROUND_PATHS: dict[str, tuple[tuple[str, ...], str | None]] = {
    # key: (path to the per-round list, field of each item or None for plain values)
    "throughput": (("bulk", "rounds"), "mbps"),
    "rtt_p50": (("rtt", "round_p50_us"), None),
    "rtt_one_cpu_p50": (("rtt_one_cpu", "round_p50_us"), None),
    "reqresp_p1": (("reqresp", "p1"), None),
    "reqresp_p16": (("reqresp", "p16"), None),
    "churn": (("churn", "rounds"), "per_s"),
    "udp": (("udp", "rounds"), "per_s"),
}

#: The ratios of one figure each (p99s: one figure over every round's samples).
_WHOLE_PATHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("throughput", ("bulk", "mbps")),
    ("rtt_p50", ("rtt", "p50_us")),
    ("rtt_p99", ("rtt", "p99_us")),
    ("rtt_one_cpu_p50", ("rtt_one_cpu", "p50_us")),
    ("rtt_one_cpu_p99", ("rtt_one_cpu", "p99_us")),
    ("reqresp_p1", ("reqresp", "p1_rps")),
    ("reqresp_p16", ("reqresp", "p16_rps")),
    ("churn", ("churn", "per_s")),
    ("udp", ("udp", "per_s")),
)


def get(arms: Mapping[str, Any], arm: str, *path: str) -> Any:
    """``arms[arm][path...]``, or None where a step is missing."""
    v: Any = arms.get(arm, {})
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v


def num(arms: Mapping[str, Any], arm: str, *path: str) -> float | None:
    v = get(arms, arm, *path)
    return v if isinstance(v, int | float) else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _rounds_of(arms: Arms, arm: str, key: str) -> list[float | None]:
    path, field = _ROUND_PATHS[key]
    items = get(arms, arm, *path)
    if not isinstance(items, list):
        return []
    if field is None:
        return [x if isinstance(x, int | float) else None for x in items]
    return [x.get(field) if isinstance(x, dict) else None for x in items]


def median_ratio(xs: list[float | None], ys: list[float | None]) -> float | None:
    """The median of the per-round ratios x/y. Rounds interleave the arms, so each pair
    ran within seconds of each other: load that moves both cancels in their ratio,
    which a ratio of medians taken over different rounds does not do."""
    rs = [x / y for x, y in zip(xs, ys, strict=False) if x is not None and y and y > 0]
    return statistics.median(rs) if rs else None


def request_rounds(p50: dict[str, list[float | None]], bare: str) -> dict[str, Any]:
    """A request/response line's figures from its rounds (*p50*: each arm's figure a
    round, ``direct`` among them): the rounds, each arm's per-round figure over
    ``direct``'s (None where either is missing) and the ``toxic`` arm's added over the
    *bare* arm's (:func:`median_ratio`; None when no round's bare arm added time)."""
    added = {
        arm: [
            None if a is None or d is None else a - d
            for a, d in zip(xs, p50["direct"], strict=True)
        ]
        for arm, xs in p50.items()
        if arm != "direct"
    }
    return {
        "round_p50_ms": p50,
        "round_added_ms": added,
        "added_vs_bare": median_ratio(added["toxic"], added[bare]),
    }


def ratios(arms: Arms) -> dict[str, float | None]:
    """faultnet's figures over direct's and socat's (``KEY_vs_ARM``), and the derived ones."""
    out: dict[str, float | None] = {}
    for key, path in _WHOLE_PATHS:
        for other in ("direct", "socat"):
            if key in _ROUND_PATHS:
                r = median_ratio(_rounds_of(arms, "faultnet", key), _rounds_of(arms, other, key))
            else:
                r = ratio(num(arms, "faultnet", *path), num(arms, other, *path))
            out[f"{key}_vs_{other}"] = r
    for key in ("rtt", "rtt_one_cpu"):
        out[f"{key}_added_vs_socat"] = median_ratio(
            get(arms, "faultnet", key, "round_added_p50_us") or [],
            get(arms, "socat", key, "round_added_p50_us") or [],
        )
    out["throughput_ceiling_vs_direct"] = _throughput_ceiling(arms)
    out["held_vs_direct"] = ratio(
        num(arms, "faultnet", "hold", "held"), num(arms, "direct", "hold", "held")
    )
    out["instructions_vs_socat"] = ratio(
        num(arms, "faultnet", "instructions", "per_rtt"),
        num(arms, "socat", "instructions", "per_rtt"),
    )
    return out


def _throughput_ceiling(arms: Arms) -> float | None:
    """The most the proxy's bulk throughput could be against direct's on this machine,
    from CPU alone: through the proxy a GiB costs the ends' CPU and the proxy's, at best
    spread over every CPU with no wait, so it takes at least that sum over the CPUs;
    direct's took what it took. Their ratio is a ceiling no proxy on these CPUs passes
    (less than the ends' CPU alone would give, as the proxy's own TCP traversal costs
    the sender and receiver too: more segments, more wake-ups)."""
    f, d = arms["faultnet"].get("bulk", {}), arms["direct"].get("bulk", {})
    ends, proxy, cpus, mbps = (
        f.get("ends_cpu_s_per_gib"), f.get("proxy_cpu_s_per_gib"), f.get("cpus"), d.get("mbps")
    )  # fmt: skip
    if not (ends and proxy is not None and cpus and mbps):
        return None
    direct_s_per_gib = GIB / (mbps * 1e6)
    return float(direct_s_per_gib / ((ends + proxy) / cpus))


# ---------------------------------------------------------------------------------------
# The target table and its judge


@dataclass(frozen=True)
class Figure:
    """What a row reads from a run: the value, the note beside it, and whether the run
    can judge it (a value shown but not judged is N/A)."""

    value: float | None
    note: str = ""
    judged: bool = True
    qualifier: str = ""  # appended to the row's name (where the figure was measured)


@dataclass(frozen=True)
class Target:
    """One row: *figure* reads the run (``Facts``), *bound* and *direction* judge it,
    *shown* formats the value (``{}`` is the value)."""

    name: str
    figure: Callable[[Facts], Figure]
    bound: float | tuple[float, float]  # a (low, high) pair for "within"
    direction: str  # ">=": at least the bound; "<=": at most; "within": low <= v <= high
    shown: str = "{:.2f}x"


@dataclass(frozen=True)
class Facts:
    """What the rows read: the arms, their ratios, and what the run was asked."""

    arms: Arms
    ratios: dict[str, float | None]
    connections: int = TARGET_CONNECTIONS
    callgrind: int = 0
    extra: Mapping[str, Any] | None = None  # a section's own figures (the toxic lines)

    @property
    def socat_note(self) -> str:
        return "" if "bulk" in self.arms["socat"] else "socat arm skipped"


def judge(row: Target, facts: Facts) -> dict[str, Any]:
    """One row's verdict: MET, MISSED, or N/A (not measured, or not judged by this run)."""
    fig = row.figure(facts)
    v = fig.value
    status = "N/A" if v is None or not fig.judged else ("MET" if _holds(row, v) else "MISSED")
    shown = "-" if v is None else row.shown.format(v)
    return {
        "target": row.name + fig.qualifier,
        "value": v,
        "status": status,
        "shown": shown,
        "note": fig.note,
    }


def _holds(row: Target, v: float) -> bool:
    b = row.bound
    if row.direction == "within" and isinstance(b, tuple):
        return b[0] <= v <= b[1]
    if row.direction == ">=" and not isinstance(b, tuple):
        return v >= b
    if row.direction == "<=" and not isinstance(b, tuple):
        return v <= b
    raise ValueError(f"a row's direction is >=, <= (one bound) or within (two): {row}")


def judge_all(rows: tuple[Target, ...], facts: Facts) -> list[dict[str, Any]]:
    return [judge(row, facts) for row in rows]


# -- the rows' figures -------------------------------------------------------------------


def _vs_socat(key: str) -> Callable[[Facts], Figure]:
    return lambda f: Figure(f.ratios[key], f.socat_note)


def _tput_direct(f: Facts) -> Figure:
    ceiling = f.ratios["throughput_ceiling_vs_direct"]
    note = ""
    if ceiling is not None:
        note = f"ceiling from CPU on {f.arms['faultnet']['bulk']['cpus']} CPUs: {ceiling:.2f}x"
    return Figure(f.ratios["throughput_vs_direct"], note)


def _rtt_key(f: Facts) -> str:
    # Judged on the one-CPU RTT when it ran: there the added RTT is the proxy's own work.
    # Free-running, an idle vCPU's wake-up dominates and even reorders the arms.
    return "rtt_one_cpu" if "rtt_one_cpu" in f.arms["direct"] else "rtt"


def _rtt_added(f: Facts) -> Figure:
    key = _rtt_key(f)
    t = f.ratios[f"{key}_added_vs_socat"]
    where = " (all on one CPU)" if key == "rtt_one_cpu" else ""
    socat_added = f.arms["socat"].get(key, {}).get("added_p50_us")
    if f.socat_note:
        return Figure(t, f.socat_note, qualifier=where)
    if socat_added is not None and socat_added <= 0:
        why = "socat added no RTT over direct in this run: ratio undefined"
        return Figure(None, why, qualifier=where)
    return Figure(t, qualifier=where)


def _held(f: Facts) -> Figure:
    hold = f.arms["faultnet"].get("hold", {})
    held = hold.get("held")
    # A run asking for fewer than the target cannot meet it; unless it fell short of
    # its own ask, it has not missed it either.
    if f.connections < TARGET_CONNECTIONS and held == f.connections:
        return Figure(held, f"run asked for only {f.connections}", judged=False)
    return Figure(held, hold.get("stopped_by") or "")


def _freeze_ms(f: Facts) -> Figure:
    freeze = f.arms["faultnet"].get("freeze")
    ms = freeze["elapsed_ms"] if freeze else None
    n = freeze["connections"] if freeze else 0
    # Judged only at >= 5000 live connections; above 5000 it is judged as measured (stricter).
    note = f"measured over {n} connections" if ms is not None and n != TARGET_CONNECTIONS else ""
    return Figure(ms, note, judged=n >= TARGET_CONNECTIONS)


def _frozen_cpu(f: Facts) -> Figure:
    freeze = f.arms["faultnet"].get("freeze")
    if not freeze:
        return Figure(None)
    return Figure(freeze["frozen_cpu_pct"], f"over {freeze['connections']} connections")


def _reqresp(n_pipe: int) -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        skipped = f.arms["faultnet"].get("reqresp", {}).get("skipped")
        return Figure(f.ratios[f"reqresp_p{n_pipe}_vs_socat"], skipped or f.socat_note)

    return figure


def _instructions(f: Facts) -> Figure:
    ins = f.arms["faultnet"].get("instructions", {})
    note = ins.get("skipped") or ins.get("error") or ("" if f.callgrind else "not run")
    return Figure(f.ratios["instructions_vs_socat"], note)


#: The bench's targets (issue 2, item 6; issue 14, item 5; issue 22), in report order.
TARGETS: tuple[Target, ...] = (
    Target(f"throughput >= {TARGET_TPUT_VS_SOCAT}x socat -b {SOCAT_BUFFER}",
           _vs_socat("throughput_vs_socat"), TARGET_TPUT_VS_SOCAT, ">="),
    Target(f"throughput >= {TARGET_TPUT_VS_DIRECT}x direct",
           _tput_direct, TARGET_TPUT_VS_DIRECT, ">="),
    Target(f"RTT p50 added over direct <= {TARGET_RTT_ADDED_VS_SOCAT}x socat's added RTT",
           _rtt_added, TARGET_RTT_ADDED_VS_SOCAT, "<="),
    Target(f">= {TARGET_CONNECTIONS} concurrent connections through one proxy process",
           _held, TARGET_CONNECTIONS, ">=", "{}"),
    Target(f"freeze of all {TARGET_CONNECTIONS} connections <= {TARGET_FREEZE_MS:g} ms",
           _freeze_ms, TARGET_FREEZE_MS, "<=", "{:.2f} ms"),
    Target(f"proxy CPU while every connection is frozen <= {TARGET_FROZEN_CPU_PCT:g} %",
           _frozen_cpu, TARGET_FROZEN_CPU_PCT, "<=", "{:.1f} %"),
    *(
        Target(f"request/response (redis GET, -c 20 -P {n}) >= "
               f"{TARGET_REQRESP_VS_SOCAT}x socat's requests/s",
               _reqresp(n), TARGET_REQRESP_VS_SOCAT, ">=")
        for n in PIPELINES
    ),
    Target(f"connection churn >= {TARGET_CHURN_VS_SOCAT}x socat's connections/s",
           _vs_socat("churn_vs_socat"), TARGET_CHURN_VS_SOCAT, ">="),
    Target(f"proxy instructions per round trip (callgrind) <= {TARGET_INSTR_VS_SOCAT}x socat's",
           _instructions, TARGET_INSTR_VS_SOCAT, "<="),
)  # fmt: skip
