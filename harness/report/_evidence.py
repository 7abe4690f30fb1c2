"""Load one run directory into a :class:`~harness.report._model.Run`.

A run directory (one arm of one attempt) holds, as the experiment runner writes them:

==========================  ===========================================================
``result.json``             the checks, headline numbers and controls (absent if killed)
``events.jsonl``            the harness's own log: attempt, bot_started, phases, ...
``proxy*.jsonl``            each faultnet proxy's event log: fault_applied/removed,
                            toxic_added/removed, conn_open/close, held_fin/rst
``LABEL.stderr``            each bot's stderr; its ``BOTEVENT {json}`` lines
``calls/LABEL/*.jsonl``     each bot's MCP call record (one line per request)
``observer.jsonl``          what the independent observer received, with its time
``faults.jsonl``,           decision logs (``faultnet chaos``'s join log, the fleet's
``chaos*.jsonl``            faults.jsonl): one marker per decision on its target's lane
``command.txt``             the exact command that replays the run (written by publish)
``verdict.json``            a separate verifier's verdict (the fleet's), joined to the
                            run's own checks
==========================  ===========================================================

Only regular files inside the directory are read, reached through real directories: a
symbolic link (out of the directory or not), a FIFO or a socket is never opened, quoted
or linked, and :attr:`Run.skipped` says which were passed over and why (the reading is
:mod:`._files`'s; the fault intervals, :mod:`._faults`').

Every file is optional: a directory kept from a killed attempt loads with what it has,
and :attr:`Run.notes` says what was missing or truncated (a ``result.json`` that is not
JSON at all is what a killed writer leaves: a note too). A ``result.json`` or
``verdict.json`` that is JSON but not in the shape its writer gives it was not written
by the runner, and the report does not guess at it: :class:`MalformedEvidence`, one line
naming the file and the field (exit 2 on the command line). Times from different processes
are comparable: every record's ``mono`` is CLOCK_MONOTONIC of the same host, and the
observer's wall-clock receive times are mapped onto it through its record's own
(wall, mono) pair.

:func:`load_run` is a table of named steps (:data:`LOAD_STEPS`) over one
:class:`Loading`, each reading one kind of evidence into the run; :func:`begin` reads
first what decides the run's identity and its time axis.

A post is scored the way the experiments score it (principle 3): *claimed* is what the
bot's answer said (:func:`harness.experiment.claims_delivery`), *received* is whether the
observer got the exact text. The answer is read from the call record (``result_text``);
runs recorded before the call record kept it fall back to the experiment's own post
table, then to the bot's ``post_confirm`` events, and say so in ``claim_source``
(:data:`._posts.CLAIM_SOURCES`, tried in order).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from harness.experiment import parse_botevents
from harness.report._faults import fault_intervals, mark_left
from harness.report._files import (
    RESULT_SHAPE,
    VERDICT_SHAPE,
    EvidenceDir,
    MalformedEvidence,
    Shape,
    check_shape,
    is_run_dir,
    read_json,
    read_records,
    why_not_read,
)
from harness.report._model import Lane, Marker, Run
from harness.report._posts import CLAIM_SOURCES, Call, call_text, read_claim, score_call, score_post

__all__ = [
    "CLAIM_SOURCES",
    "LOAD_STEPS",
    "Call",
    "OUTPUT_FILES",
    "EvidenceDir",
    "Loading",
    "MalformedEvidence",
    "Shape",
    "begin",
    "check_shape",
    "choose_origin",
    "fault_intervals",
    "is_run_dir",
    "load_run",
    "read_claim",
    "score_call",
    "score_post",
    "why_not_read",
]

#: What the report builder itself writes into a run directory (never listed as evidence).
OUTPUT_FILES = ("report.html", "report.json", "timeline.png", "timeline.svg")
#: Files that hold secrets (tokens) or are machinery, not evidence worth a link.
_NOT_EVIDENCE = ("env/state.env", "env/.env.lock", "env/registry.sqlite3")


# --------------------------------------------------------------------------- markers

#: Proxy event -> (marker kind, its label); other events are not drawn as markers.
_PROXY_MARKERS: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "conn_open": lambda r: ("conn_open", f"conn {r.get('conn')} open"),
    "conn_close": lambda r: ("conn_close", f"conn {r.get('conn')} closed ({r.get('how')})"),
    "held_fin": lambda r: ("held_close", f"conn {r.get('conn')} FIN held ({r.get('stream')})"),
    "held_rst": lambda r: ("held_close", f"conn {r.get('conn')} RST held ({r.get('stream')})"),
    "peer_reset": lambda r: ("connection_lost", f"conn {r.get('conn')} peer reset"),
    "upstream_failed": lambda r: ("connect_failed", f"conn {r.get('conn')} upstream failed"),
    # One per request an HTTP toxic faulted (faultnet.toxics.http): what it did to which.
    "http_fault": lambda r: (
        "http_fault",
        f"conn {r.get('conn')} {r.get('method')} {r.get('path')}: {r.get('action')}",
    ),
}

#: Decision-log event (or a "skip" action) -> marker kind; other events are not drawn.
_DECISIONS = {
    "fault": "decision",
    "undo": "decision",
    "skip": "decision_skipped",
    "refuse": "decision_skipped",
    "undo_failed": "decision_failed",
    "error": "decision_failed",
}

#: BOTEVENT name -> marker kind (None: not drawn). ``disconnected`` for a PONG timeout
#: is already drawn as the pong_timeout itself.
_BOT_MARKERS = {
    "pong_timeout": "pong_timeout",
    "reconnected": "reconnected",
    "connect_failed": "connect_failed",
}


def _bot_marker(ev: dict[str, Any]) -> tuple[str, str] | None:
    """The (kind, label) one BOTEVENT is drawn as, or None."""
    name = ev.get("event")
    if name == "connected" and int(ev.get("session", 1) or 1) == 1:
        return "connected", "connected"
    if name == "disconnected" and ev.get("reason") != "pong_timeout":
        return "connection_lost", f"connection lost ({ev.get('reason')})"
    kind = _BOT_MARKERS.get(str(name))
    if kind is None:
        return None
    if kind == "reconnected":
        return kind, f"reconnected (down {ev.get('down_ms', '?')} ms)"
    if kind == "pong_timeout":
        return kind, f"PONG timeout after {ev.get('pong_timeout_s', '?')} s"
    return kind, str(name)


def _decision_marker(r: dict[str, Any]) -> tuple[str, str] | None:
    """The (kind, label) one decision-log record is drawn as, or None."""
    kind = _DECISIONS.get(str(r.get("action") if r.get("action") == "skip" else r.get("event")))
    if kind is None or "mono" not in r:
        return None
    why = r.get("outcome") or r.get("result") or r.get("reason") or r.get("rail") or ""
    if isinstance(r.get("detail"), dict) and r["detail"].get("reason"):
        why = r["detail"]["reason"]
    return kind, f"{r.get('event')} {r.get('action')}" + (f": {why}" if why else "")


# --------------------------------------------------------------------------- the run


@dataclass
class Loading:
    """One run directory being loaded: the run so far and what its steps share."""

    ed: EvidenceDir
    run: Run
    events: list[dict[str, Any]]
    #: Each proxy's records, by proxy name, in time order.
    proxies: dict[str, list[dict[str, Any]]]
    #: A proxy's listening port -> its name (how a bot's ``via`` names its proxy).
    port_to_proxy: dict[int, str] = field(default_factory=dict)
    #: The harness's bot_started record of each bot, by label, and every label.
    started: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    #: Whether the observer's transcript is there, and what it received (t, sender, text).
    has_observer: bool = False
    received: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return self.run.notes

    def rel(self, mono: Any) -> float:
        """A monotonic instant on the run's axis (t = 0 at its origin)."""
        return float(mono) - self.run.origin_mono


