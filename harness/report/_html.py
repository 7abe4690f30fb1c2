"""The one-page ``report.html``: self-contained (the timeline is inline SVG, the style is
inline; no script, no network), readable from the run directory or copied elsewhere.

Sections: a first line saying what the page is; the verdict (a pair's, saying what passed
and that an arm with the defect is meant to fail) and summary; the timeline; then per run: the command that replays
it (with its seed), the checks with PASS/FAIL and the numbers behind each, the headline
numbers and internal controls, every fault interval, detection and post drawn, anything
the loader noticed, and relative links to the raw evidence files. A run's section is a
table of named parts (:data:`RUN_SECTIONS`), each a small function of one
:class:`Section`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from harness.report._model import DETECTIONS, OUTCOMES, FaultInterval, Report, Run
from harness.report._timeline import Drawn

__all__ = ["RUN_SECTIONS", "Section", "caption", "render", "run_section"]

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
.what{color:#424242;margin:0 0 .4em} .headline{font-size:1.1em}
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


@dataclass(frozen=True)
class Section:
    """What a run's section of the page is drawn from: the run, the page's directory
    (links are relative to it), whether the run gets its own heading, and the page's
    replay command (a run's own is shown only if it differs)."""

    run: Run
    page_dir: Path
    heading: bool = False
    page_replay: str = ""
    #: A pair's arm whose FAIL is the point (:meth:`Report.fails_as_expected`).
    expected_fail: bool = False

    @property
    def lane_title(self) -> dict[str, str]:
        return {ln.id: ln.title for ln in self.run.lanes}


def _heading(s: Section) -> list[str]:
    if not s.heading:
        return []
    why = ""
    if s.expected_fail:
        why = ' <span class="muted">as the pair expects: the arm with the defect</span>'
    return [f"<h2>{escape(s.run.title)}: {_badge(s.run.verdict() == 'PASS')}{why}</h2>"]


def _facts(s: Section) -> list[str]:
    run, res = s.run, s.run.result or {}
    facts = [
        ["experiment", _fmt(run.experiment)],
        ["arm", _fmt(run.arm)],
        ["seed", _fmt(run.seed)],
        ["time scale", _fmt(run.time_scale)],
        ["bot under test", escape(" ".join(run.bot_argv)) or "-"],
        ["duration", _fmt(res.get("duration_s")) + " s"],
        ["t = 0", escape(run.origin)],
    ]
    return [_table(["", "value"], facts)]


def _replay(s: Section) -> list[str]:
    run = s.run
    if not run.replay or run.replay == s.page_replay:
        return []
    how = "recorded" if run.replay_recorded else "rebuilt from result.json"
    return [f"<h3>Replay ({how})</h3><pre>{escape(run.replay)}</pre>"]


def _error(s: Section) -> list[str]:
    if not s.run.error:
        return []
    return [f'<p class="FAIL">Did not complete: {escape(s.run.error)}</p>']


def _checks(s: Section) -> list[str]:
    as_it_must = ' <span class="muted">as a control run must</span>'
    rows = [
        [
            _badge(bool(c.get("passed"))) + (as_it_must if c.get("expected_fail") else ""),
            escape(str(c.get("role", ""))),
            escape(str(c.get("name", ""))),
            escape(str(c.get("detail", ""))),
        ]
        for c in s.run.checks
    ]
    header = ["", "role", "check", "the numbers behind it"]
    return ["<h3>Checks</h3>", _table(header, rows) if rows else "<p>none</p>"]


def _control_value(c: dict[str, Any]) -> str:
    unit = " " + escape(str(c.get("unit"))) if c.get("unit") else ""
    return _fmt(c.get("value")) + unit + f" (tolerance {_fmt(c.get('tolerance'))})"


def _numbers(s: Section) -> list[str]:
    res = s.run.result or {}
    headline = res.get("headline") or {}
    controls = res.get("controls") or []
    if not (headline or controls):
        return []
    rows = [[escape(str(k)), _fmt(v)] for k, v in headline.items()]
    rows += [
        ["internal control: " + escape(str(c.get("name"))), _control_value(c)] for c in controls
    ]
    return ["<h3>Numbers</h3>", _table(["measure", "value"], rows)]


def _left_by(f: FaultInterval, lane_title: dict[str, str]) -> str:
    """When each client left the fault (its lane and time), else when all had, else -."""
    left = sorted(f.left.items(), key=lambda x: x[1])
    shown = ", ".join(f"{lane_title.get(ln, ln)} {t:.3f}" for ln, t in left)
    return shown or ("-" if f.released is None else f"all {f.released:.3f}")


_FAULT_HEADER = [
    "mode",
    "proxy",
    "stream",
    "from t+ s",
    "to t+ s",
    "left by its clients at t+ s",
    "removed by",
    "connections",
]


def _faults(s: Section) -> list[str]:
    lane_title = s.lane_title
    rows = [
        [
            escape(f.mode),
            escape(f.proxy),
            escape(f.stream),
            f"{f.start:.3f}",
            "never removed" if f.end is None else f"{f.end:.3f}",
            escape(_left_by(f, lane_title)),
            escape(str(f.removed_by or ("instant" if f.instant else "-"))),
            escape(", ".join(map(str, f.connections or []))) or "-",
        ]
        for f in s.run.faults
    ]
    return ["<h3>Faults</h3>", _table(_FAULT_HEADER, rows) if rows else "<p>none applied</p>"]


def _detections(s: Section) -> list[str]:
    lane_title = s.lane_title
    rows = [
        [f"{m.t:.3f}", escape(lane_title.get(m.lane, m.lane)), escape(m.kind), escape(m.label)]
        for m in s.run.markers
        if m.kind not in ("received", "conn_open")
    ]
    table = _table(["t+ s", "lane", "kind", "what"], rows) if rows else "<p>none</p>"
    return ["<h3>Detections and reconnects</h3>", table]


_POST_HEADER = [
    "t+ s",
    "call ms",
    "lane",
    "text",
    "answer",
    "received t+ s",
    "outcome",
    "claim from",
]


def _posts(s: Section) -> list[str]:
    counts = s.run.outcome_counts()
    summary = " &nbsp; ".join(
        f'<span class="swatch" style="background:{OUTCOMES[k].color}"></span>'
        f"{escape(OUTCOMES[k].label)}: <b>{n}</b>"
        for k, n in counts.items()
    )
    out = ["<h3>Posts</h3><p>", summary or "no posts", "</p>"]
    lane_title = s.lane_title
    rows = [
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
        for p in s.run.posts
    ]
    if rows:
        out.append(_table(_POST_HEADER, rows, [p.outcome for p in s.run.posts]))
    return out


def _notes(s: Section) -> list[str]:
    if not s.run.notes:
        return []
    return ["<h3>Notes</h3><ul>" + "".join(f"<li>{escape(n)}</li>" for n in s.run.notes) + "</ul>"]


def _not_read(s: Section) -> list[str]:
    if not s.run.skipped:
        return []
    return [
        "<h3>Not read</h3><p>Only regular files inside the run directory are read.</p><ul>"
        + "".join(f"<li>{escape(n)}</li>" for n in s.run.skipped)
        + "</ul>"
    ]


def _evidence(s: Section) -> list[str]:
    """Relative links to the raw evidence files (absolute if the run is elsewhere)."""
    run, out = s.run, ["<h3>Evidence</h3><ul>"]
    for f in run.files:
        target = run.path / f
        href = (
            target.relative_to(s.page_dir).as_posix()
            if run.path.is_relative_to(s.page_dir)
            else target.as_posix()
        )
        out.append(f'<li><a href="{escape(href)}">{escape(href)}</a></li>')
    return [*out, "</ul>"]


#: A run's section of the page, in order: each part a small function of the
#: :class:`Section`, returning its lines of HTML (none if it has nothing to say).
RUN_SECTIONS: tuple[tuple[str, Callable[[Section], list[str]]], ...] = (
    ("heading", _heading),
    ("facts", _facts),
    ("replay", _replay),
    ("did not complete", _error),
    ("checks", _checks),
    ("numbers", _numbers),
    ("faults", _faults),
    ("detections and reconnects", _detections),
    ("posts", _posts),
    ("notes", _notes),
    ("not read", _not_read),
    ("evidence", _evidence),
)


def run_section(s: Section) -> str:
    """One run's section of the page."""
    return "\n".join(line for _what, part in RUN_SECTIONS for line in part(s))


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


def what_it_is(report: Report) -> str:
    """The page's first line: what a reader who never ran faultnet is looking at."""
    names = [escape(r.title) for r in report.runs]
    exp = escape(report.runs[0].experiment or "an experiment") if report.runs else "a run"
    if report.kind == "pair":
        return (
            f"faultnet run report: a matched pair, the {exp} experiment run once against "
            f"each of two bots ({' and '.join(names)}) with the same seed, on one timeline. "
            "The pair passes when the arm without the defect passes every check and the "
            "internal controls hold between the arms; the arm with the defect is there to "
            "fail."
        )
    if exp == "fleet":
        return (
            "faultnet run report: a fleet soak, reference bots posting through faultnet "
            "links while a seeded chaos plan faults them, judged from their own records."
        )
    return (
        f"faultnet run report: one run of the {exp} experiment against one bot, its "
        "timeline, its checks and the evidence behind each."
    )


def _headline(report: Report) -> list[str]:
    """The verdict, saying whose it is; under a pair's PASS, that an arm's FAIL below is
    the defect showing, not the pair failing."""
    whose = "The pair's verdict" if report.kind == "pair" else "Verdict"
    out = [f'<p class="headline">{whose}: {_badge(report.passed)}</p>']
    if report.summary:
        out.append(f"<p>{escape(report.summary)}</p>")
    shown = [escape(r.title) for r in report.runs if report.fails_as_expected(r)]
    if shown:
        out.append(
            f"<p>{', '.join(shown)}: {_badge(False)} below is expected: "
            f"{'that is the arm' if len(shown) == 1 else 'those are the arms'} with the defect "
            "the experiment exists to expose, and its failing the target check is what "
            "the pair shows.</p>"
        )
    return out


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
        f'<p class="what">{what_it_is(report)}</p>',
        f"<h1>{escape(report.title)}</h1>",
        *_headline(report),
    ]
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
        expected = report.fails_as_expected(run)
        parts.append(run_section(Section(run, page_dir, heading, report.replay, expected)))
    parts.append("</body></html>")
    return "\n".join(parts)
