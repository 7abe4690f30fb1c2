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
tests can hold the picture to the evidence without reading pixels. Each run's panel is
drawn by a table of named layers (:data:`PANEL_LAYERS`: lanes, fault bands, calls,
posts, markers), each a small function of one :class:`Panel`. Every group of
artists also carries an SVG id (``gid``) naming what it is, so the inline SVG in the page
can be checked the same way.

matplotlib is used through its object API (``Figure``, no pyplot): no global figure
state, no GUI backend; the Agg canvas renders the PNG.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report._model import (
    DETECTIONS,
    OUTCOMES,
    FaultInterval,
    Outcome,
    Post,
    Report,
    Run,
)

__all__ = [
    "PANEL_LAYERS",
    "Drawn",
    "Panel",
    "draw",
    "fault_label",
    "lane_ys",
    "save",
    "save_png",
    "save_svg",
    "time_range",
]

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


#: A post's call, from made to answered: a thin line on its lane.
_CALL_COLOR = "#bdbdbd"
_CALL_LABEL = "a post's call, from made to answered"


def _darker(color: str, by: float = 0.6) -> str:
    """*color* (``#rrggbb``) darkened: a light outcome colour read as text on white."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c * by):02x}" for c in rgb)


def _panel_title(run: Run, expected_fail: bool = False) -> tuple[str, str]:
    checks = run.checks
    npass = sum(1 for c in checks if c.get("passed"))
    verdict = run.verdict()
    head = "PASS" if verdict == "PASS" else "FAIL"
    if expected_fail:  # under a PASS headline: say why this FAIL is not the pair's
        head = "FAIL, as the pair expects (the arm with the defect)"
    failed = [c["name"] for c in checks if not c.get("passed") and not c.get("expected_fail")]
    by_design = [c["name"] for c in checks if c.get("expected_fail") and not c.get("passed")]
    text = f"{run.title}: {head}, {npass}/{len(checks)} checks passed"
    if failed:
        text += "\nFAILED: " + "; ".join(failed)
    elif by_design:
        text += "\nfailed as a control run must: " + "; ".join(by_design)
    elif run.error:
        text += f"\nDID NOT COMPLETE: {run.error}"
    return text, ("#1b5e20" if verdict == "PASS" else "#b71c1c")


# --------------------------------------------------------------------------- a panel


@dataclass
class Panel:
    """One run's axes being drawn: what the layers of :data:`PANEL_LAYERS` share."""

    ax: Any
    index: int
    run: Run
    #: Each lane's y (the first lane on top).
    ys: dict[str, int]
    #: Where a fault never removed is drawn to: the end of the shared axis.
    t_max: float
    #: The figure's legend so far: label -> (colour, marker, "post" or "marker").
    legend: dict[str, tuple[str, str, str]]
    drawn: list[Drawn]
    #: A pair's arm whose FAIL is the point (:meth:`Report.fails_as_expected`).
    expected_fail: bool = False


def lane_ys(run: Run) -> dict[str, int]:
    """Each lane's y on its panel: the first lane on top."""
    return {ln.id: len(run.lanes) - 1 - i for i, ln in enumerate(run.lanes)}


def _lanes(pn: Panel) -> None:
    """The lanes' titles, their guide lines, and the panel's verdict as its title."""
    ax, run = pn.ax, pn.run
    ax.set_ylim(-0.6, len(run.lanes) - 0.4)
    ax.set_yticks([pn.ys[ln.id] for ln in run.lanes], [ln.title for ln in run.lanes], fontsize=8)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    for y in pn.ys.values():
        ax.axhline(y, color="#eeeeee", linewidth=0.8, zorder=0)
    title, color = _panel_title(pn.run, pn.expected_fail)
    ax.set_title(title, fontsize=9, color=color, loc="left")


def fault_label(f: FaultInterval) -> str:
    """A band's label: its mode, its stream if not both, and if it was never removed."""
    label = f.mode + ("" if f.stream == "both" else f" ({f.stream})")
    return label + (" (never removed)" if f.end is None else "")


