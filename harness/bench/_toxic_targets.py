"""The toxic lines' targets (issue 32's Targets section) as rows of the bench's target
table, and the report's block of the lines' figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.bench._http import (
    TARGET_HTTP_ADDED_VS_BARE,
    TARGET_HTTP_BULK_VS_BARE,
    TARGET_HTTP_INSTRUCTIONS,
)
from harness.bench._pgbench import TARGET_PG_ADDED_VS_BARE
from harness.bench._targets import Facts, Figure, Target
from harness.bench._toxic import (
    BANDWIDTH_KBPS,
    HOP_PERCENT,
    LATENCY_MS,
    PACINGS_US,
    SLICER,
    TARGET_AFTER_REMOVAL_VS_FRESH,
    TARGET_BANDWIDTH,
    TARGET_HOP_ADDED_VS_BARE,
    TARGET_HOP_BULK_VS_BARE,
    TARGET_LAT0_ADDED_VS_SOCAT,
    TARGET_LAT0_INSTRUCTIONS,
    TARGET_LAT5_BULK_VS_SOCAT,
    TARGET_PACED_SLACK_MS,
    TARGET_REDIS_ADDED_VS_BARE,
    TARGET_SLICER_BULK_VS_SOCAT,
)

__all__ = ["TOXIC_TARGETS", "report_lines"]


# ---------------------------------------------------------------------------------------
# The targets


def _line(f: Facts, name: str) -> dict[str, Any]:
    return (f.extra or {}).get(name) or {}


def _ratio_of(name: str, key: str, socat: bool = False) -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        line = _line(f, name)
        note = line.get("skipped") or (f.socat_note if socat else "")
        return Figure(line.get(key), note)

    return figure


def _lat0_rtt(f: Facts) -> Figure:
    line = _line(f, "latency0")
    where = " (all on one CPU)" if line.get("one_cpu") else ""
    socat_added = line.get("rtt", {}).get("socat", {}).get("added_p50_us")
    if f.socat_note:
        return Figure(line.get("added_vs_socat"), f.socat_note, qualifier=where)
    if socat_added is not None and socat_added <= 0:
        why = "socat added no RTT over direct in this run: ratio undefined"
        return Figure(None, why, qualifier=where)
    return Figure(line.get("added_vs_socat"), qualifier=where)


def _lat0_instructions(f: Facts) -> Figure:
    ins = _line(f, "latency0").get("instructions", {})
    return Figure(ins.get("per_rtt"), ins.get("skipped") or ins.get("error") or "")


def _paced(interval_us: int) -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        paced = _line(f, "latency5").get("paced", {}).get(f"{interval_us}us", {})
        return Figure(paced.get("p50_ms"), paced.get("skipped") or "")

    return figure


def _hop_instructions_note(f: Facts) -> str:
    hop = _line(f, "hop")
    ins = hop.get("instructions", {})
    if "per_rtt" in ins:
        vs = hop.get("instructions_vs_bare")
        return f"hop: {ins['per_rtt']:,} instructions per round trip" + (
            f", {vs:.2f}x bare faultnet's" if vs else ""
        )
    return f"hop instructions: {ins.get('skipped') or ins.get('error') or 'not measured'}"


def _http_instructions(name: str) -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        line = _line(f, name)
        ins = line.get("instructions", {})
        bare = ins.get("bare_per_rtt")
        note = (
            line.get("skipped")
            or ins.get("skipped")
            or ins.get("error")
            or (f"bare proxy: {bare:,}" if bare else "")
        )
        return Figure(ins.get("per_rtt"), note)

    return figure


def _hop_added(f: Facts) -> Figure:
    return Figure(_line(f, "hop").get("added_vs_bare"), _hop_instructions_note(f))


#: The toxic lines' targets, in report order (issue 32's Targets section).
TOXIC_TARGETS: tuple[Target, ...] = (
    Target(f"latency=0: RTT p50 added over direct <= {TARGET_LAT0_ADDED_VS_SOCAT}x socat's",
           _lat0_rtt, TARGET_LAT0_ADDED_VS_SOCAT, "<="),
    Target(f"latency=0: proxy instructions per round trip (callgrind) <= "
           f"{TARGET_LAT0_INSTRUCTIONS:,}",
           _lat0_instructions, TARGET_LAT0_INSTRUCTIONS, "<=", "{:,.0f}"),
    Target(f"latency={LATENCY_MS} ms: bulk >= {TARGET_LAT5_BULK_VS_SOCAT}x socat's",
           _ratio_of("latency5", "bulk_vs_socat", socat=True), TARGET_LAT5_BULK_VS_SOCAT, ">="),
    *(
        Target(f"latency={LATENCY_MS} ms, one 64 B message every {us} us: p50 RTT within "
               f"{LATENCY_MS}-{LATENCY_MS + TARGET_PACED_SLACK_MS:g} ms",
               _paced(us), (LATENCY_MS, LATENCY_MS + TARGET_PACED_SLACK_MS), "within",
               "{:.2f} ms")
        for us in PACINGS_US
    ),
    Target(f"slicer (delay 0, {SLICER['average_size']} ± {SLICER['size_variation']} B): "
           f"bulk >= {TARGET_SLICER_BULK_VS_SOCAT}x socat's",
           _ratio_of("slicer", "bulk_vs_socat", socat=True), TARGET_SLICER_BULK_VS_SOCAT, ">="),
    Target(f"bandwidth {BANDWIDTH_KBPS:,} KB/s: achieved / asked within "
           f"{TARGET_BANDWIDTH[0]}-{TARGET_BANDWIDTH[1]}",
           _ratio_of("bandwidth", "achieved_vs_asked"), TARGET_BANDWIDTH, "within"),
    Target(f"after its only toxic is removed: RTT added <= {TARGET_AFTER_REMOVAL_VS_FRESH}x "
           "a fresh connection's",
           _ratio_of("after_removal", "added_vs_fresh"), TARGET_AFTER_REMOVAL_VS_FRESH, "<="),
    Target(f"hop (loss both ways, {HOP_PERCENT} %): RTT added <= {TARGET_HOP_ADDED_VS_BARE}x "
           "bare faultnet's",
           _hop_added, TARGET_HOP_ADDED_VS_BARE, "<="),
    Target(f"hop (loss both ways, {HOP_PERCENT} %): bulk >= {TARGET_HOP_BULK_VS_BARE}x "
           "bare faultnet's",
           _ratio_of("hop", "bulk_vs_bare"), TARGET_HOP_BULK_VS_BARE, ">="),
    Target("a non-matching redis toxic: added latency on redis-benchmark -P 16 vs bare "
           f"proxy <= {TARGET_REDIS_ADDED_VS_BARE:g}x",
           _ratio_of("redis", "added_vs_bare"), TARGET_REDIS_ADDED_VS_BARE, "<="),
    Target(f"a non-matching postgres toxic: pgbench -S added latency vs bare proxy, "
           f"target <= {TARGET_PG_ADDED_VS_BARE:g}x",
           _ratio_of("postgres", "added_vs_bare"), TARGET_PG_ADDED_VS_BARE, "<="),
    *(
        row
        for name, what in (("http1", "HTTP/1.1"), ("http2", "HTTP/2"))
        for row in (
            Target(f"a non-matching {what} toxic: proxy instructions per keep-alive request "
                   f"(callgrind) <= {TARGET_HTTP_INSTRUCTIONS:,}",
                   _http_instructions(name), TARGET_HTTP_INSTRUCTIONS, "<=", "{:,.0f}"),
            Target(f"a non-matching {what} toxic: added latency per keep-alive request <= "
                   f"{TARGET_HTTP_ADDED_VS_BARE:g}x the bare proxy's",
                   _ratio_of(name, "added_vs_bare"), TARGET_HTTP_ADDED_VS_BARE, "<="),
        )
    ),
    Target("a non-matching HTTP/1.1 toxic: a --toxic-bytes download (issue 33: 100 MB) "
           f">= {TARGET_HTTP_BULK_VS_BARE:g}x the bare proxy's rate",
           _ratio_of("http_bulk", "bulk_vs_bare"), TARGET_HTTP_BULK_VS_BARE, ">="),
)  # fmt: skip


# ---------------------------------------------------------------------------------------
# The report's block


def _arms_line(figures: dict[str, Any], key: str, spec: str) -> str:
    """``arm a / arm b: x / y`` of *key* in each arm's figures."""
    arms = [a for a in figures if isinstance(figures[a], dict)]
    values = [figures[a].get(key) for a in arms]
    shown = " / ".join("-" if v is None else format(v, spec) for v in values)
    return f"{' / '.join(arms)}: {shown}"


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The toxic lines' figures, one line each (the targets judge them below)."""
    out = [f"toxic lines (a second faultnet proxy, pid {doc['proxy_pid']}, each toxic on its "
           "upstream stream)"]  # fmt: skip
    lat0 = doc.get("latency0", {})
    if "rtt" in lat0:
        where = ", all on one CPU" if lat0.get("one_cpu") else ""
        out.append(f"  latency=0: RTT p50 us{where}, {_arms_line(lat0['rtt'], 'p50_us', '.1f')}")
    out.append(f"  latency=0: instructions per round trip: {_shown_instructions(lat0)}")
    lat5 = doc.get("latency5", {})
    if "bulk" in lat5:
        out.append(
            f"  latency={LATENCY_MS} ms: bulk MB/s, {_arms_line(lat5['bulk'], 'mbps', '.0f')}"
        )
    for key, paced in lat5.get("paced", {}).items():
        p50, p99 = paced.get("p50_ms"), paced.get("p99_ms")
        shown = paced.get("skipped") or f"p50 {p50 or 0:.2f} ms, p99 {p99 or 0:.2f} ms"
        out.append(f"  latency={LATENCY_MS} ms, one message every {key[:-2]} us: {shown}")
    for name, label in (("slicer", "slicer"), ("bandwidth", f"bandwidth {BANDWIDTH_KBPS} KB/s")):
        if "bulk" in doc.get(name, {}):
            out.append(f"  {label}: bulk MB/s, {_arms_line(doc[name]['bulk'], 'mbps', '.0f')}")
    removal = doc.get("after_removal", {})
    shown = removal.get("skipped") or _arms_line(removal.get("rtt", {}), "p50_us", ".1f")
    out.append(f"  after removal: RTT p50 us, {shown}")
    shown = _rounds_shown(doc.get("redis", {}))
    out.append(f"  redis (non-matching toxic, -P 16): GET p50 ms, {shown}")
    hop = doc.get("hop", {})
    if "rtt" in hop:
        out.append(f"  hop: RTT p50 us, {_arms_line(hop['rtt'], 'p50_us', '.1f')}")
        out.append(f"  hop: bulk MB/s, {_arms_line(hop['bulk'], 'mbps', '.0f')}")
        out.append(f"  hop: instructions per round trip: {_shown_instructions(hop)}")
    shown = _rounds_shown(doc.get("postgres", {}))
    out.append(f"  postgres: pgbench -S latency average ms, {shown}")
    return out + _http_lines(doc)


