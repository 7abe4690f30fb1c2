"""A post, scored the way the experiments score it (principle 3): *claimed* is what the
bot's answer said (:func:`harness.experiment.claims_delivery`), *received* is whether the
independent observer got the exact text, and the fault it was made in decides whether a
late receipt is "late".

The answer is read from the first source in :data:`CLAIM_SOURCES` that knows it: the
call record's answer (``result_text``), then, for runs recorded before the call record
kept it, the experiment's own post table, the bot's ``post_confirm`` event, and the call
record's outcome; the post says which in ``claim_source``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.experiment import claims_delivery
from harness.report._model import FaultInterval, Post

__all__ = ["CLAIM_SOURCES", "Call", "Claim", "call_text", "read_claim", "score_call", "score_post"]


def score_post(
    claimed: bool | None, received_t: float | None, observed: bool, fault_end: float | None
) -> str:
    """The outcome name of one post (see :data:`harness.report._model.OUTCOMES`).

    *observed*: the run has an observer transcript at all (without one nothing can be
    said about delivery). *fault_end*: the end (on the proxy) of the fault interval the
    post was made in, if any (a claimed post received only after it is "late", not
    delivered).
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


@dataclass
class Call:
    """One send-channel call, as its post is scored: its record, its window on the
    run's axis, its text, and what the bot itself and the experiment said of it."""

    rec: dict[str, Any]
    t: float
    t_end: float
    text: str
    #: The bot's post_confirm events (times on the run's axis), and the experiment's
    #: own post table by text.
    confirms: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    post_table: dict[str, dict[str, Any]] = field(default_factory=dict)


Claim = tuple[str | None, bool | None]


def _claim_from_answer(c: Call) -> Claim | None:
    if "result_text" not in c.rec:
        return None
    answer = c.rec.get("result_text")
    claimed = claims_delivery(answer or "")
    return (f"<{c.rec.get('outcome')}>" if answer is None else answer), claimed


def _claim_from_post_table(c: Call) -> Claim | None:
    row = c.post_table.get(c.text)
    if row is None or "claimed" not in row:
        return None
    return row.get("result"), bool(row["claimed"])


def _claim_from_post_confirm(c: Call) -> Claim | None:
    # The bot's own post_confirm inside the call's window (same host clock).
    mine = [
        e
        for t, e in c.confirms
        if c.t - 0.001 <= t <= c.t_end + 0.001 and e.get("result") is not None
    ]
    if not mine:
        return None
    return f"post_confirm {mine[0].get('result')}", mine[0].get("result") in (
        "confirmed",
        "skipped",
    )


def _claim_from_outcome(c: Call) -> Claim | None:
    if c.rec.get("outcome") in ("ok", "is_error"):
        return None
    return f"<{c.rec.get('outcome')}>", False


#: Where a post's claim is read from, tried in order: the first that knows says.
CLAIM_SOURCES: tuple[tuple[str, Callable[[Call], Claim | None]], ...] = (
    ("the call record's answer", _claim_from_answer),
    ("the experiment's post table", _claim_from_post_table),
    ("the bot's post_confirm event", _claim_from_post_confirm),
    ("the call record", _claim_from_outcome),
)


def read_claim(c: Call) -> tuple[str | None, bool | None, str]:
    """(answer, claimed, where it was read from) for one call; (None, None, "") when no
    source knows."""
    for source, read in CLAIM_SOURCES:
        got = read(c)
        if got is not None:
            return got[0], got[1], source
    return None, None, ""


def call_text(rec: dict[str, Any]) -> str:
    try:
        args = json.loads(rec.get("arguments") or "{}")
    except ValueError:
        args = {}
    return str(args.get("text", "")) if isinstance(args, dict) else ""


def score_call(
    lane_id: str,
    c: Call,
    received: list[tuple[float, str, str]],
    has_observer: bool,
    lane_faults: list[FaultInterval],
) -> Post:
    """The post one call made: its claim, when the observer got it, its outcome."""
    answer, claimed, source = read_claim(c)
    got = [rt for rt, _s, body in received if c.text and c.text in body]
    received_t = min(got) if got else None
    # The fault the post was made in: one still holding what its bot uses (a post made
    # after the bot reconnected round it is not in it). "Late" is measured from the
    # fault's end on the proxy, when what it held was let go.
    fault = next((f for f in lane_faults if f.holds(lane_id, c.t)), None)
    outcome = score_post(claimed, received_t, has_observer, fault.end if fault else None)
    return Post(lane_id, c.t, c.t_end, c.text, answer, claimed, received_t, outcome, source)
