"""What the verifier reads: a fleet run directory, as facts the checks judge.

Nothing here judges. :func:`load` reads the manifest and every file it names (a file
missing or unreadable makes the run :class:`Unusable`); :func:`episodes` groups the
join log's applied steps into the faults as they were in force; :func:`facts` gathers
everything the checks of :mod:`harness.fleet._checks` look at.

The faults file is ``faultnet chaos``'s join log, its one record schema
(:mod:`faultnet.chaos._joinlog`): an applied step is a ``fault`` or ``undo`` record;
``began`` is when its call began (effects are looked for from there), ``mono`` when it
returned (in force from there); an episode's fault record names its down mode
(``detail.down``) and the connections it took (``result.conns``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faultnet.eventlog import CorruptLogError, read_jsonl
from harness.experiment import parse_botevents

__all__ = [
    "DOWN_ACTIONS",
    "LINK_ACTIONS",
    "MANIFEST_FORMAT",
    "Bot",
    "Episode",
    "Facts",
    "Unusable",
    "applied",
    "episodes",
    "facts",
    "load",
    "outage_window",
]

MANIFEST_FORMAT = "faultnet-fleet/1"
DOWN_ACTIONS = ("freeze", "blackhole")
#: The faults whose effect on the bot's live link the verifier can demand. Anything else
#: a chaos plan file enables (drop_syn, refuse, toxics) is joined to what followed, and
#: to a reason when nothing did, but never required to have an effect.
LINK_ACTIONS = (*DOWN_ACTIONS, "sever", "reset", "thaw")


class Unusable(Exception):
    """The run directory cannot be judged (exit 2)."""


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path).records
    except FileNotFoundError:
        raise Unusable(f"{path} is missing") from None
    except (OSError, CorruptLogError) as exc:
        raise Unusable(f"cannot read {path}: {exc}") from None


def _botevents(path: Path) -> list[dict[str, Any]]:
    try:
        return parse_botevents(path.read_text(errors="replace"))
    except OSError as exc:
        raise Unusable(f"cannot read {path}: {exc}") from None


def _call_texts(directory: Path) -> set[str]:
    """The text argument of every recorded send-channel request that got an answer."""
    texts: set[str] = set()
    for path in sorted(directory.glob("*.jsonl")):
        for rec in _records(path):
            if rec.get("event") != "request" or rec.get("tool") != "send-channel":
                continue
            if rec.get("outcome") not in ("ok", "is_error"):
                continue
            try:
                texts.add(json.loads(rec.get("arguments") or "{}").get("text", ""))
            except ValueError:
                continue
    return texts


@dataclass
class Bot:
    label: str
    posts: list[dict[str, Any]]
    fds: list[dict[str, Any]]
    events: list[dict[str, Any]]
    call_texts: set[str]

    def connected_at(self, t: float) -> bool:
        """Was the bot's latest link event at or before *t* a ``connected``?"""
        state = False
        for e in self.events:
            if float(e.get("mono", 0)) > t:
                break
            if e.get("event") == "connected":
                state = True
            elif e.get("event") in ("disconnected", "pong_timeout"):
                state = False
        return state

    def session_at(self, t: float) -> int | None:
        """The bot's session that was up at *t* (its latest ``connected`` at or before
        *t*, not yet ended), or None."""
        session = None
        for e in self.events:
            if float(e.get("mono", 0)) > t:
                break
            if e.get("event") == "connected":
                session = e.get("session")
            elif e.get("event") in ("disconnected", "pong_timeout"):
                session = None
        return session

    def first(self, name: str, after: float, before: float = float("inf")) -> float | None:
        for e in self.events:
            m = float(e.get("mono", 0))
            if e.get("event") == name and after < m <= before:
                return m
        return None


def _manifest(run_dir: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((run_dir / "manifest.json").read_text())
    except FileNotFoundError:
        raise Unusable(f"no manifest.json in {run_dir}: not a fleet run directory") from None
    except (OSError, ValueError) as exc:
        raise Unusable(f"cannot read {run_dir / 'manifest.json'}: {exc}") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise Unusable(f"manifest format {manifest.get('format')!r}, not {MANIFEST_FORMAT}")
    if manifest.get("status") != "complete":
        raise Unusable(f"the run did not complete (status {manifest.get('status')!r})")
    return manifest


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Bot], list[dict], list[str]]:
    """The manifest, the bots by label, the applied fault records, the observed texts."""
    manifest = _manifest(run_dir)
    bots: dict[str, Bot] = {}
    for b in manifest["bots"]:
        events = sorted(_botevents(run_dir / b["stderr"]), key=lambda e: float(e.get("mono", 0)))
        bots[b["label"]] = Bot(
            b["label"],
            _records(run_dir / b["posts"]),
            _records(run_dir / b["fds"]),
            events,
            _call_texts(run_dir / b["calls"]),
        )
    faults = [
        r
        for r in _records(run_dir / manifest["files"]["faults"])
        if r.get("event") in ("fault", "undo")
    ]
    observed = [
        str(r.get("text") or "")
        for r in _records(run_dir / manifest["files"]["observer"])
        if r.get("event") == "message"
    ]
    return manifest, bots, faults, observed


