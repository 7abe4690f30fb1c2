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
or linked, and :attr:`Run.skipped` says which were passed over and why.

Every file is optional: a directory kept from a killed attempt loads with what it has,
and :attr:`Run.notes` says what was missing or truncated (a ``result.json`` that is not
JSON at all is what a killed writer leaves: a note too). A ``result.json`` or
``verdict.json`` that is JSON but not in the shape its writer gives it was not written
by the runner, and the report does not guess at it: :class:`MalformedEvidence`, one line
naming the file and the field (exit 2 on the command line). Times from different processes
are comparable: every record's ``mono`` is CLOCK_MONOTONIC of the same host, and the
observer's wall-clock receive times are mapped onto it through its record's own
(wall, mono) pair.

A post is scored the way the experiments score it (principle 3): *claimed* is what the
bot's answer said (:func:`harness.experiment.claims_delivery`), *received* is whether the
observer got the exact text. The answer is read from the call record (``result_text``);
runs recorded before the call record kept it fall back to the experiment's own post
table, then to the bot's ``post_confirm`` events, and say so in ``claim_source``.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from collections.abc import Callable, Iterable
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from faultnet.eventlog import CorruptLogError, read_jsonl
from faultnet.modes import MODES
from harness.experiment import claims_delivery, parse_botevents
from harness.report._model import FaultInterval, Lane, Marker, Post, Run

__all__ = [
    "OUTPUT_FILES",
    "EvidenceDir",
    "MalformedEvidence",
    "check_shape",
    "fault_intervals",
    "is_run_dir",
    "load_run",
    "score_post",
]

#: What the report builder itself writes into a run directory (never listed as evidence).
OUTPUT_FILES = ("report.html", "report.json", "timeline.png", "timeline.svg")
#: Files that hold secrets (tokens) or are machinery, not evidence worth a link.
_NOT_EVIDENCE = ("env/state.env", "env/.env.lock", "env/registry.sqlite3")

#: Which faults each removal ends, from faultnet's one table of modes. A mode nothing
#: undoes (sever, reset) acts once: an instant, not an interval. The proxy logs a sever
#: as "severed" (the close's name). A toxic lasts from toxic_added to toxic_removed.
UNDOES = {m.name: m.undoes for m in MODES.values() if m.acts_on == "undo"}
INSTANT_MODES = (
    *(m.name for m in MODES.values() if m.acts_on != "undo" and m.undone_by is None),
    "severed",
)


class MalformedEvidence(Exception):
    """A JSON file read as a whole (``result.json``, ``verdict.json``, ``pair.json``) is
    not in the shape its writer gives it; the message is one line: the file, the field,
    what it must be."""


# --------------------------------------------------------------------------- shapes

#: A field's shape: what it must be (said in the error) and the test of a value.
Shape = tuple[str, Callable[[Any], bool]]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _dict(v: Any) -> bool:
    return isinstance(v, dict)


def _named(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("name"), str)


#: The fields of result.json the report reads, as ``Result.to_json`` writes them
#: (harness/_report.py); a field may be absent, never of another shape.
RESULT_SHAPE: dict[str, Shape] = {
    "experiment": ("a string", _str),
    "arm": ("a string", _str),
    "seed": ("an integer or null", _optional(lambda v: isinstance(v, int) and _number(v))),
    "time_scale": ("a number or null", _optional(_number)),
    "duration_s": ("a number or null", _optional(_number)),
    "bot_argv": ("a list of strings", _list_of(_str)),
    "checks": ("a list of objects, each with a string name", _list_of(_named)),
    "headline": ("an object", _dict),
    "controls": ("a list of objects", _list_of(_dict)),
    "error": ("a string or null", _optional(_str)),
    "passed": ("true or false", lambda v: isinstance(v, bool)),
    "details": (
        "an object whose posts, if any, is a list",
        lambda v: isinstance(v, dict) and isinstance(v.get("posts", []), list),
    ),
}