def _band_artist(pn: Panel, f: FaultInterval, lanes: list[str], col: str) -> Any:
    """A fault's artist: a line per lane for an instant, else a band per lane (the lanes
    a fault acts on need not be adjacent), each to where it ended on that lane."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    if f.instant:
        return pn.ax.vlines(
            [f.start] * len(lanes),
            [pn.ys[ln] - 0.45 for ln in lanes],
            [pn.ys[ln] + 0.45 for ln in lanes],
            color=col,
            linewidth=2.5,
        )
    boxes = []
    for ln in lanes:
        end = f.end_on(ln)
        width = max((pn.t_max if end is None else end) - f.start, 1e-6)
        boxes.append(Rectangle((f.start, pn.ys[ln] - 0.45), width, 0.9))
    art = PatchCollection(
        boxes, facecolors=col, alpha=0.25, edgecolors=col, linewidths=1.0, zorder=1
    )
    pn.ax.add_collection(art)
    return art


def _fault_bands(pn: Panel) -> None:
    """Each fault on the proxy's lane and on every bot lane behind it, labelled with
    its mode. The proxy holds it until removed; a client behind it, until it left."""
    for fi, f in enumerate(pn.run.faults):
        lanes = [ln.id for ln in pn.run.lanes if ln.id == f"proxy:{f.proxy}" or ln.via == f.proxy]
        if not lanes:
            continue
        col = _MODE_COLORS.get(f.mode, _TOXIC_COLOR)
        gid = f"fault-{pn.index}-{fi}-{f.mode.replace(' ', '_')}"
        _band_artist(pn, f, lanes, col).set_gid(gid)
        if f.instant:  # drawn as a line across each lane, not a band
            pn.legend.setdefault(f"fault at an instant: {f.mode} (a line)", (col, "|", "marker"))
        else:
            pn.legend.setdefault(
                f"fault in force: {f.mode} (a band on each lane it holds)", (col, "", "band")
            )
        top = max(pn.ys[ln] for ln in lanes) + 0.45
        pn.ax.text(
            f.start, top, f" {fault_label(f)}", fontsize=8, va="top", ha="left",
            color="#0d47a1", zorder=5,
        )  # fmt: skip
        for ln in lanes:
            pn.drawn.append(Drawn("fault", pn.index, ln, f.start, f.mode, f.end_on(ln), gid))


def _calls(pn: Panel) -> None:
    """Each post's call, from made to answered, as a thin line on its lane."""
    for p in pn.run.posts:
        y = pn.ys.get(p.lane)
        if y is not None and p.t_end > p.t:
            pn.ax.plot([p.t, p.t_end], [y, y], color=_CALL_COLOR, linewidth=1.2, zorder=2)
            pn.legend.setdefault(_CALL_LABEL, (_CALL_COLOR, "", "line"))


def _tally(pn: Panel, name: str, oc: Outcome, pts: list[Post]) -> None:
    """The count of an outcome with a tally, beside the first post of it."""
    first = pts[0]
    art = pn.ax.annotate(
        f"{len(pts)} {oc.tally[len(pts) > 1]}",
        (first.t, pn.ys[first.lane]),
        xytext=(0, 14 if oc.loud else 10),
        textcoords="offset points",
        fontsize=9,
        fontweight="bold",
        color=oc.color if oc.loud else _darker(oc.color),
        zorder=7,
    )
    art.set_gid(f"tally-{pn.index}-{name}")


def _marks(
    pn: Panel,
    drawn: list[Drawn],
    legend: tuple[str, tuple[str, str, str]],
    lift: float = 0.0,
    **style: Any,
) -> None:
    """*drawn* (of one kind: one SVG group, their ``gid``) as marks on their lanes,
    *lift* above the lane's line, in *style* and with no line between them; *legend*
    (label, entry) is their entry in the panel's legend. None drawn: nothing to do."""
    if not drawn:
        return
    (art,) = pn.ax.plot(
        [d.t for d in drawn], [pn.ys[d.lane] + lift for d in drawn], linestyle="none", **style
    )
    art.set_gid(drawn[0].gid)
    pn.legend.setdefault(*legend)
    pn.drawn += drawn


def _posts(pn: Panel) -> None:
    """The posts as marks by outcome (:data:`OUTCOMES`), one SVG group per outcome;
    a loud one larger and above the rest."""
    for name, oc in OUTCOMES.items():
        pts = [p for p in pn.run.posts if p.outcome == name and p.lane in pn.ys]
        gid = f"posts-{pn.index}-{name}"
        _marks(
            pn,
            [Drawn("post", pn.index, p.lane, p.t, name, p.t_end, gid) for p in pts],
            (oc.label, (oc.color, oc.marker, "post")),
            marker=oc.marker,
            markersize=13 if oc.loud else 7,
            markerfacecolor=oc.color,
            markeredgecolor="black" if oc.loud else oc.color,
            markeredgewidth=0.8,
            zorder=6 if oc.loud else 4,
        )
        if pts and oc.tally[0]:
            _tally(pn, name, oc, pts)


#: Marker kinds drawn off their lane's line: detections above it, reconnects below it
#: (they are often ms apart), and larger.
_LIFT = {"pong_timeout": 0.28, "connection_lost": 0.28, "reconnected": -0.28}


def _markers(pn: Panel) -> None:
    """Detections, reconnects, proxy connections, observer receipts, decisions: one
    SVG group per kind (:data:`DETECTIONS`)."""
    for kind, (label, col, mk) in DETECTIONS.items():
        ms = [m for m in pn.run.markers if m.kind == kind and m.lane in pn.ys]
        gid = f"markers-{pn.index}-{kind}"
        _marks(
            pn,
            [Drawn("marker", pn.index, m.lane, m.t, kind, None, gid) for m in ms],
            (label, (col, mk, "marker")),
            _LIFT.get(kind, 0.0),
            marker=mk,
            markersize=9 if kind in _LIFT else 6,
            color=col,
            zorder=5,
        )


