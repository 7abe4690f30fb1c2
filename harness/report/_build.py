"""Build a report from a directory, and the hooks the runners call after a run.

What a directory is decides what its report is:

* a **run directory** (``result.json`` or ``events.jsonl``): one attempt of one
  experiment against one arm -> one panel;
* a **pair directory** (``pair.json``, or two run directories whose results name their
  arms): two panels, arm a above arm b, on a shared time axis, with the internal
  controls' drift (recomputed by :func:`harness.pair.judge` when ``pair.json`` is
  missing, e.g. kept from a pair that was killed);
* anything else is not a run directory (:class:`NotARunDir`, exit 2 on the command
  line). A directory of attempts (``attempt-*/`` inside, as ``--run-dir`` makes) is
  handled by the command, one report per attempt.

:func:`build` writes ``timeline.png``, ``timeline.svg``, ``report.html`` and
``report.json`` (the drawn data model) into the directory, replacing earlier ones.
:func:`publish_run` and :func:`publish_pair` are the one-call hooks for the runners:
they record the replay command, build, print the page's path, and never raise (a
drawing that fails must not change a run's verdict).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from harness.report._evidence import load_run
from harness.report._files import (
    MalformedEvidence,
    Shape,
    check_shape,
    is_run_dir,
    why_not_read,
)
from harness.report._model import Report, Run
from harness.report._timeline import Drawn

__all__ = [
    "Built",
    "NotARunDir",
    "attempt_dirs",
    "build",
    "load_report",
    "publish_pair",
    "publish_run",
    "replay_command",
    "skipped_lines",
]


class NotARunDir(Exception):
    """The directory holds no run's evidence (one line says why)."""


@dataclass
class Built:
    report: Report
    html: Path
    png: Path
    svg: Path
    json: Path
    drawn: list[Drawn]
    #: Seconds spent drawing and writing (not loading), for the benchmark.
    render_s: float


# --------------------------------------------------------------------------- loading


def _arm_name(v: Any) -> bool:
    """An arm's directory name: one path component inside the pair directory."""
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v


def _drift_rows(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(d, dict) for d in v)


#: pair.json as :func:`publish_pair` writes it (every field but ``names`` optional).
PAIR_SHAPE: dict[str, Shape] = {
    "names": (
        "a non-empty list of arm directory names",
        lambda v: isinstance(v, list) and bool(v) and all(map(_arm_name, v)),
    ),
    "command": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "title": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "verdict": (
        "null or [passed, summary]",
        lambda v: (
            v is None
            or (
                isinstance(v, list)
                and len(v) == 2
                and isinstance(v[0], bool)
                and isinstance(v[1], str)
            )
        ),
    ),
    "outcome": (
        "null or an object whose drifts, if any, is a list of objects",
        lambda v: v is None or (isinstance(v, dict) and _drift_rows(v.get("drifts", []))),
    ),
}


def _first_mono(run: Run) -> float:
    return run.origin_mono


def _title(run: Run) -> str:
    return " ".join(x for x in (run.experiment or "run", f"[{run.arm}]" if run.arm else "") if x)