# --------------------------------------------------------------------------- episodes


@dataclass
class Episode:
    """An applied fault as the log tells it: when it was in force, what it took down."""

    counter: int
    target: str
    kind: str
    began: float  # the call that applied it began here: effects count from here
    start: float  # in force from here (the record is written after the call returned)
    ended: float | None  # its ending action began here (None: instant, or not ended)
    conns: list[int]
    records: list[dict[str, Any]]

    @property
    def down(self) -> str:
        return self.records[0]["action"]


def applied(rec: dict[str, Any]) -> dict[str, Any] | None:
    """*rec* as an applied fault action (None if it is not one): ``counter``, ``target``
    (a bot label), ``action`` (an episode's fault record: its down mode), ``fault`` (the
    catalogue's name), ``mono``, ``began``, ``conns`` (the connection ids it took, or as
    many ``-1`` as it acted on where the record names none)."""
    if rec.get("event") not in ("fault", "undo") or rec.get("dry"):
        return None
    detail, result = rec.get("detail") or {}, rec.get("result") or {}
    action = detail.get("down", rec["action"]) if rec["event"] == "fault" else rec["action"]
    n = result.get("connections")
    conns = result.get("conns")
    if conns is None:
        conns = [-1] * n if isinstance(n, int) and action in LINK_ACTIONS else []
    return {
        "counter": int(rec["counter"]),
        "target": str(rec["target"]).split("@", 1)[0],
        "action": action,
        "fault": rec["action"],
        "mono": float(rec["mono"]),
        "began": float(rec.get("began", rec["mono"])),
        "conns": list(conns),
    }


def episodes(faults: list[dict[str, Any]]) -> list[Episode]:
    """The applied faults, one per (counter, target), in the order they began."""
    by_counter: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rec in faults:
        a = applied(rec)
        if a is not None:
            by_counter.setdefault((a["counter"], a["target"]), []).append(a)
    out = []
    for (counter, target), recs in by_counter.items():
        recs.sort(key=lambda r: r["mono"])
        first = recs[0]
        ended = recs[1]["began"] if first["action"] in DOWN_ACTIONS and len(recs) > 1 else None
        out.append(
            Episode(
                counter,
                target,
                first["fault"],
                first["began"],
                first["mono"],
                ended,
                first["conns"],
                recs,
            )
        )
    return sorted(out, key=lambda e: e.began)


def outage_window(ep: Episode, bot: Bot) -> tuple[float, float] | None:
    """When *bot* had no working link because of *ep*: from the fault in force to the
    earlier of its ending and the bot's own next ``connected``. None if it took down no
    connection."""
    if not ep.conns:
        return None
    back = bot.first("connected", ep.start)
    end = min(x for x in (ep.ended, back, float("inf")) if x is not None)
    return (ep.start, end)


# --------------------------------------------------------------------------- facts


@dataclass
class Facts:
    """Everything a check judges, read once."""

    mode: str
    bots: dict[str, Bot]
    eps: list[Episode]
    observed: str  # every message the observer saw, one per line
    #: The manifest's timings (liveness_bound_s, detection_window_s, fd_tolerance, ...).
    timing: dict[str, Any]
    #: Each episode's outage window on its own bot, by its index in :attr:`eps`.
    windows: dict[int, tuple[float, float] | None] = field(default_factory=dict)

    def received(self, text: str) -> bool:
        return text in self.observed

    @property
    def posts(self) -> int:
        return sum(len(b.posts) for b in self.bots.values())

    @property
    def last_end(self) -> float | None:
        """When the last applied fault action returned (None: none was applied)."""
        return max((e.records[-1]["mono"] for e in self.eps), default=None)


def facts(run_dir: Path) -> Facts:
    manifest, bots, faults, observed = load(run_dir)
    eps = episodes(faults)
    f = Facts(manifest["mode"], bots, eps, "\n".join(observed), manifest["timing"])
    for i, ep in enumerate(eps):
        bot = bots.get(ep.target)
        if bot is not None:
            f.windows[i] = outage_window(ep, bot)
    return f
