"""The hold and freeze phases: many connections held at once (direct, then through
faultnet, with its RSS and CPU per connection), then every one frozen, watched for
silence, and thawed."""

from __future__ import annotations

import socket
import time
from typing import Any

from faultnet.procs import fd_count
from harness.bench._children import Child, proc_cpu_ns, proc_cpu_s, proc_rss_kib
from harness.bench._context import _log, _Run
from harness.bench._measure import _close_all, collect, open_held, watch_silence
from harness.bench._stream import PUSH, THAW_DELIVERY_S, UP


def _hold_phase(ctx: _Run, proxy: Child, upstream: Child) -> None:
    """Connections held: direct first (checks the load generator), then through faultnet,
    whose RSS and CPU are read around the ramp; then the freeze phase over all of them."""
    p, arms, addrs, checks = ctx.p, ctx.arms, ctx.addrs, ctx.checks
    if "socat" in addrs:
        arms["socat"]["hold"] = {"n/a": "socat forks one process per connection"}
    socks, info = open_held(addrs["direct"], p.connections)
    arms["direct"]["hold"] = info
    _log(
        f"hold direct: {info['held']} connections ({info['open_s']} s)"
        + (f"; stopped by: {info['stopped_by']}" if info["stopped_by"] else "")
    )
    _close_all(socks)

    rss0 = proc_rss_kib(proxy.pid)
    cpu0 = proc_cpu_s(proxy.pid)
    socks, info = open_held(addrs["faultnet"], p.connections)
    try:
        cpu1 = proc_cpu_s(proxy.pid)
        if socks and cpu0 is not None and cpu1 is not None:
            info["proxy_cpu_ms_per_conn"] = (cpu1 - cpu0) * 1000 / len(socks)
        time.sleep(0.2)  # the last batch's tasks finish starting before RSS is read
        rss1 = proc_rss_kib(proxy.pid)
        info["rss_before_kib"] = rss0
        info["rss_held_kib"] = rss1
        info["rss_per_conn_kib"] = (
            (rss1 - rss0) / len(socks) if socks and rss0 is not None and rss1 else None
        )
        info["proxy_fds"] = fd_count(proxy.pid)
        arms["faultnet"]["hold"] = info
        _log(
            f"hold faultnet: {info['held']} connections ({info['open_s']} s), "
            f"RSS +{info['rss_per_conn_kib'] or 0:.1f} KiB/conn"
            + (f"; stopped by: {info['stopped_by']}" if info["stopped_by"] else "")
        )
        if socks:
            arms["faultnet"]["freeze"] = _freeze_phase(
                socks, proxy, upstream, p.freeze_window, checks
            )
    finally:
        _close_all(socks)


def _freeze_phase(
    socks: list[socket.socket],
    proxy: Child,
    upstream: Child,
    window: float,
    checks: list[dict[str, Any]],
) -> dict[str, Any]:
    """Freeze every live connection, prove nothing crosses either way, thaw, prove the
    held bytes arrive. Appends its checks; returns the figures."""
    n = len(socks)
    # Nanosecond CPU time (schedstat): in ticks of 10 ms, one tick in a 0.2 s window
    # read as exactly 5 %, judged MISSED while printed "5.0 %".
    c0 = proc_cpu_ns(proxy.pid)
    time.sleep(window)  # the idle window IS the measurement: the proxy's CPU at rest
    c1 = proc_cpu_ns(proxy.pid)
    t0 = time.perf_counter()
    fr = proxy.request("freeze")
    command_ms = (time.perf_counter() - t0) * 1000
    up0 = upstream.request("stats")
    pushed = upstream.request("push")["pushed"]
    unsent = 0
    for s in socks:
        try:
            if s.send(UP) != len(UP):
                unsent += 1
        except OSError:
            unsent += 1
    c2 = proc_cpu_ns(proxy.pid)
    noisy = watch_silence(socks, window)
    c3 = proc_cpu_ns(proxy.pid)
    fds_frozen = fd_count(proxy.pid)
    up1 = upstream.request("stats")
    after = proxy.request("stats")
    # The proxy's counters sum over its live connections: comparable only if none closed.
    lost = fr["connections"] - after["connections"]
    crossed_up = after["bytes_upstream"] - fr["bytes_upstream"]
    crossed_down = after["bytes_downstream"] - fr["bytes_downstream"]
    proxy_moved = lost == 0 and (crossed_up or crossed_down)
    upstream_got = up1["bytes_in"] - up0["bytes_in"]
    th = proxy.request("thaw")
    delivered = collect(socks, PUSH + UP, THAW_DELIVERY_S)
    zero = noisy == 0 and upstream_got == 0 and not proxy_moved
    checks.append(
        {
            "name": "freeze: zero bytes crossed either way after freeze() returned",
            "ok": zero and fr["affected"] == n and pushed == n and unsent == 0,
            "detail": (
                f"{fr['affected']}/{n} frozen, {pushed} pushed down, {n - unsent} sent up; "
                f"within {window:g} s: {noisy} client sockets readable, upstream received "
                f"{upstream_got} B, proxy moved "
                + (f"{crossed_up} B up / {crossed_down} B down" if lost == 0 else "(n/a)")
            ),
        }
    )
    checks.append(
        {
            "name": "freeze: every frozen connection still open after the window",
            "ok": lost == 0,
            "detail": f"{after['connections']} of {fr['connections']} open in the proxy "
            f"(descriptors in use while frozen: {fds_frozen})",
        }
    )
    checks.append(
        {
            "name": "thaw: held bytes delivered in order on every connection",
            "ok": delivered["right"] == n,
            "detail": (
                f"{delivered['right']} of {n} got the {len(PUSH)} pushed then the {len(UP)} "
                f"echoed bytes; {delivered['wrong']} wrong, {delivered['missing']} missing"
                + (
                    f" (first wrong: {delivered['first_wrong'][:40]!r})"
                    if delivered["wrong"]
                    else ""
                )
            ),
        }
    )
    _log(
        f"freeze {fr['affected']} connections: {fr['elapsed_ms']:.2f} ms in the proxy "
        f"({command_ms:.2f} ms round trip); leak: {'none' if zero else 'YES'}"
    )
    cpu = (
        {
            "idle_cpu_pct": (c1 - c0) / 1e9 / window * 100,  # type: ignore[operator]
            "frozen_cpu_pct": (c3 - c2) / 1e9 / window * 100,  # type: ignore[operator]
        }
        if None not in (c0, c1, c2, c3)
        else {}
    )
    return {
        "connections": fr["affected"],
        "elapsed_ms": fr["elapsed_ms"],
        "command_round_trip_ms": command_ms,
        "thaw_ms": th["elapsed_ms"],
        "window_s": window,
        "client_sockets_readable": noisy,
        "upstream_bytes_received": upstream_got,
        "proxy_bytes_upstream": crossed_up,
        "proxy_bytes_downstream": crossed_down,
        "zero_bytes_crossed": zero,
        "connections_lost": lost,
        "proxy_fds_while_frozen": fds_frozen,
        "delivered_after_thaw": delivered,
        **cpu,
    }