def _rounds_shown(line: dict[str, Any]) -> str:
    """A request/response line's arms (:func:`request_rounds`), each its rounds' median
    in ms; or why it was skipped."""
    rounds = line.get("round_p50_ms", {})
    return line.get("skipped") or _arms_line(
        {arm: {"ms": _median(xs)} for arm, xs in rounds.items() if xs}, "ms", ".3f"
    )


def _http_lines(doc: dict[str, Any]) -> list[str]:
    """The HTTP lines' figures (issue 33)."""
    out: list[str] = []
    for name, what in (("http1", "HTTP/1.1"), ("http2", "HTTP/2")):
        line = doc.get(name, {})
        shown = _rounds_shown(line)
        out.append(f"  {what} (non-matching toxic): keep-alive request p50 ms, {shown}")
        out.append(f"  {what}: instructions per request: {_http_shown_instructions(line)}")
    bulk = doc.get("http_bulk", {})
    shown = bulk.get("skipped") or _arms_line(
        {a: {"mbps": v} for a, v in bulk.get("mbps", {}).items()}, "mbps", ".0f"
    )
    out.append(f"  HTTP/1.1 download (non-matching toxic): MB/s, {shown}")
    return out


def _median(xs: list[float | None]) -> float | None:
    got = sorted(x for x in xs if x is not None)
    return got[len(got) // 2] if got else None


def _http_shown_instructions(line: dict[str, Any]) -> str:
    bare = line.get("instructions", {}).get("bare_per_rtt")
    return _shown_instructions(line) + (f"; bare proxy {bare:,}" if bare else "")


def _shown_instructions(line: dict[str, Any]) -> str:
    ins = line.get("instructions", {})
    if "per_rtt" in ins:
        return f"{ins['per_rtt']:,} (callgrind, {ins['round_trips']} round trips)"
    return str(ins.get("skipped") or ins.get("error") or "-")
