"""The human-readable table of a result document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.bench._scale_targets import report_lines as scale_report_lines
from harness.bench._stream import human_size
from harness.bench._toxic_targets import report_lines

# ---------------------------------------------------------------------------------------
# Report


def _num(spec: str) -> Callable[[Any], str]:
    return lambda v: format(v, spec)


def _leak(v: Any) -> str:
    return "0" if v is True else "SOME"


def _delivered(d: Any) -> str:
    return f"{d['right']}/{d['right'] + d['wrong'] + d['missing']}"


def _cpu_pair(freeze: Any) -> str:
    return f"{freeze['idle_cpu_pct']:.1f} / {freeze['frozen_cpu_pct']:.1f}"


Row = tuple[str, tuple[str, ...], Callable[[Any], str], str | None, str | None]


def _cell(arms: dict[str, Any], arm: str, path: tuple[str, ...], show: Callable[[Any], str]) -> str:
    v: Any = arms.get(arm, {})
    for k in path:
        if isinstance(v, dict) and "n/a" in v:
            return "n/a"
        v = v.get(k) if isinstance(v, dict) and k else v
        if v is None:
            return "-"
    return show(v)


def _spec(p: dict[str, Any]) -> list[Row]:
    """The table's rows: label, path of the figure in each arm, how it is shown, and the
    ratio keys against direct and socat."""
    return [
        (f"bulk MB/s ({human_size(p['bytes'])}, median of {p['rounds']})", ("bulk", "mbps"),
         _num(".0f"), "throughput_vs_direct", "throughput_vs_socat"),
        ("  proxy CPU s/GiB", ("bulk", "proxy_cpu_s_per_gib"), _num(".2f"), None, None),
        ("  ends' CPU s/GiB (sender + receiver)", ("bulk", "ends_cpu_s_per_gib"), _num(".2f"),
         None, None),
        ("RTT p50 us (64 B ping-pong)", ("rtt", "p50_us"), _num(".1f"),
         "rtt_p50_vs_direct", "rtt_p50_vs_socat"),
        ("RTT p99 us", ("rtt", "p99_us"), _num(".1f"), "rtt_p99_vs_direct", "rtt_p99_vs_socat"),
        ("  RTT p50 added over direct us", ("rtt", "added_p50_us"), _num(".1f"),
         None, "rtt_added_vs_socat"),
        ("  proxy CPU us per round trip", ("rtt", "proxy_cpu_us_per_rtt"), _num(".1f"),
         None, None),
        ("RTT p50 us, all on one CPU", ("rtt_one_cpu", "p50_us"), _num(".1f"),
         "rtt_one_cpu_p50_vs_direct", "rtt_one_cpu_p50_vs_socat"),
        ("RTT p99 us, all on one CPU", ("rtt_one_cpu", "p99_us"), _num(".1f"),
         "rtt_one_cpu_p99_vs_direct", "rtt_one_cpu_p99_vs_socat"),
        ("  RTT p50 added over direct us", ("rtt_one_cpu", "added_p50_us"), _num(".1f"),
         None, "rtt_one_cpu_added_vs_socat"),
        ("  proxy CPU us per round trip", ("rtt_one_cpu", "proxy_cpu_us_per_rtt"),
         _num(".1f"), None, None),
        ("proxy instructions per round trip (callgrind)", ("instructions", "per_rtt"),
         _num(".0f"), None, "instructions_vs_socat"),
        ("redis GET req/s, -c 20 -P 1", ("reqresp", "p1_rps"), _num(".0f"),
         "reqresp_p1_vs_direct", "reqresp_p1_vs_socat"),
        ("redis GET req/s, -c 20 -P 16", ("reqresp", "p16_rps"), _num(".0f"),
         "reqresp_p16_vs_direct", "reqresp_p16_vs_socat"),
        ("churn connections/s (connect, 1 RTT, close)", ("churn", "per_s"), _num(".0f"),
         "churn_vs_direct", "churn_vs_socat"),
        ("  churn p99 us per connection", ("churn", "p99_us"), _num(".0f"), None, None),
        *[
            row
            for pct in (0, 1, 5)
            for row in (
                (f"bulk MB/s at {pct} % loss ({human_size(p.get('loss_bytes') or 0)})",
                 ("loss", f"p{pct}", "mbps"), _num(".0f"), None, None),
                ("  sender retransmits per transfer", ("loss", f"p{pct}", "retransmits"),
                 _num(".0f"), None, None),
                ("  of them needed (the proxy lacked the segment)",
                 ("loss", f"p{pct}", "retransmits_needed"), _num(".0f"), None, None),
            )
        ],
        ("UDP datagrams/s (64 B echo round trips)", ("udp", "per_s"), _num(".0f"),
         "udp_vs_direct", None),
        (f"connections held (asked {p['connections']})", ("hold", "held"), _num("d"),
         "held_vs_direct", None),
        ("  proxy CPU ms per connection opened", ("hold", "proxy_cpu_ms_per_conn"),
         _num(".3f"), None, None),
        ("  proxy RSS KiB per idle connection", ("hold", "rss_per_conn_kib"), _num(".2f"),
         None, None),
        ("freeze all: ms inside the proxy", ("freeze", "elapsed_ms"), _num(".2f"), None, None),
        ("  bytes crossed after freeze", ("freeze", "zero_bytes_crossed"), _leak, None, None),
        ("  connections lost while frozen", ("freeze", "connections_lost"), _num("d"),
         None, None),
        ("  proxy descriptors while frozen", ("freeze", "proxy_fds_while_frozen"), _num("d"),
         None, None),
        ("  proxy CPU % idle / frozen", ("freeze", ""), _cpu_pair, None, None),
        ("  thaw: connections given their held bytes", ("freeze", "delivered_after_thaw"),
         _delivered, None, None),
    ]  # fmt: skip


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """*rows* as aligned text: the first column to the left, the others to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in rows
    ]


