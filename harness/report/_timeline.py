"""Draw a :class:`~harness.report._model.Report` as one timeline figure (PNG and SVG).

Layout: one panel per run, stacked on a shared time axis (so a pair's two arms line up
on their fault); in each panel one lane per proxy, bot and observer. Fault intervals are
shaded bands across the lanes they act on (the proxy and every bot behind it), labelled
with their mode. On the proxy's lane a band runs from the fault applied to the fault
removed; on a bot's lane it ends where the fault stopped mattering to the clients: a
fault on the connections open when it was applied (not on new ones) ends there when the
bot dropped the connection it held
(:meth:`~harness.report._model.FaultInterval.end_on`), so a bot that reconnected round a
freeze is drawn outside the band from its reconnect on. Posts are marks coloured by
outcome (:data:`OUTCOMES`; a silent loss is large and red), and the outcomes with a
``tally`` are counted beside the first of them ("9 SILENT LOSSES", "4 UNCONFIRMED");
detections and reconnects are markers (:data:`DETECTIONS`). Each panel's title carries
its checks' verdict.

:func:`draw` returns the figure and the list of everything it drew (:class:`Drawn`), so
tests can hold the picture to the evidence without reading pixels. Every group of
artists also carries an SVG id (``gid``) naming what it is, so the inline SVG in the page
can be checked the same way.

matplotlib is used through its object API (``Figure``, no pyplot): no global figure
state, no GUI backend; the Agg canvas renders the PNG.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report._model import DETECTIONS, OUTCOMES, Report, Run

__all__ = ["Drawn", "draw", "save", "save_png", "save_svg"]

#: Band colours per fault mode (anything else, e.g. a toxic, is drawn in the last one).
_MODE_COLORS = {
    "freeze": "#64b5f6",
    "blackhole": "#424242",
    "drop_syn": "#ba68c8",
    "refuse": "#f06292",
    "sever": "#e53935",
    "severed": "#e53935",
    "reset": "#b71c1c",
}
_TOXIC_COLOR = "#ffd54f"
_LANE_H = 0.55  # inches per lane; measured to keep 3 lanes readable at 110 dpi


@dataclass(frozen=True)
class Drawn:
    """One thing drawn: a fault band, a post or a marker, where, and its SVG group id."""

    kind: str  # "fault", "post", "marker"
    run: int
    lane: str
    t: float
    what: str  # the fault's mode, the post's outcome, the marker's kind
    end: float | None = None
    gid: str = ""


def _darker(color: str, by: float = 0.6) -> str:
    """*color* (``#rrggbb``) darkened: a light outcome colour read as text on white."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c * by):02x}" for c in rgb)


def _panel_title(run: Run) -> tuple[str, str]:
    checks = run.checks
    npass = sum(1 for c in checks if c.get("passed"))
    verdict = run.verdict()
    head = "PASS" if verdict == "PASS" else "FAIL"
    failed = [c["name"] for c in checks if not c.get("passed")]
    text = f"{run.title}: {head}, {npass}/{len(checks)} checks passed"
    if failed:
        text += "\nFAILED: " + "; ".join(failed)
    elif run.error:
        text += f"\nDID NOT COMPLETE: {run.error}"
    return text, ("#1b5e20" if head == "PASS" else "#b71c1c")


def draw(report: Report) -> tuple[Any, list[Drawn]]:
    """Build the figure for *report*; return it and what was drawn."""
    from matplotlib.collections import PatchCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    runs = report.runs
    heights = [max(1, len(r.lanes)) for r in runs]
    fig = Figure(figsize=(12, 6), dpi=110)  # the height is set once the legend is known
    axes = fig.subplots(
        nrows=len(runs), ncols=1, sharex=True, squeeze=False, height_ratios=heights
    )[:, 0]
    drawn: list[Drawn] = []
    seen: dict[str, tuple[str, str, str]] = {}  # legend: label -> (color, marker, kind)
    t_min = min(
        [0.0, *(p.t for r in runs for p in r.posts), *(m.t for r in runs for m in r.markers)]
    )
    t_max = max([1.0, *(r.end for r in runs)])

    for ri, (ax, run) in enumerate(zip(axes, runs, strict=True)):
        ys = {ln.id: len(run.lanes) - 1 - i for i, ln in enumerate(run.lanes)}
        ax.set_ylim(-0.6, len(run.lanes) - 0.4)
        ax.set_yticks([ys[ln.id] for ln in run.lanes], [ln.title for ln in run.lanes], fontsize=8)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        for y in ys.values():
            ax.axhline(y, color="#eeeeee", linewidth=0.8, zorder=0)
        title, color = _panel_title(run)
        ax.set_title(title, fontsize=9, color=color, loc="left")

        # Fault bands: on the proxy's lane and on every bot lane behind it.
        for fi, f in enumerate(run.faults):
            lanes = [ln.id for ln in run.lanes if ln.id == f"proxy:{f.proxy}" or ln.via == f.proxy]
            if not lanes:
                continue
            col = _MODE_COLORS.get(f.mode, _TOXIC_COLOR)
            gid = f"fault-{ri}-{fi}-{f.mode.replace(' ', '_')}"
            # The proxy holds it until removed; a client behind it, until it left.
            ends = {ln: f.end_on(ln) for ln in lanes}
            label = f.mode + ("" if f.stream == "both" else f" ({f.stream})")
            if f.end is None:
                label += " (never removed)"
            top = max(ys[ln] for ln in lanes) + 0.45
            # One band per lane: the lanes a fault acts on need not be adjacent.
            if f.instant:
                art = ax.vlines(
                    [f.start] * len(lanes),
                    [ys[ln] - 0.45 for ln in lanes],
                    [ys[ln] + 0.45 for ln in lanes],
                    color=col,
                    linewidth=2.5,
                )
            else:
                art = PatchCollection(
                    [
                        Rectangle(
                            (f.start, ys[ln] - 0.45),
                            max((t_max if ends[ln] is None else ends[ln]) - f.start, 1e-6),
                            0.9,
                        )
                        for ln in lanes
                    ],
                    facecolors=col,
                    alpha=0.25,
                    edgecolors=col,
                    linewidths=1.0,
                    zorder=1,
                )
                ax.add_collection(art)
            art.set_gid(gid)
            ax.text(
                f.start,
                top,
                f" {label}",
                fontsize=8,
                va="top",
                ha="left",
                color="#0d47a1",
                zorder=5,
            )
            for ln in lanes:
                drawn.append(Drawn("fault", ri, ln, f.start, f.mode, ends[ln], gid))

        # Posts: the call's duration as a thin line, the post as a mark by outcome.
        for p in run.posts:
            y = ys.get(p.lane)
            if y is not None and p.t_end > p.t:
                ax.plot([p.t, p.t_end], [y, y], color="#bdbdbd", linewidth=1.2, zorder=2)
        for name, oc in OUTCOMES.items():
            pts = [p for p in run.posts if p.outcome == name and p.lane in ys]
            if not pts:
                continue
            gid = f"posts-{ri}-{name}"
            (art,) = ax.plot(
                [p.t for p in pts],
                [ys[p.lane] for p in pts],
                linestyle="none",
                marker=oc.marker,
                markersize=13 if oc.loud else 7,
                markerfacecolor=oc.color,
                markeredgecolor="black" if oc.loud else oc.color,
                markeredgewidth=0.8,
                zorder=6 if oc.loud else 4,
            )
            art.set_gid(gid)
            seen.setdefault(oc.label, (oc.color, oc.marker, "post"))
            for p in pts:
                drawn.append(Drawn("post", ri, p.lane, p.t, name, p.t_end, gid))
            if oc.tally[0]:
                first = pts[0]
                tally = ax.annotate(
                    f"{len(pts)} {oc.tally[len(pts) > 1]}",
                    (first.t, ys[first.lane]),
                    xytext=(0, 14 if oc.loud else 10),
                    textcoords="offset points",
                    fontsize=9,
                    fontweight="bold",
                    color=oc.color if oc.loud else _darker(oc.color),
                    zorder=7,
                )
                tally.set_gid(f"tally-{ri}-{name}")

        # Markers: detections, reconnects, proxy connections, observer receipts.
        for kind, (label, col, mk) in DETECTIONS.items():
            ms = [m for m in run.markers if m.kind == kind and m.lane in ys]
            if not ms:
                continue
            gid = f"markers-{ri}-{kind}"
            # Detections above the lane, reconnects below it: they are often ms apart.
            lift = {"pong_timeout": 0.28, "connection_lost": 0.28, "reconnected": -0.28}
            big = kind in lift
            (art,) = ax.plot(
                [m.t for m in ms],
                [ys[m.lane] + lift.get(kind, 0.0) for m in ms],
                linestyle="none",
                marker=mk,
                markersize=9 if big else 6,
                color=col,
                zorder=5,
            )
            art.set_gid(gid)
            seen.setdefault(label, (col, mk, "marker"))
            for m in ms:
                drawn.append(Drawn("marker", ri, m.lane, m.t, kind, None, gid))
        for m in run.markers:
            if m.kind not in DETECTIONS and m.lane in ys:  # a kind nobody declared yet
                ax.plot([m.t], [ys[m.lane]], marker="o", color="#9e9e9e", zorder=5)
                drawn.append(Drawn("marker", ri, m.lane, m.t, m.kind, None, f"markers-{ri}-other"))

    span = t_max - t_min
    axes[-1].set_xlim(t_min - 0.02 * span, t_max + 0.02 * span)
    origins = {r.origin for r in runs}
    axes[-1].set_xlabel(
        "seconds since "
        + (origins.pop() if len(origins) == 1 else "each run's first fault")
        + " (t = 0)",
        fontsize=9,
    )
    handles = [
        Line2D([], [], linestyle="none", marker=mk, color=col, markersize=7, label=label)
        for label, (col, mk, _kind) in seen.items()
    ]
    if handles:
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=4,
            fontsize=8,
            frameon=False,
            borderaxespad=0.2,
        )
    head = "PASS" if report.passed else "FAIL"
    if len(runs) > 1:
        fig.suptitle(
            f"{report.title}: {head}"
            + (f"\n{textwrap.shorten(report.summary, 170)}" if report.summary else ""),
            fontsize=10,
            color="#1b5e20" if report.passed else "#b71c1c",
        )
    # Margins computed in inches, not by tight_layout(): measured, tight_layout cost more
    # than the rest of the drawing (it lays every text out once more).
    titles = [ln.title for r in runs for ln in r.lanes] or [""]
    label_in = 0.3 + 0.07 * max(map(len, titles))  # 8-point text: about 0.07 in a character
    # A single run's panel title already says everything the figure title would.
    top_in = 0.45 + 0.2 * bool(report.summary) if len(runs) > 1 else 0.1
    gap_in = 0.85  # x tick labels, then a two-line panel title
    bottom_in = 0.6 + 0.2 * ((len(handles) + 3) // 4)
    axes_in = sum(heights) * _LANE_H
    height = top_in + 0.35 + axes_in + gap_in * (len(runs) - 1) + bottom_in
    fig.set_size_inches(12, height)
    fig.subplots_adjust(
        left=min(0.45, label_in / 12),
        right=0.98,
        top=1 - (top_in + 0.35) / height,
        bottom=bottom_in / height,
        hspace=gap_in / (axes_in / len(runs)),
    )
    return fig, drawn


def save_png(fig: Any, path: Path) -> None:
    # zlib level 1: measured 3x faster to encode than PIL's default 6 on the demo's
    # figure (the encode was a quarter of the PNG's cost), for a file about 1.3x larger.
    fig.savefig(path, dpi=110, pil_kwargs={"compress_level": 1})


def save_svg(fig: Any, path: Path) -> None:
    """SVG text stays text (searchable, small); fonts come from the viewer."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "faultnet"}):
        fig.savefig(path)


def save(fig: Any, png: Path, svg: Path) -> None:
    """Write *fig* as PNG and SVG."""
    save_png(fig, png)
    save_svg(fig, svg)