def _undeclared_markers(pn: Panel) -> None:
    """A marker of a kind nobody declared yet: a plain grey dot, still drawn."""
    for m in pn.run.markers:
        if m.kind not in DETECTIONS and m.lane in pn.ys:
            pn.ax.plot([m.t], [pn.ys[m.lane]], marker="o", color="#9e9e9e", zorder=5)
            gid = f"markers-{pn.index}-other"
            pn.drawn.append(Drawn("marker", pn.index, m.lane, m.t, m.kind, None, gid))


#: What is drawn on each run's panel, in order (later layers over earlier ones where
#: their z-order ties).
PANEL_LAYERS: tuple[tuple[str, Callable[[Panel], None]], ...] = (
    ("lanes and the panel's verdict", _lanes),
    ("fault bands", _fault_bands),
    ("calls", _calls),
    ("posts by outcome, with their tallies", _posts),
    ("markers by kind", _markers),
    ("markers of undeclared kinds", _undeclared_markers),
)


# --------------------------------------------------------------------------- the figure


def time_range(runs: list[Run]) -> tuple[float, float]:
    """The shared axis: from the earliest mark (or 0) to the latest run's end (or 1)."""
    t_min = min(
        [0.0, *(p.t for r in runs for p in r.posts), *(m.t for r in runs for m in r.markers)]
    )
    return t_min, max([1.0, *(r.end for r in runs)])


def _x_axis(ax: Any, runs: list[Run], t_min: float, t_max: float) -> None:
    span = t_max - t_min
    ax.set_xlim(t_min - 0.02 * span, t_max + 0.02 * span)
    origins = {r.origin for r in runs}
    origin = origins.pop() if len(origins) == 1 else "each run's first fault"
    ax.set_xlabel(f"seconds since {origin} (t = 0)", fontsize=9)


def _legend(fig: Any, legend: dict[str, tuple[str, str, str]]) -> int:
    """The figure's legend, one entry per label met (every kind of mark a layer drew:
    bands, call lines, posts, markers); returns how many entries."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def handle(label: str, col: str, mk: str, kind: str) -> Any:
        if kind == "band":
            return Patch(facecolor=col, edgecolor=col, alpha=0.25, label=label)
        if kind == "line":
            return Line2D([], [], color=col, linewidth=1.2, label=label)
        return Line2D([], [], linestyle="none", marker=mk, color=col, markersize=7, label=label)

    handles = [handle(label, *entry) for label, entry in legend.items()]
    if handles:
        fig.legend(
            handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False,
            borderaxespad=0.2,
        )  # fmt: skip
    return len(handles)


def _suptitle(fig: Any, report: Report) -> None:
    """The pair's (or fleet's) verdict over its panels; a single run's panel title
    already says everything it would."""
    if len(report.runs) < 2:
        return
    head = "PASS" if report.passed else "FAIL"
    whose = "the pair's verdict" if report.kind == "pair" else "verdict"
    fig.suptitle(
        f"{report.title}: {whose} {head}"
        + (f"\n{textwrap.shorten(report.summary, 170)}" if report.summary else ""),
        fontsize=10,
        color="#1b5e20" if report.passed else "#b71c1c",
    )


def _layout(fig: Any, report: Report, heights: list[int], entries: int) -> None:
    """The figure's size and margins, computed in inches, not by tight_layout():
    measured, tight_layout cost more than the rest of the drawing (it lays every text
    out once more)."""
    runs = report.runs
    titles = [ln.title for r in runs for ln in r.lanes] or [""]
    label_in = 0.3 + 0.07 * max(map(len, titles))  # 8-point text: about 0.07 in a character
    top_in = 0.45 + 0.2 * bool(report.summary) if len(runs) > 1 else 0.1
    gap_in = 0.85  # x tick labels, then a two-line panel title
    bottom_in = 0.6 + 0.2 * ((entries + 3) // 4)
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


def draw(report: Report) -> tuple[Any, list[Drawn]]:
    """Build the figure for *report*; return it and what was drawn."""
    from matplotlib.figure import Figure

    runs = report.runs
    heights = [max(1, len(r.lanes)) for r in runs]
    fig = Figure(figsize=(12, 6), dpi=110)  # the height is set once the legend is known
    axes = fig.subplots(
        nrows=len(runs), ncols=1, sharex=True, squeeze=False, height_ratios=heights
    )[:, 0]
    drawn: list[Drawn] = []
    legend: dict[str, tuple[str, str, str]] = {}
    t_min, t_max = time_range(runs)
    for ri, (ax, run) in enumerate(zip(axes, runs, strict=True)):
        panel = Panel(
            ax, ri, run, lane_ys(run), t_max, legend, drawn, report.fails_as_expected(run)
        )
        for _what, layer in PANEL_LAYERS:
            layer(panel)
    _x_axis(axes[-1], runs, t_min, t_max)
    entries = _legend(fig, legend)
    _suptitle(fig, report)
    _layout(fig, report, heights, entries)
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