def _context_lines(res: dict[str, Any]) -> list[str]:
    """What a reader needs beside the figures: skipped arms, load, plane, RTT client."""
    lines = []
    skipped = res["arms"]["socat"].get("skipped")
    if skipped:
        hint = " (install it: apt-get install socat)" if "not found" in skipped else ""
        lines.append(f"socat arm skipped: {skipped}{hint}")
    load = res.get("loadavg")
    if load:
        end = res.get("loadavg_end") or ["?"]
        plane = res["params"].get("dataplane") or "proxy default"
        lines.append(f"load average at start {load[0]:.2f} (end {end[0]}); data plane: {plane}")
    if res.get("rtt_client"):
        lines.append(f"RTT client: {res['rtt_client']}; ratios: medians of per-round ratios")
    return lines


def format_report(res: dict[str, Any]) -> str:
    """The human table: one row per figure, the three arms, and faultnet's ratios; then
    the targets (MET / MISSED / N/A) and the checks."""
    arms, ratios = res["arms"], res["ratios"]

    def ratio(key: str | None) -> str:
        v = ratios.get(key) if key else None
        return "-" if v is None else f"{v:.2f}x"

    rows: list[tuple[str, ...]] = [("", "direct", "socat", "faultnet", "fn/direct", "fn/socat")]
    for label, path, show, rd, rs in _spec(res["params"]):
        cells = tuple(_cell(arms, a, path, show) for a in ("direct", "socat", "faultnet"))
        rows.append((label, *cells, ratio(rd), ratio(rs)))
    lines = table(rows) + _context_lines(res)
    if "toxic" in res:
        lines += ["", *report_lines(res["toxic"])]
    if "scale" in res:
        lines += ["", *scale_report_lines(res["scale"])]
    lines += ["", "targets"]
    for t in res["targets"]:
        note = f"  ({t['note']})" if t["note"] else ""
        lines.append(f"  {t['status']:6}  {t['target']}: {t['shown']}{note}")
    lines += ["", "checks"]
    for c in res["checks"]:
        lines.append(f"  {'ok' if c['ok'] else 'FAILED':6}  {c['name']}: {c['detail']}")
    return "\n".join(lines)
