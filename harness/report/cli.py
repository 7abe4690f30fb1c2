"""``faultnet report RUN_DIR``: (re)build the timeline and report.html of a run.

RUN_DIR is a run directory (one attempt: ``result.json`` / ``events.jsonl``), a pair
directory (``pair.json``, or two arms' run directories), or a ``--run-dir`` base with
``attempt-*/`` directories inside (each gets its own report). Only what the directory
holds is read, so a directory kept from a failing or killed attempt works too.

Writes timeline.png, timeline.svg, report.html and report.json into each directory and
prints each report.html's path.

Exit codes: 0 every run shown passed; 1 a report was built and shows a failed check (or
a run that did not complete); 2 RUN_DIR is not a run directory, its result.json,
verdict.json or pair.json is not in its writer's shape, or usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faultnet.cliargs import doc_command, doc_parser, examples
from harness.report._build import NotARunDir, attempt_dirs, build, skipped_lines
from harness.report._files import MalformedEvidence

__all__ = ["main", "register", "run"]

EXIT_OK, EXIT_FAILED, EXIT_ENV = 0, 1, 2
EXAMPLE = examples(
    "faultnet report /tmp/faultnet-demo-abc123          # a pair: both arms on one page",
    "faultnet report RUN_DIR --json | jq -r '.reports[].report'",
)
#: The command's line in `faultnet --help`.
HELP = "draw a run directory: timeline (PNG, SVG) and a one-page report.html"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory to draw")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (each report's path, verdict and what it drew)",
    )


def register(sub: Any) -> None:
    p = doc_command(sub, "report", __doc__, HELP, EXAMPLE)
    _add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The command: exit code as the module docstring says; errors are one line."""
    base: Path = args.run_dir
    targets = [base]
    not_attempts: list[str] = []
    if base.is_dir() and not (base / "result.json").exists():
        targets = attempt_dirs(base, not_attempts) or [base]
    for line in not_attempts:
        print(f"faultnet report: {base}: {line}", file=sys.stderr)
    docs = []
    code = EXIT_OK
    for target in targets:
        try:
            built = build(target)
        except (NotARunDir, MalformedEvidence) as exc:
            if target is base:
                print(f"faultnet report: error: {exc}", file=sys.stderr)
                return EXIT_ENV
            print(f"faultnet report: skipped {exc}", file=sys.stderr)
            continue
        rep = built.report
        if not rep.passed:
            code = EXIT_FAILED
        counts: dict[str, int] = {}
        for r in rep.runs:
            for k, n in r.outcome_counts().items():
                counts[k] = counts.get(k, 0) + n
        docs.append(
            {
                "report": str(built.html),
                "png": str(built.png),
                "svg": str(built.svg),
                "data": str(built.json),
                "kind": rep.kind,
                "title": rep.title,
                "passed": rep.passed,
                "verdicts": {r.title: r.verdict() for r in rep.runs},
                "posts": counts,
                "faults": sum(len(r.faults) for r in rep.runs),
                "skipped": skipped_lines(rep),
                "render_s": round(built.render_s, 4),
            }
        )
        for line in skipped_lines(rep):
            print(f"faultnet report: {rep.path}: {line}", file=sys.stderr)
        if not args.json:
            print(f"{'PASS' if rep.passed else 'FAIL'}: {rep.title}")
            print(f"report: {built.html}")
    if not docs:
        print(f"faultnet report: error: {base}: no attempt inside could be drawn", file=sys.stderr)
        return EXIT_ENV
    if args.json:
        print(json.dumps({"exit_code": code, "reports": docs}))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    p = doc_parser("python -m harness.report", __doc__, EXAMPLE)
    _add_arguments(p)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return run(args)