#: verdict.json, as the fleet's verifier writes it (harness/fleet_verify.py).
VERDICT_SHAPE: dict[str, Shape] = {
    "ok": ("true or false", lambda v: isinstance(v, bool)),
    "checks": ("a list of objects", _list_of(_dict)),
}


def check_shape(doc: Any, shape: dict[str, Shape], where: str) -> dict[str, Any]:
    """*doc* if it is an object whose fields in *shape* (each optional) have their
    shape; else :class:`MalformedEvidence` saying, in one line, which field of *where*."""
    if not isinstance(doc, dict):
        raise MalformedEvidence(
            f"{where}: malformed: a JSON object expected, not {type(doc).__name__}"
        )
    for key, (what, test) in shape.items():
        if key in doc and not test(doc[key]):
            got = json.dumps(doc[key])
            got = got if len(got) <= 40 else got[:37] + "..."
            raise MalformedEvidence(f"{where}: malformed: {key} must be {what}, not {got}")
    return doc


# --------------------------------------------------------------------------- the directory


def why_not_read(root: Path, rel: str, *, directory: bool = False) -> str | None:
    """None if ``root/rel`` is a regular file (a directory, with *directory*) reached
    from *root* through real directories only, no component a symbolic link; else why
    it is not read: "absent", "a symbolic link", "not a regular file", "not a directory".
    """
    cur = root
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            mode = os.lstat(cur).st_mode
        except FileNotFoundError:
            return "absent"
        except OSError as exc:
            return f"unreadable ({exc.strerror})"
        if stat.S_ISLNK(mode):
            return "a symbolic link"
        if i == len(parts) - 1 and not directory:
            return None if stat.S_ISREG(mode) else "not a regular file"
        if not stat.S_ISDIR(mode):
            return "not a directory"
    return None


