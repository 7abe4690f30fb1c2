"""The README's modes table with its fidelity column, from the recorded fidelity run.

The column is not written by hand: ``python -m harness.fidelity --record`` (root) writes
the run's rows to :data:`RECORDED` (a run of some modes replaces those modes' rows), and
:func:`modes_table` makes the README's table from :func:`faultnet.modes.markdown_table`
and :func:`fidelity_column` of that record; ``python -m harness.fidelity --readme-table``
prints it (no root: it runs nothing). tests/faultnet/test_modes.py holds the README to
it, tests/fidelity/test_readme_column.py the record to :data:`~harness.fidelity.CASES`.

This module imports no more than faultnet.modes: making the table runs no fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from faultnet.modes import markdown_table

__all__ = [
    "RECORDED",
    "fidelity_column",
    "load_recorded",
    "merge_rows",
    "modes_table",
    "row_key",
]

#: The recorded run: ``{"recorded": {...}, "rows": [Row.to_json(), ...]}``.
RECORDED = Path(__file__).with_name("recorded.json")


def row_key(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What names a row across runs: its mode, client, situation and reference (one
    situation is held against two references: reset's)."""
    return (row["mode"], row["client"], row["situation"], row["reference"])


def load_recorded(path: Path = RECORDED) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def merge_rows(
    old: Iterable[Mapping[str, Any]],
    new: Iterable[Mapping[str, Any]],
    order: Iterable[tuple[str, str, str, str]],
) -> list[Mapping[str, Any]]:
    """The rows of a record after a run of some modes: every mode *new* has rows for
    takes them, the other modes keep *old*'s; in *order* (the cases' keys), a row
    *order* no longer names dropped."""
    new = list(new)
    ran = {r["mode"] for r in new}
    by_key = {row_key(r): r for r in old if r["mode"] not in ran}
    by_key.update((row_key(r), r) for r in new)
    return [by_key[k] for k in order if k in by_key]


def _figures(row: Mapping[str, Any]) -> str:
    """One pair's figures, kernel / faultnet: its outcome and times, or its shares."""
    k, f = row["kernel"], row["faultnet"]
    if k.get("tries") and f.get("tries"):
        share = next(iter(k["counts"]))
        return (
            f"{share} {k['counts'][share] / k['tries']:.0%} / "
            f"{f['counts'].get(share, 0) / f['tries']:.0%} of {k['tries']} {k['tries_of']},"
            f" {k['seconds_of']} {_seconds(k['seconds'])} / {_seconds(f['seconds'])}"
        )
    if k["outcome"] == f["outcome"]:
        return f"{k['outcome']} in {_seconds(k['seconds'])} / {_seconds(f['seconds'])}"
    return f"{k['outcome']} / {f['outcome']}"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f} s"


def _cell(rows: list[Mapping[str, Any]]) -> str:
    judged = [r for r in rows if r["judged"]]
    differ = [r for r in judged if not r["same"]]
    if differ:
        text = f"**differs** in {len(differ)} of {len(judged)} pairs: {differ[0]['verdict']}"
    elif judged:
        pairs = "pair" if len(judged) == 1 else "pairs"
        text = f"same in {len(judged)} of {len(judged)} {pairs} (kernel / faultnet: "
        text += f"{_figures(judged[0])})"
    else:
        text = "no judged pair"
    contrasts = [r["reference"] for r in rows if not r["judged"] and r["kernel"] is not None]
    for reference in dict.fromkeys(contrasts):  # each once: two rows may share one
        text += f"; unlike {reference} (a contrast, not judged)"
    return text.replace("|", "\\|")


def fidelity_column(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The fidelity verdict of each mode with recorded rows: the same in how many of its
    judged pairs (with the first pair's figures), or which pair differs and how, and
    the contrasts shown beside it."""
    by_mode: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_mode.setdefault(r["mode"], []).append(r)
    return {mode: _cell(mode_rows) for mode, mode_rows in by_mode.items()}


def modes_table(path: Path = RECORDED) -> str:
    """The README's modes table: :func:`faultnet.modes.markdown_table` with the recorded
    run's :func:`fidelity_column`."""
    return markdown_table(fidelity_column(load_recorded(path)["rows"]))