def load_report(path: Path) -> Report:
    """Load the report of *path* (a run or pair directory); NotARunDir otherwise, and
    MalformedEvidence for a pair.json, result.json or verdict.json of the wrong shape."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunDir(f"{path}: not a directory")
    pair_doc = path / "pair.json"
    why = why_not_read(path, "pair.json")
    skipped = [] if why in (None, "absent") else [f"pair.json: {why}, not read"]
    if why is None:
        return _named_pair_report(path, pair_doc)
    if is_run_dir(path):
        run = load_run(path)
        run.title = _title(run) + (f" (seed {run.seed})" if run.seed is not None else "")
        return Report(
            path,
            "attempt",
            run.title,
            [run],
            run.verdict() == "PASS",
            summary=str((run.result or {}).get("verifier_message") or ""),
            replay=run.replay,
            skipped=skipped,
        )
    arms = _real_dirs(path, sorted(path.iterdir()), skipped)
    arms = [d for d in arms if is_run_dir(d)]
    if len(arms) >= 2:
        runs = sorted((load_run(a, title=a.name) for a in arms), key=_first_mono)
        report = _pair_report(path, runs, None)
        report.skipped = skipped
        return report
    raise NotARunDir(
        f"{path}: not a run directory (no result.json, events.jsonl or pair.json, and no two "
        "arms with evidence inside)"
    )


def _named_pair_report(path: Path, pair_doc: Path) -> Report:
    """The report of the pair directory *path* whose *pair_doc* (its pair.json, read
    here) names the arms; NotARunDir when it is unreadable or an arm has no evidence."""
    try:
        doc = json.loads(pair_doc.read_text())
    except (OSError, ValueError) as exc:
        raise NotARunDir(f"{pair_doc}: unreadable ({exc})") from None
    doc = check_shape(doc, PAIR_SHAPE, str(pair_doc))
    names = [str(n) for n in doc.get("names", [])]
    for n in names:
        why_arm = why_not_read(path, n, directory=True)
        if why_arm is not None and why_arm != "absent":
            raise NotARunDir(f"{path}: pair.json names arm {n}: {why_arm}, not read")
    arms = [path / n for n in names if is_run_dir(path / n)]
    if len(arms) != len(names) or not arms:
        raise NotARunDir(f"{path}: pair.json names arms {names} but not all have evidence")
    return _pair_report(path, [load_run(a, title=a.name) for a in arms], doc)


def _pair_title(runs: list[Run], doc: dict[str, Any] | None) -> str:
    """pair.json's title, else the experiment and its arms (and their seed, if one)."""
    if doc and doc.get("title"):
        return str(doc["title"])
    seeds = {r.seed for r in runs}
    title = f"{runs[0].experiment or 'pair'}: " + " vs ".join(r.title for r in runs)
    if len(seeds) == 1 and None not in seeds:
        title += f" (seed {seeds.pop()})"
    return title


def _pair_report(path: Path, runs: list[Run], doc: dict[str, Any] | None) -> Report:
    title = _pair_title(runs, doc)
    outcome = (doc or {}).get("outcome")
    if outcome is None and len(runs) == 2 and all(r.result for r in runs):
        outcome = _judge(runs)
    drifts = list((outcome or {}).get("drifts", []))
    passed = bool(outcome and outcome.get("exit_code") == 0)
    summary = str((outcome or {}).get("summary", ""))
    if doc and doc.get("verdict"):
        passed, summary = bool(doc["verdict"][0]), str(doc["verdict"][1])
    if outcome is None:
        summary = summary or "the pair was not judged (an arm wrote no result)"
    replay = str((doc or {}).get("command") or "")
    if not replay:
        replay = next((r.replay for r in runs if r.replay_recorded), "")
    return Report(path, "pair", title, runs, passed, summary, drifts, replay)


def _judge(runs: list[Run]) -> dict[str, Any]:
    """A pair that left no pair.json (killed, or older than this report): its internal
    controls' drift from the arms' results alone. Not the pair runner's full judgement,
    which this module cannot import (harness.pair calls it), so it never passes."""
    from harness.experiment import Result, control_drift

    try:
        a, b = (Result.from_json(r.result or {}) for r in runs)
    except (TypeError, ValueError) as exc:  # a field the report does not read is odd
        where = " or ".join(str(r.path / "result.json") for r in runs)
        raise MalformedEvidence(f"{where}: malformed: {exc}") from None
    drifts = control_drift(a, b)
    moved = [d.name for d in drifts if not d.steady]
    summary = "pair.json absent: the pair was not judged by the pair runner; " + (
        f"internal control MOVED: {', '.join(moved)}" if moved else "internal controls steady"
    )
    return {"drifts": [d.__dict__ for d in drifts], "summary": summary, "exit_code": None}


def _real_dirs(base: Path, entries: list[Path], skipped: list[str]) -> list[Path]:
    """The entries of *base* that are real directories; a linked one is said in
    *skipped* (its evidence lies outside *base*)."""
    out = []
    for d in entries:
        why = why_not_read(base, d.name, directory=True)
        if why is None:
            out.append(d)
        elif why == "a symbolic link":
            skipped.append(f"{d.name}: {why}, not read")
    return out


def attempt_dirs(path: Path, skipped: list[str] | None = None) -> list[Path]:
    """The attempt directories under a ``--run-dir`` base, in order (real directories
    only: a linked one is listed in *skipped*)."""
    return _real_dirs(
        Path(path), sorted(Path(path).glob("attempt-*")), [] if skipped is None else skipped
    )


def skipped_lines(report: Report) -> list[str]:
    """Everything the report passed over, each path relative to the report's directory."""
    out = list(report.skipped)
    for run in report.runs:
        prefix = "" if run.path == report.path else f"{run.path.name}/"
        out += [prefix + line for line in run.skipped]
    return out