class EvidenceDir:
    """A run directory as the loader may read it: only regular files inside it, reached
    through real directories. Whatever else is met where evidence is looked for (a
    symbolic link, a FIFO, a socket) is not opened; :attr:`skipped` says what, once each.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: Relative path -> why it was not read, in the order met.
        self.skipped: dict[str, str] = {}

    def _ok(self, rel: str) -> bool:
        why = why_not_read(self.root, rel)
        if why is not None and why != "absent":
            self.skipped.setdefault(rel, why)
        return why is None

    def file(self, rel: str) -> Path | None:
        """``root/rel`` if it may be read (None if absent or skipped)."""
        return self.root / rel if self._ok(rel) else None

    def exists(self, rel: str) -> bool:
        """Is there anything at all at ``root/rel`` (a link, even a broken one, counts)?"""
        return os.path.lexists(self.root / rel)

    def glob(self, *patterns: str) -> list[Path]:
        """The readable files matching any of *patterns* (relative, no ``**``), sorted."""
        hits = {f for pat in patterns for f in self.root.glob(pat)}
        rels = sorted(f.relative_to(self.root).as_posix() for f in hits)
        return [self.root / r for r in rels if self._ok(r)]

    def subdirs(self, rel: str) -> list[Path]:
        """The real directories directly inside ``root/rel`` (a linked one is skipped)."""
        why = why_not_read(self.root, rel, directory=True)
        if why is not None:
            if why != "absent":
                self.skipped.setdefault(rel, why)
            return []
        out = []
        for d in sorted((self.root / rel).iterdir()):
            r = d.relative_to(self.root).as_posix()
            why = why_not_read(self.root, r, directory=True)
            if why == "a symbolic link":
                self.skipped.setdefault(r, why)
            elif why is None:
                out.append(d)
        return out

    def text(self, rel: str) -> str | None:
        f = self.file(rel)
        return None if f is None else f.read_text(errors="replace")

    def listing(self, leave_out: Iterable[str] = ()) -> list[str]:
        """Every regular file under the directory (relative paths, sorted), walked
        without following links; what is not a regular file is skipped and said."""
        leave = set(leave_out)
        out = []
        for top, dirs, files in os.walk(self.root, followlinks=False):
            here = Path(top).relative_to(self.root)
            for d in list(dirs):
                if os.path.islink(os.path.join(top, d)):
                    self.skipped.setdefault((here / d).as_posix(), "a symbolic link")
                    dirs.remove(d)
            for f in files:
                rel = (here / f).as_posix()
                if rel not in leave and self._ok(rel):
                    out.append(rel)
        return sorted(out)

    def skipped_lines(self) -> list[str]:
        """One line per skipped path: ``NAME: why, not read``."""
        return [f"{rel}: {why}, not read" for rel, why in self.skipped.items()]


def is_run_dir(path: Path) -> bool:
    """Does *path* hold one run's evidence (a result, or at least the harness's log) as
    regular files? (Whether *path* itself may be a link is its caller's to say.)"""
    path = Path(path)
    if not path.is_dir():
        return False
    return any(why_not_read(path, f) is None for f in ("result.json", "events.jsonl"))


# --------------------------------------------------------------------------- reading


def _records(path: Path | None, notes: list[str]) -> list[dict[str, Any]]:
    """The records of one JSONL file (None: absent or skipped); a truncated tail or
    corruption becomes a note."""
    if path is None:
        return []
    try:
        read = read_jsonl(path)
    except CorruptLogError as exc:
        notes.append(f"{path.name}: corrupt, not drawn ({exc})")
        return []
    except OSError as exc:
        notes.append(f"{path.name}: unreadable ({exc})")
        return []
    if read.truncated_tail is not None:
        notes.append(f"{path.name}: its last line was truncated (the writer was killed)")
    return [r for r in read.records if isinstance(r, dict)]


def _json_file(
    path: Path | None, notes: list[str], shape: dict[str, Shape]
) -> dict[str, Any] | None:
    """The object in *path* (None: absent or skipped); None (and a note) if it is not
    JSON at all (a killed writer's truncation); :class:`MalformedEvidence` if it is JSON
    of the wrong shape."""
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name}: unreadable ({exc})")
        return None
    return check_shape(doc, shape, str(path))


# --------------------------------------------------------------------------- faults


#: A connection's client has left it: it closed its end (its FIN or RST held by the
#: fault, on the stream from the client), the peer reset it, or it closed.
def _left_by_client(r: dict[str, Any]) -> bool:
    ev = r.get("event")
    if ev in ("held_fin", "held_rst"):
        return r.get("stream") == "upstream"
    return ev in ("conn_close", "peer_reset")


def _holds_only_open_connections(r: dict[str, Any]) -> bool:
    """Does this fault_applied record act on the connections it lists and on no new
    ones? (``include_new`` off, and a mode that leaves new connections unchanged, from
    faultnet's table of modes; a partition, say, also drops new SYNs.)"""
    m = MODES.get(str(r.get("mode", "")))
    return (
        m is not None
        and m.acts_on == "connections"
        and m.new_connections.startswith("unchanged")
        and not r.get("include_new")
        and bool(r.get("connections"))
    )


def released_at(iv: FaultInterval, leaves: dict[Any, list[float]]) -> float | None:
    """When every connection *iv* held had been left by its client (*leaves*: each
    connection's leaving times), if before *iv* ended; else None."""
    times = []
    for c in iv.connections or []:
        after = [t for t in leaves.get(c, []) if t >= iv.start]
        if not after:
            return None
        times.append(min(after))
    if not times:
        return None
    last = max(times)
    return last if iv.end is None or last < iv.end else None


def mark_left(f: FaultInterval, lane_id: str, drops: Iterable[float]) -> None:
    """Record on *f* when the bot of *lane_id* left the connection it held: its first
    drop (*drops*: its ``disconnected`` times) while *f* was in force, if *f* held open
    connections only (whatever it connects next is new, so not behind *f*)."""
    if f.catches_new:
        return
    inside = [t for t in drops if f.start <= t and (f.end is None or t < f.end)]
    if inside:
        f.left[lane_id] = min(inside)