def _read_result(ed: EvidenceDir, notes: list[str]) -> dict[str, Any] | None:
    """result.json, a separate verifier's verdict.json joined to it."""
    result = read_json(ed.file("result.json"), notes, RESULT_SHAPE)
    if result is None and not ed.exists("result.json"):
        notes.append("result.json: absent (the attempt was killed or is still running)")
    return _with_verdict(result, read_json(ed.file("verdict.json"), notes, VERDICT_SHAPE))


def _read_proxy_logs(ed: EvidenceDir, notes: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every proxy log's records by proxy name (a record's own, else the file's), each
    in time order."""
    proxies: dict[str, list[dict[str, Any]]] = {}
    for f in ed.glob("proxy*.jsonl", "proxies*.jsonl"):
        for r in read_records(f, notes):
            proxies.setdefault(str(r.get("proxy") or f.stem), []).append(r)
    for recs in proxies.values():
        recs.sort(key=lambda r: float(r.get("mono", 0.0)))
    return proxies


def choose_origin(
    events: list[dict[str, Any]], proxies: dict[str, list[dict[str, Any]]]
) -> tuple[float, str]:
    """t = 0 and what it is: the first fault applied, else the attempt's start, else
    the first record."""
    applied = [
        float(r["mono"])
        for recs in proxies.values()
        for r in recs
        if r.get("event") in ("fault_applied", "toxic_added") and "mono" in r
    ]
    if applied:
        return min(applied), "the first fault applied"
    starts = [float(r["mono"]) for r in events if r.get("event") == "attempt" and "mono" in r]
    if starts:
        return min(starts), "the run's start"
    every = [float(r["mono"]) for recs in [events, *proxies.values()] for r in recs if "mono" in r]
    return (min(every) if every else 0.0), "the first record"


def begin(path: Path, title: str | None = None) -> Loading:
    """Read what decides the run's identity and time axis (its result, the harness's
    log, the proxies' logs) and start the run from them."""
    path = Path(path)
    ed = EvidenceDir(path)
    notes: list[str] = []
    result = _read_result(ed, notes)
    events = read_records(ed.file("events.jsonl"), notes)
    proxies = _read_proxy_logs(ed, notes)
    origin_mono, origin = choose_origin(events, proxies)
    attempt = next((r for r in events if r.get("event") == "attempt"), {})
    res = result or {}
    run = Run(
        path=path,
        title=title or path.name,
        experiment=str(res.get("experiment") or attempt.get("experiment") or ""),
        arm=str(res.get("arm") or attempt.get("arm") or ""),
        seed=res.get("seed", attempt.get("seed")),
        time_scale=res.get("time_scale"),
        bot_argv=list(res.get("bot_argv") or attempt.get("bot_argv") or []),
        origin_mono=origin_mono,
        origin=origin,
        result=result,
        notes=notes,
    )
    return Loading(ed, run, events, proxies)


def load_proxies(ld: Loading) -> None:
    """A lane per proxy, its fault intervals and its connections' markers."""
    for name, recs in ld.proxies.items():
        listening = next((r for r in recs if r.get("event") == "listening"), {})
        listen = str(listening.get("listen", ""))
        if listen.rpartition(":")[2].isdigit():
            ld.port_to_proxy[int(listen.rpartition(":")[2])] = name
        shown = "proxy" if name == "proxy" else f"proxy {name}"
        ld.run.lanes.append(Lane(f"proxy:{name}", f"{shown} {listen}".strip(), "proxy"))
        ld.run.faults += fault_intervals(recs, name, ld.run.origin_mono)
        for r in recs:
            mk = _PROXY_MARKERS.get(str(r.get("event")))
            if mk is not None and "mono" in r:
                kind, label = mk(r)
                ld.run.markers.append(Marker(f"proxy:{name}", ld.rel(r["mono"]), kind, label))


def find_bots(ld: Loading) -> None:
    """The bots: one per label (a stderr file, a call-record directory, or the
    harness's bot_started), in the order they started."""
    ld.started = {str(r.get("label")): r for r in ld.events if r.get("event") == "bot_started"}
    order = list(ld.started)
    ld.labels = sorted(
        {f.stem for f in ld.ed.glob("*.stderr")}
        | {d.name for d in ld.ed.subdirs("calls")}
        | set(ld.started),
        key=lambda s: (order.index(s) if s in order else len(order), s),
    )


def load_observer(ld: Loading) -> None:
    """What the observer received, on the run's axis: its wall-clock receive time
    mapped through its record's own (wall, mono) pair."""
    observer_file = ld.ed.file("observer.jsonl")
    observer = read_records(observer_file, ld.notes)
    ld.has_observer = observer_file is not None
    if not ld.has_observer:
        ld.notes.append("observer.jsonl: absent, so no post can be scored as received or lost")
    for r in observer:
        if r.get("event") != "message" or not isinstance(r.get("text"), str):
            continue
        when = r.get("time")
        if isinstance(when, (int, float)) and "wall" in r and "mono" in r:
            t = ld.rel(float(r["mono"]) - (float(r["wall"]) - float(when)))
        else:
            t = ld.rel(r.get("mono", ld.run.origin_mono))
        ld.received.append((t, str(r.get("sender") or ""), r["text"]))


def _bot_lane(ld: Loading, label: str) -> Lane:
    """A bot's lane: its label and nick, and the proxy its traffic goes through."""
    st = ld.started.get(label, {})
    via = st.get("via")
    via_proxy = None
    if isinstance(via, list) and len(via) == 2 and str(via[1]).isdigit():
        via_proxy = ld.port_to_proxy.get(int(via[1]))
    title = f"{label} {st.get('nick', '')}".strip()
    if via_proxy:
        title += " (via proxy)" if via_proxy == "proxy" else f" (via proxy {via_proxy})"
    return Lane(f"bot:{label}", title, "bot", via_proxy)


def _bot_events(ld: Loading, label: str) -> list[dict[str, Any]]:
    text = ld.ed.text(f"{label}.stderr")
    if text is None:
        ld.notes.append(f"{label}.stderr: absent, so the bot's own events are not drawn")
        return []
    return parse_botevents(text)


def _post_table(result: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The experiment's own post table (``details.posts``), by text."""
    rows = ((result or {}).get("details", {}) or {}).get("posts", []) or []
    return {str(r.get("text")): r for r in rows if isinstance(r, dict) and "text" in r}


def load_bots(ld: Loading) -> None:
    """Each bot's lane, its own events as markers, and its posts scored."""
    post_table = _post_table(ld.run.result)
    for label in ld.labels:
        lane = _bot_lane(ld, label)
        ld.run.lanes.append(lane)
        botevents = _bot_events(ld, label)
        timed = [(ld.rel(e["mono"]), e) for e in botevents if "mono" in e]
        for t, ev in timed:
            mk = _bot_marker(ev)
            if mk is not None:
                ld.run.markers.append(Marker(lane.id, t, mk[0], mk[1]))
        lane_faults = [f for f in ld.run.faults if f.proxy == lane.via and not f.instant]
        drops = [t for t, e in timed if e.get("event") == "disconnected"]
        for f in lane_faults:
            mark_left(f, lane.id, drops)
        confirms = [(t, e) for t, e in timed if e.get("event") == "post_confirm"]
        for rec in _call_records(ld.ed, label, ld.notes):
            t_end = ld.rel(rec.get("mono", 0.0))
            t = t_end - float(rec.get("seconds") or 0.0)
            call = Call(rec, t, t_end, call_text(rec), confirms, post_table)
            ld.run.posts.append(
                score_call(lane.id, call, ld.received, ld.has_observer, lane_faults)
            )


def load_decisions(ld: Loading) -> None:
    """Decision logs (faultnet chaos's join log; the fleet's faults.jsonl in its
    shape): one marker per decision on the lane of the proxy it targets."""
    for f in ld.ed.glob("faults*.jsonl", "chaos*.jsonl"):
        for r in read_records(f, ld.notes):
            mk = _decision_marker(r)
            if mk is None:
                continue
            lane_id = f"proxy:{r.get('target')}"
            if ld.run.lane(lane_id) is None:
                ld.run.lanes.insert(0, Lane(lane_id, f"target {r.get('target')}", "proxy"))
            ld.run.markers.append(Marker(lane_id, ld.rel(r["mono"]), mk[0], mk[1]))


def add_observer_lane(ld: Loading) -> None:
    """The observer's lane, a marker per line it received."""
    if not ld.has_observer:
        return
    ld.run.lanes.append(Lane("observer", "observer (direct link)", "observer"))
    for t, sender, text in ld.received:
        ld.run.markers.append(Marker("observer", t, "received", f"{sender}: {text[:60]}"))


def order_lanes(ld: Loading) -> None:
    """Each proxy's lane directly above the bots behind it, so its fault bands read as
    one block; then any other lane, the observer last."""
    lanes = ld.run.lanes
    ordered: list[Lane] = []
    for ln in lanes:
        if ln.kind == "proxy":
            ordered.append(ln)
            ordered += [b for b in lanes if b.via and f"proxy:{b.via}" == ln.id]
    ordered += [ln for ln in lanes if ln not in ordered and ln.kind != "observer"]
    ld.run.lanes = ordered + [ln for ln in lanes if ln.kind == "observer"]


def set_span(ld: Loading) -> None:
    """Posts and markers in time order, and the run's end: its last mark or record."""
    run = ld.run
    run.posts.sort(key=lambda p: p.t)
    run.markers.sort(key=lambda m: m.t)
    times = [0.0, *(p.t_end for p in run.posts), *(m.t for m in run.markers)]
    times += [f.end for f in run.faults if f.end is not None]
    times += [ld.rel(r["mono"]) for r in ld.events if "mono" in r]
    run.end = max(times)


def set_replay(ld: Loading) -> None:
    """The command that replays the run (see :func:`_replay`)."""
    ld.run.replay, ld.run.replay_recorded = _replay(ld.run.path, ld.run, ld.ed)


def list_files(ld: Loading) -> None:
    """The evidence files to link (not the report's own outputs, nor secrets), and
    everything that was passed over."""
    ld.run.files = ld.ed.listing(leave_out=(*OUTPUT_FILES, *_NOT_EVIDENCE, "pair.json"))
    ld.run.skipped = ld.ed.skipped_lines()


#: The steps of :func:`load_run`, in order, each reading one kind of evidence into the
#: run. Order matters where a step uses an earlier one's work: the bots need the
#: proxies' ports and faults and the observer's transcript; the lane order needs every
#: lane; the span every mark; the list of what was skipped comes last.
LOAD_STEPS: tuple[tuple[str, Callable[[Loading], None]], ...] = (
    ("proxies: lanes, fault intervals, connection markers", load_proxies),
    ("bots: which there are", find_bots),
    ("observer: what it received", load_observer),
    ("bots: lanes, their own events, their posts", load_bots),
    ("decision logs", load_decisions),
    ("observer: its lane", add_observer_lane),
    ("lane order", order_lanes),
    ("time span", set_span),
    ("replay command", set_replay),
    ("evidence files and what was not read", list_files),
)


def load_run(path: Path, *, title: str | None = None) -> Run:
    """Load everything one run directory holds. Never raises for missing or damaged
    evidence: what could not be read is listed in ``run.notes``. A result.json or
    verdict.json of the wrong shape raises :class:`MalformedEvidence`."""
    ld = begin(Path(path), title)
    for _what, step in LOAD_STEPS:
        step(ld)
    return ld.run


def _with_verdict(
    result: dict[str, Any] | None, verdict: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A separate verifier's verdict (the fleet's ``verdict.json``: ``ok`` and ``checks``)
    joins the run's own checks: the run passes only if both do. A control run's verdict
    (``mode`` "control") that is ok is one whose loss checks failed, as they must: those
    are marked ``expected_fail`` and do not fail the run (the page said FAIL, and
    `faultnet report` exited 1, for a control that did its job)."""
    if not verdict or not isinstance(verdict.get("checks"), list):
        return result
    control_ok = verdict.get("mode") == "control" and bool(verdict.get("ok"))
    doc = dict(result or {})
    if isinstance(verdict.get("message"), str):  # the page's summary line
        doc["verifier_message"] = verdict["message"]
    doc["checks"] = [
        *doc.get("checks", []),
        *(
            {
                "name": f"verifier: {c.get('name')}",
                "passed": bool(c.get("passed")),
                "detail": str(c.get("detail", "")),
                "role": "verifier",
                **({"expected_fail": True} if control_ok and not c.get("passed") else {}),
            }
            for c in verdict["checks"]
            if isinstance(c, dict)
        ),
    ]
    doc["passed"] = bool(doc.get("passed", True)) and bool(verdict.get("ok"))
    return doc


def _call_records(ed: EvidenceDir, label: str, notes: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if why_not_read(ed.root, f"calls/{label}", directory=True) is not None:
        return out  # absent, or a link (skipped when the labels were listed)
    for f in ed.glob(f"calls/{glob_escape(label)}/*.jsonl"):
        for r in read_records(f, notes):
            if (
                r.get("event") == "request"
                and r.get("method") == "tools/call"
                and r.get("tool") == "send-channel"
            ):
                out.append(r)
    return out


def _replay(path: Path, run: Run, ed: EvidenceDir) -> tuple[str, bool]:
    """The command that replays *run*: recorded (``command.txt`` here or in the pair
    directory above, a regular file either way), else rebuilt from result.json."""
    for root, shown in ((path, "command.txt"), (path.parent, "../command.txt")):
        why = why_not_read(root, "command.txt")
        if why is None:
            text = (root / "command.txt").read_text(errors="replace").strip()
            if text:
                return text, True
        elif why != "absent":
            ed.skipped.setdefault(shown, why)
    if not run.experiment or run.seed is None:
        return "", False
    argv = [sys.executable, "-m", f"harness.exp_{run.experiment}"]
    if run.bot_argv:
        argv += ["--bot-bin", shlex.join(run.bot_argv)]
    argv += ["--env", "auto"]
    if run.time_scale is not None:
        argv += ["--time-scale", f"{run.time_scale:g}"]
    argv += ["--seed", str(run.seed)]
    return shlex.join(argv), False
