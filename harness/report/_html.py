"""The one-page ``report.html``: self-contained (the timeline is inline SVG, the style is
inline; no script, no network), readable from the run directory or copied elsewhere.

Sections: the verdict and summary; the timeline; then per run: the command that replays
it (with its seed), the checks with PASS/FAIL and the numbers behind each, the headline
numbers and internal controls, every fault interval, detection and post drawn, anything
the loader noticed, and relative links to the raw evidence files.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from harness.report._model import DETECTIONS, OUTCOMES, Report, Run
from harness.report._timeline import Drawn

__all__ = ["render"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#212121}
h1{font-size:1.4em;margin:.2em 0} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
h3{font-size:1em;margin:1em 0 .3em}
.PASS{color:#1b5e20;font-weight:bold} .FAIL{color:#b71c1c;font-weight:bold}
table{border-collapse:collapse;margin:.3em 0 1em} td,th{border:1px solid #ddd;padding:2px 6px;
vertical-align:top;text-align:left;font-size:13px} th{background:#f5f5f5}
tr.silent_loss td{background:#ffebee;font-weight:bold} tr.late td{background:#fff3e0}
pre{background:#f5f5f5;padding:.5em;overflow-x:auto;white-space:pre-wrap}
.timeline svg{width:100%;height:auto} .muted{color:#757575}
.swatch{display:inline-block;width:.8em;height:.8em;border-radius:50%;margin-right:.3em}
"""


def _badge(passed: bool) -> str:
    return '<span class="PASS">PASS</span>' if passed else '<span class="FAIL">FAIL</span>'