def fault_intervals(
    records: Iterable[dict[str, Any]], proxy: str, t0: float
) -> list[FaultInterval]:
    """Fault intervals of one proxy from its event records (in time order).

    A fault never removed has ``end=None``; sever/reset are instants (``end == start``).
    A fault on open connections only has ``released`` set when its clients left them
    all before it ended (see :class:`FaultInterval`).
    """
    records = list(records)
    out: list[FaultInterval] = []
    open_: list[FaultInterval] = []
    toxics: dict[str, FaultInterval] = {}
    scoped: list[FaultInterval] = []
    leaves: dict[Any, list[float]] = {}
    for r in records:
        if _left_by_client(r):
            leaves.setdefault(r.get("conn"), []).append(float(r.get("mono", 0.0)) - t0)
        ev, t = r.get("event"), float(r.get("mono", 0.0)) - t0
        mode = str(r.get("mode", ""))
        if ev == "fault_applied":
            conns = r.get("connections")
            iv = FaultInterval(proxy, mode, t, None, str(r.get("stream", "both")), conns)
            if _holds_only_open_connections(r):
                iv.catches_new = False
                scoped.append(iv)
            if mode in INSTANT_MODES:
                iv.end = t
                # The connections it closed take their freeze or blackhole with them.
                for held in list(open_):
                    if conns and held.connections and set(held.connections) <= set(conns):
                        held.end, held.removed_by = t, mode
                        open_.remove(held)
            else:
                open_.append(iv)
            out.append(iv)
        elif ev == "fault_removed":
            ends = UNDOES.get(mode, (mode,))
            stream, conns = str(r.get("stream", "both")), r.get("connections")
            for iv in list(open_):
                if iv.mode not in ends:
                    continue
                if stream != "both" and iv.stream != stream:
                    continue
                if conns and iv.connections and not set(conns) & set(iv.connections):
                    continue  # a thaw of other connections only
                iv.end, iv.removed_by = t, mode
                open_.remove(iv)
        elif ev == "toxic_added":
            name = str(r.get("toxic"))
            iv = FaultInterval(proxy, f"{r.get('type', 'toxic')} toxic", t, None)
            iv.stream = str(r.get("stream", "both"))
            toxics[name] = iv
            out.append(iv)
        elif ev == "toxic_removed":
            iv = toxics.pop(str(r.get("toxic")), None)
            if iv is not None:
                iv.end, iv.removed_by = t, "toxic_removed"
    for iv in scoped:
        iv.released = released_at(iv, leaves)
    return out


