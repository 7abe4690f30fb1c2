"""The plain data a report draws: lanes, fault intervals, posts, markers, checks.

Everything here is loaded from a run directory by :mod:`harness.report._evidence` and
drawn by :mod:`._timeline` and :mod:`._html`; nothing here reads a file or draws. Times
are seconds on the run's own axis: ``t = 0`` is the first fault applied in the run (so
"t+ 4.5 s" means the same thing here as in the experiments' headline numbers), or the
run's start when no fault was applied.

A :class:`Run` is one arm of one attempt: one directory of evidence. A :class:`Report`
is one or more runs drawn one above the other on a shared time axis (a matched pair has
two; a fleet soak may have more). Lanes are generic (a bot, a proxy, the observer), so
a fleet soak (a lane per bot and per proxy) or a chaos run (its join log's decisions as
markers on a proxy lane) feed the same model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DETECTIONS",
    "FaultInterval",
    "Lane",
    "Marker",
    "OUTCOMES",
    "Outcome",
    "Post",
    "Report",
    "Run",
]

LaneKind = Literal["proxy", "bot", "observer"]


@dataclass(frozen=True)
class Outcome:
    """How one post ended, and how it is drawn (the one table every view reads)."""

    name: str
    label: str
    color: str
    marker: str
    #: Drawn larger: the failure the picture exists to show.
    loud: bool = False
    #: The count written beside the first such post of a panel, singular and plural
    #: ("" for none): the two answers a pair is read by, a silent loss in one arm and
    #: an honest UNCONFIRMED in the other, are both counted on the picture.
    tally: tuple[str, str] = ("", "")


#: Post outcomes, in legend order. Scored by the independent observer, never by the
#: sender: "claimed" is what the tool result said, "received" is what the observer got.
OUTCOMES: dict[str, Outcome] = {
    o.name: o
    for o in (
        Outcome("delivered", "claimed and received", "#2e7d32", "o"),
        Outcome(
            "unconfirmed",
            "reported UNCONFIRMED (not received)",
            "#f9a825",
            "s",
            tally=("UNCONFIRMED", "UNCONFIRMED"),
        ),
        Outcome("unconfirmed_received", "reported UNCONFIRMED, received anyway", "#9ccc65", "s"),
        Outcome("late", "claimed, received only after the fault was lifted", "#ef6c00", "D"),
        Outcome(
            "silent_loss",
            "SILENT LOSS: claimed, never received",
            "#d50000",
            "X",
            True,
            ("SILENT LOSS", "SILENT LOSSES"),
        ),
        Outcome("unknown", "outcome unknown (no claim or no observer record)", "#9e9e9e", "."),
    )
}

#: Marker kinds drawn on a lane: kind -> (label, colour, matplotlib marker). No two
#: kinds (and no kind and outcome) share a colour and a marker: each has its own entry
#: in the legend.
DETECTIONS: dict[str, tuple[str, str, str]] = {
    "pong_timeout": ("PONG timeout (own detection)", "#000000", "v"),
    "connection_lost": ("connection lost (EOF / error)", "#6a1b9a", "v"),
    "reconnected": ("reconnected", "#1565c0", "^"),
    "connect_failed": ("connect attempt failed", "#757575", "x"),
    "connected": ("connected", "#00838f", "2"),
    "conn_open": ("proxy: connection opened", "#90a4ae", "|"),
    "conn_close": ("proxy: connection closed", "#546e7a", "|"),
    "held_close": ("proxy: FIN/RST held by the fault", "#8d6e63", "4"),
    "http_fault": ("proxy: an HTTP request faulted", "#ef6c00", "P"),
    "received": ("observer received a line", "#2e7d32", "|"),
    "decision": ("decision (chaos / fleet fault log)", "#455a64", "*"),
    "decision_skipped": ("decision: skipped or refused", "#b0bec5", "*"),
    "decision_failed": ("decision: failed or not undone", "#d50000", "*"),
}


@dataclass
class Lane:
    """One horizontal lane: a bot, a proxy, or the observer.

    A bot lane names the proxy its traffic goes through (``via``), so the proxy's fault
    intervals are drawn across it too.
    """

    id: str
    title: str
    kind: LaneKind
    via: str | None = None


@dataclass
class FaultInterval:
    """A fault in force on a proxy from *start* to *end* (``end`` None: never removed
    before the run ended; ``end == start``: an instantaneous fault such as sever).

    A fault on the connections open when it was applied and on no new ones
    (``catches_new`` False: a freeze, blackhole or loss without ``include_new``) stops
    mattering to a client once it has left the connection the fault held: a bot that
    dropped it and reconnected is no longer behind the fault, though the proxy still
    holds the old connection until *end*. Where that happened, it is recorded: *left*
    per bot lane (the bot's own ``disconnected`` event), and *released* when every
    connection it held had been left by its client (its FIN or RST held, a peer reset,
    the connection closed), for lanes whose bot said nothing.
    """

    proxy: str
    mode: str
    start: float
    end: float | None
    stream: str = "both"
    connections: list[int] | None = None
    removed_by: str | None = None
    #: Acts on connections opened after it was applied too (a listener fault, a
    #: partition, ``include_new``); False: only on those open when it was applied.
    catches_new: bool = True
    released: float | None = None
    left: dict[str, float] = field(default_factory=dict)

    @property
    def instant(self) -> bool:
        return self.end is not None and self.end == self.start

    def covers(self, t: float) -> bool:
        """Is the fault in force on the proxy at *t*?"""
        return self.start <= t and (self.end is None or t <= self.end)

    def end_on(self, lane: str) -> float | None:
        """Where the fault ends on *lane*: on a proxy's lane, its *end*; on a client's,
        where it stopped holding that client (*left*, else *released*, else *end*)."""
        if lane.startswith("proxy:"):
            return self.end
        if lane in self.left:
            return self.left[lane]
        return self.released if self.released is not None else self.end

    def holds(self, lane: str, t: float) -> bool:
        """Does the fault hold what *lane* uses at *t*?"""
        end = self.end_on(lane)
        return self.start <= t and (end is None or t <= end)


@dataclass
class Post:
    """One post a bot was asked to make (a ``send-channel`` call).

    ``t`` is when the call was made, ``t_end`` when it answered; ``claimed`` is whether
    the answer claimed delivery (None: unknown); ``received_t`` is when the observer got
    it (None: never).
    """

    lane: str
    t: float
    t_end: float
    text: str
    answer: str | None
    claimed: bool | None
    received_t: float | None
    outcome: str
    #: Where the claim was read from: the call record's answer, the bot's own
    #: post_confirm event, or the experiment's event log.
    claim_source: str = ""


@dataclass
class Marker:
    """A point event on a lane: a detection, a reconnect, a proxy connection, a decision."""

    lane: str
    t: float
    kind: str
    label: str = ""


@dataclass
class Run:
    """One directory of evidence, loaded."""

    path: Path
    title: str
    experiment: str = ""
    arm: str = ""
    seed: int | None = None
    time_scale: float | None = None
    bot_argv: list[str] = field(default_factory=list)
    #: The monotonic instant that is t = 0 on this run's axis, and what it is.
    origin_mono: float = 0.0
    origin: str = "run start"
    end: float = 0.0
    lanes: list[Lane] = field(default_factory=list)
    faults: list[FaultInterval] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    #: result.json as written (checks, headline, controls, error), or None if the run
    #: never wrote one (killed).
    result: dict[str, Any] | None = None
    #: The exact command that replays this run, and whether it was recorded or rebuilt
    #: from what was recorded.
    replay: str = ""
    replay_recorded: bool = False
    #: Evidence files, relative to ``path``.
    files: list[str] = field(default_factory=list)
    #: Things the loader noticed: a truncated log, a missing transcript...
    notes: list[str] = field(default_factory=list)
    #: What was there but not read, one line each (``NAME: why, not read``): a symbolic
    #: link, a FIFO, anything but a regular file reached through real directories.
    skipped: list[str] = field(default_factory=list)

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list((self.result or {}).get("checks", []))

    @property
    def passed(self) -> bool:
        return bool(self.result and self.result.get("passed"))

    @property
    def error(self) -> str | None:
        if self.result is None:
            return "the run wrote no result.json (it was killed or is still running)"
        return self.result.get("error")

    def verdict(self) -> str:
        """One line: PASS, or FAIL and which checks failed (not counting a check that
        fails by design: ``expected_fail``, a control run's loss checks)."""
        if self.error:
            return f"FAIL (did not complete: {self.error})"
        failed = [
            c["name"] for c in self.checks if not c.get("passed") and not c.get("expected_fail")
        ]
        if failed:
            return "FAIL: " + "; ".join(failed)
        return "PASS" if self.passed else "FAIL (no checks)"

    def outcome_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(OUTCOMES, 0)
        for p in self.posts:
            counts[p.outcome] += 1
        return {k: v for k, v in counts.items() if v}

    def lane(self, lane_id: str) -> Lane | None:
        return next((ln for ln in self.lanes if ln.id == lane_id), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["verdict"] = self.verdict()
        d["outcome_counts"] = self.outcome_counts()
        return d


@dataclass
class Report:
    """One page: one or more runs on a shared time axis, and the verdict over them."""

    path: Path
    kind: Literal["attempt", "pair", "fleet", "chaos"]
    title: str
    runs: list[Run]
    #: Exit code semantics: True if the run (or the pair, as judged) passed.
    passed: bool
    summary: str = ""
    #: For a pair: the internal controls' drift rows (name, a, b, drift, tolerance, steady).
    drifts: list[dict[str, Any]] = field(default_factory=list)
    replay: str = ""
    #: What the directory itself held but was not read (its runs say their own).
    skipped: list[str] = field(default_factory=list)

    def fails_as_expected(self, run: Run) -> bool:
        """Is *run* a pair's arm whose FAIL is the point? The pair passed (its verdict
        rests on the other arm passing every check, the controls steady) and this arm
        completed and failed: it carries the defect the experiment exists to expose."""
        return self.kind == "pair" and self.passed and not run.error and run.verdict() != "PASS"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "title": self.title,
            "passed": self.passed,
            "summary": self.summary,
            "drifts": self.drifts,
            "replay": self.replay,
            "skipped": self.skipped,
            "runs": [r.to_json() for r in self.runs],
        }