def _write_replacing(path: Path, write: Callable[[Path], None]) -> None:
    """Write *path* through a new file of our own in its directory, then rename it into
    place: a link already at *path* (to a file out of the directory, say) is replaced,
    never written through."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- building


def build(path: Path) -> Built:
    """Load *path*, draw it, and write the timeline (PNG, SVG), report.html and
    report.json into it. Raises NotARunDir for a directory that is not a run's."""
    from harness.report import _html, _timeline

    report = load_report(Path(path))
    t1 = time.perf_counter()
    out = report.path
    png, svg, html, js = (
        out / n for n in ("timeline.png", "timeline.svg", "report.html", "report.json")
    )
    fig, drawn = _timeline.draw(report)
    _write_replacing(png, lambda f: _timeline.save_png(fig, f))
    _write_replacing(svg, lambda f: _timeline.save_svg(fig, f))
    page = _html.render(report, svg.read_text(), png.name, svg.name, drawn=drawn)
    _write_replacing(html, lambda f: f.write_text(page))
    doc = report.to_json()
    doc["drawn"] = [d.__dict__ for d in drawn]
    text = json.dumps(doc, indent=1, default=str)
    _write_replacing(js, lambda f: f.write_text(text))
    return Built(report, html, png, svg, js, drawn, time.perf_counter() - t1)


# --------------------------------------------------------------------------- hooks

#: Options of the experiment and pair commands that do not change what a run does.
_DROP_WITH_VALUE = ("--seed", "--repeat", "--run-dir", "--out", "--report")
_DROP_FLAGS = ("--keep", "--json")


def replay_command(module: str, argv: Sequence[str], seed: int) -> str:
    """The command that replays one attempt of ``python -m MODULE *argv``: the same
    arguments with ``--seed SEED``, without repeat/output options (a pair's experiment
    arguments after ``--`` are kept as they are)."""
    argv = list(argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i:]
    kept: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _DROP_WITH_VALUE:
            skip = True
            continue
        if a in _DROP_FLAGS or any(a.startswith(o + "=") for o in _DROP_WITH_VALUE):
            continue
        kept.append(a)
    return shlex.join([sys.executable, "-m", module, *kept, "--seed", str(seed), *rest])


def _say(out: TextIO | None, msg: str) -> None:
    print(msg, file=out if out is not None else sys.stdout, flush=True)


def _publish(run_dir: Path, command: str | None, out: TextIO | None, prefix: str) -> Path | None:
    try:
        if command:
            _write_replacing(run_dir / "command.txt", lambda f: f.write_text(command + "\n"))
        built = build(run_dir)
    except Exception as exc:  # never let a drawing change a run's verdict
        _say(out, f"{prefix}report: could not be built: {type(exc).__name__}: {exc}")
        return None
    _say(out, f"{prefix}report: {built.html}")
    return built.html


def publish_run(
    run_dir: str | Path | None,
    module: str,
    argv: Sequence[str] | None,
    seed: int,
    out: TextIO | None = None,
) -> Path | None:
    """Hook for an experiment command: write *run_dir*'s report (no-op for None, i.e. an
    attempt directory that was removed), print its path; return it or None."""
    if run_dir is None:
        return None
    argv = sys.argv[1:] if argv is None else argv
    return _publish(Path(run_dir), replay_command(module, argv, seed), out, "")


def publish_pair(
    run_dir: str | Path | None,
    outcome: Any,
    command: str,
    out: TextIO | None = None,
    *,
    verdict: tuple[bool, str] | None = None,
    title: str | None = None,
) -> Path | None:
    """Hook for the pair runner and the demo: record the judged pair (``pair.json``:
    its arms, the outcome, the replay *command*, and optionally the caller's own
    *verdict* and *title*), build the pair's report, print its path."""
    if run_dir is None:
        return None
    run_dir = Path(run_dir)
    try:
        doc = {
            "names": [outcome.a.arm, outcome.b.arm],
            "command": command,
            "outcome": outcome.to_json(),
            "verdict": list(verdict) if verdict else None,
            "title": title,
        }
        text = json.dumps(doc, indent=1, default=str)
        _write_replacing(run_dir / "pair.json", lambda f: f.write_text(text))
    except Exception as exc:
        _say(out, f"report: could not record the pair: {type(exc).__name__}: {exc}")
        return None
    return _publish(run_dir, command, out, "")