_PROXY_MARKERS = {
    "conn_open": lambda r: ("conn_open", f"conn {r.get('conn')} open"),
    "conn_close": lambda r: ("conn_close", f"conn {r.get('conn')} closed ({r.get('how')})"),
    "held_fin": lambda r: ("held_close", f"conn {r.get('conn')} FIN held ({r.get('stream')})"),
    "held_rst": lambda r: ("held_close", f"conn {r.get('conn')} RST held ({r.get('stream')})"),
    "peer_reset": lambda r: ("connection_lost", f"conn {r.get('conn')} peer reset"),
    "upstream_failed": lambda r: ("connect_failed", f"conn {r.get('conn')} upstream failed"),
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


# --------------------------------------------------------------------------- bots

#: BOTEVENT name -> marker kind (None: not drawn). ``disconnected`` for a PONG timeout
#: is already drawn as the pong_timeout itself.
_BOT_MARKERS = {
    "pong_timeout": "pong_timeout",
    "reconnected": "reconnected",
    "connect_failed": "connect_failed",
}


def _bot_marker(ev: dict[str, Any]) -> tuple[str, str] | None:
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


def score_post(
    claimed: bool | None, received_t: float | None, observed: bool, fault_end: float | None
) -> str:
    """The outcome name of one post (see :data:`harness.report._model.OUTCOMES`).

    *observed*: the run has an observer transcript at all (without one nothing can be
    said about delivery). *fault_end*: the end (on the proxy) of the fault interval the
    post was made in, if any (a claimed post received only after it is "late", not delivered).
    """
    if claimed is None or not observed:
        return "unknown"
    received = received_t is not None
    if not claimed:
        return "unconfirmed_received" if received else "unconfirmed"
    if not received:
        return "silent_loss"
    if fault_end is not None and received_t is not None and received_t > fault_end:
        return "late"
    return "delivered"


# --------------------------------------------------------------------------- the run


def load_run(path: Path, *, title: str | None = None) -> Run:
    """Load everything one run directory holds. Never raises for missing or damaged
    evidence: what could not be read is listed in ``run.notes``. A result.json or
    verdict.json of the wrong shape raises :class:`MalformedEvidence`."""
    path = Path(path)
    ed = EvidenceDir(path)
    notes: list[str] = []
    result = _json_file(ed.file("result.json"), notes, RESULT_SHAPE)
    if result is None and not ed.exists("result.json"):
        notes.append("result.json: absent (the attempt was killed or is still running)")
    result = _with_verdict(result, _json_file(ed.file("verdict.json"), notes, VERDICT_SHAPE))
    events = _records(ed.file("events.jsonl"), notes)

    proxies: dict[str, list[dict[str, Any]]] = {}
    for f in ed.glob("proxy*.jsonl", "proxies*.jsonl"):
        for r in _records(f, notes):
            proxies.setdefault(str(r.get("proxy") or f.stem), []).append(r)
    for recs in proxies.values():
        recs.sort(key=lambda r: float(r.get("mono", 0.0)))

    # t = 0: the first fault applied, else the attempt's start, else the first record.
    applied = [
        float(r["mono"])
        for recs in proxies.values()
        for r in recs
        if r.get("event") in ("fault_applied", "toxic_added") and "mono" in r
    ]
    starts = [float(r["mono"]) for r in events if r.get("event") == "attempt" and "mono" in r]
    every = [float(r["mono"]) for recs in [events, *proxies.values()] for r in recs if "mono" in r]
    if applied:
        origin_mono, origin = min(applied), "the first fault applied"
    elif starts:
        origin_mono, origin = min(starts), "the run's start"
    else:
        origin_mono, origin = (min(every) if every else 0.0), "the first record"

    def rel(mono: Any) -> float:
        return float(mono) - origin_mono

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

    # Proxies: a lane each, their fault intervals and connection markers.
    port_to_proxy: dict[int, str] = {}
    for name, recs in proxies.items():
        listening = next((r for r in recs if r.get("event") == "listening"), {})
        listen = str(listening.get("listen", ""))
        if listen.rpartition(":")[2].isdigit():
            port_to_proxy[int(listen.rpartition(":")[2])] = name
        shown = "proxy" if name == "proxy" else f"proxy {name}"
        run.lanes.append(Lane(f"proxy:{name}", f"{shown} {listen}".strip(), "proxy"))
        run.faults += fault_intervals(recs, name, origin_mono)
        for r in recs:
            mk = _PROXY_MARKERS.get(str(r.get("event")))
            if mk is not None and "mono" in r:
                kind, label = mk(r)
                run.markers.append(Marker(f"proxy:{name}", rel(r["mono"]), kind, label))

    # Bots: one lane per label (stderr file or call-record directory).
    started = {str(r.get("label")): r for r in events if r.get("event") == "bot_started"}
    labels = sorted(
        {f.stem for f in ed.glob("*.stderr")}
        | {d.name for d in ed.subdirs("calls")}
        | set(started),
        key=lambda s: (list(started).index(s) if s in started else len(started), s),
    )
    observer_file = ed.file("observer.jsonl")
    observer = _records(observer_file, notes)
    has_observer = observer_file is not None
    if not has_observer:
        notes.append("observer.jsonl: absent, so no post can be scored as received or lost")
    received = []  # (rel time, sender, text)
    for r in observer:
        if r.get("event") != "message" or not isinstance(r.get("text"), str):
            continue
        when = r.get("time")
        if isinstance(when, (int, float)) and "wall" in r and "mono" in r:
            t = rel(float(r["mono"]) - (float(r["wall"]) - float(when)))
        else:
            t = rel(r.get("mono", origin_mono))
        received.append((t, str(r.get("sender") or ""), r["text"]))

    posted_by_text = {
        str(row.get("text")): row
        for row in (res.get("details", {}) or {}).get("posts", []) or []
        if isinstance(row, dict) and "text" in row
    }

    for label in labels:
        lane_id = f"bot:{label}"
        st = started.get(label, {})
        via = st.get("via")
        via_proxy = None
        if isinstance(via, list) and len(via) == 2 and str(via[1]).isdigit():
            via_proxy = port_to_proxy.get(int(via[1]))
        nick = st.get("nick", "")
        title_ = f"{label} {nick}".strip()
        if via_proxy:
            title_ += " (via proxy)" if via_proxy == "proxy" else f" (via proxy {via_proxy})"
        run.lanes.append(Lane(lane_id, title_, "bot", via_proxy))
        stderr_text = ed.text(f"{label}.stderr")
        botevents: list[dict[str, Any]] = []
        if stderr_text is not None:
            botevents = parse_botevents(stderr_text)
        else:
            notes.append(f"{label}.stderr: absent, so the bot's own events are not drawn")
        for ev in botevents:
            mk2 = _bot_marker(ev)
            if mk2 is not None and "mono" in ev:
                run.markers.append(Marker(lane_id, rel(ev["mono"]), mk2[0], mk2[1]))
        confirms = [e for e in botevents if e.get("event") == "post_confirm" and "mono" in e]
        lane_faults = [f for f in run.faults if f.proxy == via_proxy and not f.instant]
        drops = [
            rel(e["mono"]) for e in botevents if e.get("event") == "disconnected" and "mono" in e
        ]
        for f in lane_faults:
            mark_left(f, lane_id, drops)
        for rec in _call_records(ed, label, notes):
            run.posts.append(
                _post(
                    lane_id, rec, rel, confirms, posted_by_text, received, has_observer, lane_faults
                )
            )

    # Decision logs (faultnet chaos's join log; the fleet's faults.jsonl in its shape):
    # one marker per decision on the lane of the proxy it targets.
    for f in ed.glob("faults*.jsonl", "chaos*.jsonl"):
        for r in _records(f, notes):
            kind = _DECISIONS.get(
                str(r.get("action") if r.get("action") == "skip" else r.get("event"))
            )
            if kind is None or "mono" not in r:
                continue
            lane_id = f"proxy:{r.get('target')}"
            if run.lane(lane_id) is None:
                run.lanes.insert(0, Lane(lane_id, f"target {r.get('target')}", "proxy"))
            why = r.get("outcome") or r.get("result") or r.get("reason") or r.get("rail") or ""
            if isinstance(r.get("detail"), dict) and r["detail"].get("reason"):
                why = r["detail"]["reason"]
            label = f"{r.get('event')} {r.get('action')}" + (f": {why}" if why else "")
            run.markers.append(Marker(lane_id, rel(r["mono"]), kind, label))

    if has_observer:
        run.lanes.append(Lane("observer", "observer (direct link)", "observer"))
        for t, sender, text in received:
            run.markers.append(Marker("observer", t, "received", f"{sender}: {text[:60]}"))

    # Each proxy's lane directly above the bots behind it, so its fault bands read as
    # one block; then any other lane, the observer last.
    ordered: list[Lane] = []
    for ln in run.lanes:
        if ln.kind == "proxy":
            ordered.append(ln)
            ordered += [b for b in run.lanes if b.via and f"proxy:{b.via}" == ln.id]
    ordered += [ln for ln in run.lanes if ln not in ordered and ln.kind != "observer"]
    run.lanes = ordered + [ln for ln in run.lanes if ln.kind == "observer"]

    run.posts.sort(key=lambda p: p.t)
    run.markers.sort(key=lambda m: m.t)
    times = [0.0, *(p.t_end for p in run.posts), *(m.t for m in run.markers)]
    times += [f.end for f in run.faults if f.end is not None]
    times += [rel(r["mono"]) for r in events if "mono" in r]
    run.end = max(times)

    run.replay, run.replay_recorded = _replay(path, run, ed)
    run.files = ed.listing(leave_out=(*OUTPUT_FILES, *_NOT_EVIDENCE, "pair.json"))
    run.skipped = ed.skipped_lines()
    return run


def _with_verdict(
    result: dict[str, Any] | None, verdict: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A separate verifier's verdict (the fleet's ``verdict.json``: ``ok`` and ``checks``)
    joins the run's own checks: the run passes only if both do."""
    if not verdict or not isinstance(verdict.get("checks"), list):
        return result
    doc = dict(result or {})
    doc["checks"] = [
        *doc.get("checks", []),
        *(
            {
                "name": f"verifier: {c.get('name')}",
                "passed": bool(c.get("passed")),
                "detail": str(c.get("detail", "")),
                "role": "verifier",
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
        for r in _records(f, notes):
            if (
                r.get("event") == "request"
                and r.get("method") == "tools/call"
                and r.get("tool") == "send-channel"
            ):
                out.append(r)
    return out


def _post(
    lane_id: str,
    rec: dict[str, Any],
    rel: Any,
    confirms: list[dict[str, Any]],
    posted_by_text: dict[str, dict[str, Any]],
    received: list[tuple[float, str, str]],
    has_observer: bool,
    lane_faults: list[FaultInterval],
) -> Post:
    t_end = rel(rec.get("mono", 0.0))
    t = t_end - float(rec.get("seconds") or 0.0)
    try:
        args = json.loads(rec.get("arguments") or "{}")
    except ValueError:
        args = {}
    text = str(args.get("text", "")) if isinstance(args, dict) else ""
    answer: str | None = None
    claimed: bool | None = None
    source = ""
    if "result_text" in rec:
        answer = rec.get("result_text")
        claimed = claims_delivery(answer or "")
        source = "the call record's answer"
        if answer is None:
            answer = f"<{rec.get('outcome')}>"
    elif text in posted_by_text and "claimed" in posted_by_text[text]:
        row = posted_by_text[text]
        answer, claimed = row.get("result"), bool(row["claimed"])
        source = "the experiment's post table"
    else:
        # The bot's own post_confirm inside the call's window (same host clock).
        mine = [
            e
            for e in confirms
            if t - 0.001 <= rel(e["mono"]) <= t_end + 0.001 and e.get("result") is not None
        ]
        if mine:
            answer = f"post_confirm {mine[0].get('result')}"
            claimed = mine[0].get("result") in ("confirmed", "skipped")
            source = "the bot's post_confirm event"
        elif rec.get("outcome") not in ("ok", "is_error"):
            answer, claimed, source = f"<{rec.get('outcome')}>", False, "the call record"
    got = [rt for rt, _s, body in received if text and text in body]
    received_t = min(got) if got else None
    # The fault the post was made in: one still holding what its bot uses (a post made
    # after the bot reconnected round it is not in it). "Late" is measured from the
    # fault's end on the proxy, when what it held was let go.
    fault = next((f for f in lane_faults if f.holds(lane_id, t)), None)
    outcome = score_post(claimed, received_t, has_observer, fault.end if fault else None)
    return Post(lane_id, t, t_end, text, answer, claimed, received_t, outcome, source)


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
