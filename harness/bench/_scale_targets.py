"""The scale lines' targets (issue 36's Targets section) as rows of the bench's target
table, and the report's block of the lines' figures.

The targets are stated at 1,000 proxies and at 9,000 connections: a run at other sizes
shows its figures beside them, not judged (N/A, the size in the note)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.bench._targets import Facts, Figure, Target

__all__ = ["SCALE_TARGETS", "TARGET_CONNECTIONS", "TARGET_PROXIES", "report_lines"]

#: Where the targets are stated: proxies in one server, connections on one proxy.
TARGET_PROXIES = 1000
TARGET_CONNECTIONS = 9000

#: Targets (issue 36's Targets section). Reported with MET/MISSED; never asserted by tests.
TARGET_RSS_MIB = 64
TARGET_CREATE_S = 1.0
TARGET_LISTING_MS = 5.0
TARGET_TOXIC_MS = 0.5
TARGET_TOXIC_CONNS_MS = 200.0
TARGET_FREEZE_MS = 60.0
TARGET_FAULTS_MS = 2.0
TARGET_RSS_PER_CONN_KIB = 6.0


# ---------------------------------------------------------------------------------------
# The targets


def _proxies(key: str) -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        line = (f.extra or {}).get("proxies") or {}
        n = line.get("proxies")
        if n != TARGET_PROXIES:
            return Figure(line.get(key), f"at {n} proxies: judged at {TARGET_PROXIES:,}", False)
        return Figure(line.get(key))

    return figure


def _top_level(f: Facts, line: str) -> dict[str, Any]:
    levels = [x for x in ((f.extra or {}).get(line) or {}).get("levels", [])
              if "skipped" not in x]  # fmt: skip
    return levels[-1] if levels else {}


def _connections(key: str, line: str = "connections") -> Callable[[Facts], Figure]:
    def figure(f: Facts) -> Figure:
        level = _top_level(f, line)
        n = level.get("connections")
        where = f" (at {n:,} connections)" if n else ""
        if n != TARGET_CONNECTIONS:
            cap = (f.extra or {}).get("connection_cap")
            why = f"judged at {TARGET_CONNECTIONS:,}" + (
                f"; this machine's descriptor limit allows {cap:,}" if cap is not None else ""
            )
            return Figure(level.get(key), why, False, where)
        return Figure(level.get(key), qualifier=where)

    return figure


#: The scale lines' targets, in issue 36's table order.
SCALE_TARGETS: tuple[Target, ...] = (
    Target(f"server RSS with {TARGET_PROXIES:,} idle proxies <= {TARGET_RSS_MIB} MiB",
           _proxies("rss_mib"), TARGET_RSS_MIB, "<=", "{:.1f} MiB"),
    Target(f"create {TARGET_PROXIES:,} proxies through the API <= {TARGET_CREATE_S:g} s",
           _proxies("create_s"), TARGET_CREATE_S, "<=", "{:.2f} s"),
    Target(f"GET /proxies with {TARGET_PROXIES:,} proxies: p50 <= {TARGET_LISTING_MS:g} ms",
           _proxies("get_proxies_p50_ms"), TARGET_LISTING_MS, "<=", "{:.2f} ms"),
    Target(f"toxic add, {TARGET_PROXIES:,} proxies: p50 <= {TARGET_TOXIC_MS:g} ms",
           _proxies("toxic_add_p50_ms"), TARGET_TOXIC_MS, "<=", "{:.2f} ms"),
    Target(f"toxic remove, {TARGET_PROXIES:,} proxies: p50 <= {TARGET_TOXIC_MS:g} ms",
           _proxies("toxic_remove_p50_ms"), TARGET_TOXIC_MS, "<=", "{:.2f} ms"),
    Target(f"latency toxic add (first) <= {TARGET_TOXIC_CONNS_MS:g} ms",
           _connections("toxic_add_first_ms"), TARGET_TOXIC_CONNS_MS, "<=", "{:.0f} ms"),
    Target(f"latency toxic add (again) <= {TARGET_TOXIC_CONNS_MS:g} ms",
           _connections("toxic_add_again_ms"), TARGET_TOXIC_CONNS_MS, "<=", "{:.0f} ms"),
    Target(f"latency toxic remove (first) <= {TARGET_TOXIC_CONNS_MS:g} ms",
           _connections("toxic_remove_first_ms"), TARGET_TOXIC_CONNS_MS, "<=", "{:.0f} ms"),
    Target(f"freeze of every connection through the API: p50 <= {TARGET_FREEZE_MS:g} ms",
           _connections("freeze_p50_ms"), TARGET_FREEZE_MS, "<=", "{:.1f} ms"),
    Target(f"GET /proxies/P/faults: p50 <= {TARGET_FAULTS_MS:g} ms",
           _connections("faults_p50_ms"), TARGET_FAULTS_MS, "<=", "{:.2f} ms"),
    Target(f"RSS per idle connection <= {TARGET_RSS_PER_CONN_KIB:g} KiB",
           _connections("rss_per_connection_kib", "idle"), TARGET_RSS_PER_CONN_KIB, "<=",
           "{:.2f} KiB"),
)  # fmt: skip


# ---------------------------------------------------------------------------------------
# The report's block


def _v(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report_lines(doc: dict[str, Any]) -> list[str]:
    """The scale lines' figures, one line each (the targets judge them below)."""
    cap, asked = doc.get("connection_cap"), doc.get("levels_asked", [])
    out = [f"scale lines (faultnet servers, pids {doc.get('server_pid')} and "
           f"{doc.get('connections_server_pid')}; descriptor limit {doc.get('fd_limit')}: "
           f"up to {cap} connections on one proxy here)"]  # fmt: skip
    capped = [n for n in asked if cap is not None and n > cap]
    if capped:
        out.append(f"  levels {capped} exceed what the descriptor limit allows: run at {cap}")
    px = doc.get("proxies", {})
    if px:
        out.append(
            f"  {px['proxies']} proxies: RSS {_v(px.get('rss_mib'), '.1f')} MiB "
            f"({_v(px.get('threads'), 'd')} threads; at rest {_v(px.get('rss_at_rest_mib'), '.1f')}"
            f" MiB, {_v(px.get('threads_at_rest'), 'd')} threads), created in "
            f"{_v(px.get('create_s'), '.2f')} s"
        )
        out.append(
            f"  {px['proxies']} proxies: GET /proxies p50 {_v(px.get('get_proxies_p50_ms'), '.2f')}"
            f" ms (GET /version: {_v(px.get('version_p50_ms'), '.2f')} ms); toxic add / remove p50 {_v(px.get('toxic_add_p50_ms'), '.2f')} / "
            f"{_v(px.get('toxic_remove_p50_ms'), '.2f')} ms"
        )
    for lv in (doc.get("connections") or {}).get("levels", []):
        n = lv["connections"]
        if "skipped" in lv:
            out.append(f"  {n} connections: not run ({lv['skipped']})")
            continue
        out.append(
            f"  {n} connections: freeze p50 {_v(lv.get('freeze_p50_ms'), '.1f')} ms, "
            f"GET /faults p50 {_v(lv.get('faults_p50_ms'), '.2f')} ms"
        )
        out.append(
            f"  {n} connections: latency toxic add first / again "
            f"{_v(lv.get('toxic_add_first_ms'), '.0f')} / {_v(lv.get('toxic_add_again_ms'), '.0f')}"
            f" ms, remove first / again {_v(lv.get('toxic_remove_first_ms'), '.0f')} / "
            f"{_v(lv.get('toxic_remove_again_ms'), '.0f')} ms"
        )
    idle = [lv for lv in (doc.get("idle") or {}).get("levels", []) if "skipped" not in lv]
    if idle:
        shown = ", ".join(
            f"{lv['connections']}: {_v(lv.get('rss_per_connection_kib'), '.2f')}" for lv in idle
        )
        out.append(f"  RSS per idle connection, KiB (a server doing nothing else): {shown}")
    return out