def _table(header: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return escape(str(v))


def _inline_svg(svg_text: str) -> str:
    # Drop the XML prolog and DOCTYPE: inside HTML the <svg> element stands alone.
    return re.sub(r"^.*?(<svg\b)", r"\1", svg_text, count=1, flags=re.S)


def _run_section(run: Run, page_dir: Path, heading: bool, page_replay: str) -> str:
    out: list[str] = []
    if heading:
        out.append(f"<h2>{escape(run.title)}: {_badge(run.verdict() == 'PASS')}</h2>")
    res = run.result or {}
    facts = [
        ["experiment", _fmt(run.experiment)],
        ["arm", _fmt(run.arm)],
        ["seed", _fmt(run.seed)],
        ["time scale", _fmt(run.time_scale)],
        ["bot under test", escape(" ".join(run.bot_argv)) or "-"],
        ["duration", _fmt(res.get("duration_s")) + " s"],
        ["t = 0", escape(run.origin)],
    ]
    out.append(_table(["", "value"], facts))
    if run.replay and run.replay != page_replay:
        how = "recorded" if run.replay_recorded else "rebuilt from result.json"
        out.append(f"<h3>Replay ({how})</h3><pre>{escape(run.replay)}</pre>")
    if run.error:
        out.append(f'<p class="FAIL">Did not complete: {escape(run.error)}</p>')

    out.append("<h3>Checks</h3>")
    rows = [
        [
            _badge(bool(c.get("passed"))),
            escape(str(c.get("role", ""))),
            escape(str(c.get("name", ""))),
            escape(str(c.get("detail", ""))),
        ]
        for c in run.checks
    ]
    out.append(
        _table(["", "role", "check", "the numbers behind it"], rows) if rows else "<p>none</p>"
    )
    headline = res.get("headline") or {}
    controls = res.get("controls") or []
    if headline or controls:
        out.append("<h3>Numbers</h3>")
        nrows = [[escape(str(k)), _fmt(v)] for k, v in headline.items()]
        nrows += [
            [
                "internal control: " + escape(str(c.get("name"))),
                _fmt(c.get("value"))
                + (" " + escape(str(c.get("unit"))) if c.get("unit") else "")
                + f" (tolerance {_fmt(c.get('tolerance'))})",
            ]
            for c in controls
        ]
        out.append(_table(["measure", "value"], nrows))

    lane_title = {ln.id: ln.title for ln in run.lanes}
    out.append("<h3>Faults</h3>")
    frows = [
        [
            escape(f.mode),
            escape(f.proxy),
            escape(f.stream),
            f"{f.start:.3f}",
            "never removed" if f.end is None else f"{f.end:.3f}",
            escape(
                ", ".join(
                    f"{lane_title.get(ln, ln)} {t:.3f}"
                    for ln, t in sorted(f.left.items(), key=lambda x: x[1])
                )
                or ("-" if f.released is None else f"all {f.released:.3f}")
            ),
            escape(str(f.removed_by or ("instant" if f.instant else "-"))),
            escape(", ".join(map(str, f.connections or []))) or "-",
        ]
        for f in run.faults
    ]
    out.append(
        _table(
            [
                "mode",
                "proxy",
                "stream",
                "from t+ s",
                "to t+ s",
                "left by its clients at t+ s",
                "removed by",
                "connections",
            ],
            frows,
        )
        if frows
        else "<p>none applied</p>"
    )
    out.append("<h3>Detections and reconnects</h3>")
    drows = [
        [f"{m.t:.3f}", escape(lane_title.get(m.lane, m.lane)), escape(m.kind), escape(m.label)]
        for m in run.markers
        if m.kind not in ("received", "conn_open")
    ]
    out.append(_table(["t+ s", "lane", "kind", "what"], drows) if drows else "<p>none</p>")

    counts = run.outcome_counts()
    out.append("<h3>Posts</h3><p>")
    out.append(
        " &nbsp; ".join(
            f'<span class="swatch" style="background:{OUTCOMES[k].color}"></span>'
            f"{escape(OUTCOMES[k].label)}: <b>{n}</b>"
            for k, n in counts.items()
        )
        or "no posts"
    )
    out.append("</p>")
    prow, pcls = [], []
    for p in run.posts:
        prow.append(
            [
                f"{p.t:.3f}",
                f"{(p.t_end - p.t) * 1000:.0f}",
                escape(lane_title.get(p.lane, p.lane)),
                escape(p.text),
                escape(p.answer or "-"),
                "-" if p.received_t is None else f"{p.received_t:.3f}",
                f"<b>{escape(p.outcome)}</b>",
                escape(p.claim_source),
            ]
        )
        pcls.append(p.outcome)
    if prow:
        out.append(
            _table(
                [
                    "t+ s",
                    "call ms",
                    "lane",
                    "text",
                    "answer",
                    "received t+ s",
                    "outcome",
                    "claim from",
                ],
                prow,
                pcls,
            )
        )
    if run.notes:
        out.append(
            "<h3>Notes</h3><ul>" + "".join(f"<li>{escape(n)}</li>" for n in run.notes) + "</ul>"
        )
    if run.skipped:
        out.append(
            "<h3>Not read</h3><p>Only regular files inside the run directory are read.</p><ul>"
            + "".join(f"<li>{escape(n)}</li>" for n in run.skipped)
            + "</ul>"
        )
    out.append("<h3>Evidence</h3><ul>")
    for f in run.files:
        href = (
            (run.path / f).relative_to(page_dir).as_posix()
            if run.path.is_relative_to(page_dir)
            else (run.path / f).as_posix()
        )
        out.append(f'<li><a href="{escape(href)}">{escape(href)}</a></li>')
    out.append("</ul>")
    return "\n".join(out)


def caption(drawn: Sequence[Drawn], png_name: str, svg_name: str) -> str:
    """The timeline's caption: links to its PNG and SVG, and what is in it, from what
    :func:`~harness.report._timeline.draw` drew (never a marker it did not draw)."""
    kinds = {(d.kind, d.what) for d in drawn}
    modes = list(dict.fromkeys(d.what for d in drawn if d.kind == "fault"))
    parts = [
        f'The timeline as <a href="{escape(png_name)}">PNG</a> and '
        f'<a href="{escape(svg_name)}">SVG</a>.'
    ]
    if modes:
        parts.append(
            "Bands: the faults ("
            + ", ".join(escape(m) for m in modes)
            + "), on the proxy's lane from applied to removed; on a bot's lane a fault "
            "on the connections open when it was applied ends where the bot dropped "
            "the connection it held (a reconnect round it is outside the band)."
        )
    posts = [oc.label for name, oc in OUTCOMES.items() if ("post", name) in kinds]
    if posts:
        parts.append("Posts: " + "; ".join(escape(x) for x in posts) + ".")
    marks = [v[0] for k, v in DETECTIONS.items() if ("marker", k) in kinds]
    if marks:
        parts.append("Markers: " + "; ".join(escape(x) for x in marks) + ".")
    return f'<p class="muted">{" ".join(parts)}</p>'


def render(
    report: Report, svg_text: str, png_name: str, svg_name: str, *, drawn: Sequence[Drawn]
) -> str:
    """The whole page for *report*, the timeline's SVG inlined; *drawn* is what the
    timeline drew (its caption lists that and nothing else)."""
    page_dir = report.path
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(report.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(report.title)}: {_badge(report.passed)}</h1>",
    ]
    if report.summary:
        parts.append(f"<p>{escape(report.summary)}</p>")
    if report.skipped:
        parts.append(
            "<p>Not read (only regular files and real directories inside are): "
            + "; ".join(escape(n) for n in report.skipped)
            + "</p>"
        )
    if report.replay:
        parts.append(f"<h3>Replay</h3><pre>{escape(report.replay)}</pre>")
    seeds = sorted({str(r.seed) for r in report.runs if r.seed is not None})
    if seeds:
        parts.append(f"<p>seed {escape(', '.join(seeds))}</p>")
    parts.append(f'<div class="timeline">{_inline_svg(svg_text)}</div>')
    parts.append(caption(drawn, png_name, svg_name))
    if report.drifts:
        parts.append("<h2>Internal controls between the arms</h2>")
        names = [r.title for r in report.runs]
        rows = [
            [
                escape(str(d.get("name"))),
                _fmt(d.get("a")),
                _fmt(d.get("b")),
                _fmt(d.get("drift")) + (" " + escape(str(d.get("unit"))) if d.get("unit") else ""),
                "&le; " + _fmt(d.get("tolerance")),
                "steady" if d.get("steady") else '<span class="FAIL">MOVED</span>',
            ]
            for d in report.drifts
        ]
        parts.append(
            _table(["internal control", *map(escape, names[:2]), "drift", "tolerance", ""], rows)
        )
    for run in report.runs:
        heading = len(report.runs) > 1 or report.kind != "attempt"
        parts.append(_run_section(run, page_dir, heading, report.replay))
    parts.append("</body></html>")
    return "\n".join(parts)
