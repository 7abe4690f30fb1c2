"""``faultnet fidelity`` / ``python -m harness.fidelity``: print the fidelity table.

Runs every case, TCP and UDP (or those of the modes or protocol given), in a network
namespace of its own, the kernel's version of each fault against faultnet's, and prints
one row per pair. Example: python -m harness.fidelity --protocol udp
Exit 0 when no judged pair differs (an inconclusive share, one the load moved between a
side's own turns or that a second sample of the row did not show again, is printed and
not counted), 1 when one differs, 2 for usage or
environment (not root, iproute2 or nftables missing, a server that did not start).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from faultnet.cliargs import doc_command, doc_parser, examples
from faultnet.errors import CommandError, UsageError, fail

if TYPE_CHECKING:
    from harness.fidelity._cases import Case
    from harness.fidelity._run import Row

__all__ = ["main", "register"]

EXAMPLE = examples(
    "sudo faultnet fidelity --mode freeze --mode reset",
    "faultnet fidelity --readme-table    # the README's table from the recorded run",
)
#: The command's line in `faultnet --help`.
HELP = "hold every fault mode against the kernel's own version of it (root)"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        action="append",
        metavar="MODE",
        help="run only this fault mode's rows (repeatable; default every row)",
    )
    p.add_argument(
        "--protocol",
        choices=("tcp", "udp"),
        help="run only the rows of this protocol's proxy (default both)",
    )
    p.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    p.add_argument(
        "--judged-only",
        action="store_true",
        help="skip the contrasts (rows shown beside the kernel's, never judged): the"
        " verdict only, as the test suite runs it",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="also write the rows to harness/fidelity/recorded.json, the README's fidelity"
        " column (with --mode, replacing those modes' rows only)",
    )
    p.add_argument(
        "--toxics",
        action="store_true",
        help="run the toxics' rows instead: each toxic through a real proxy against its own"
        " promise (the HTTP toxics: against nginx making the same fault), and each row's"
        " breakage (no root; exit 1 when a promise is broken or a breakage passes)",
    )
    p.add_argument(
        "--readme-table",
        action="store_true",
        help="print the README's modes table with the recorded run's fidelity column and"
        " exit (runs nothing; no root)",
    )
    p.set_defaults(func=_run)


def register(sub: Any) -> None:
    p = doc_command(sub, "fidelity", __doc__, HELP, EXAMPLE)
    _add_arguments(p)


def _print_row(row: Row) -> None:
    c = row.case
    ref = row.reference.text() if row.reference else "-"
    fn = row.faultnet.text() if row.faultnet else "-"
    mark = "same" if row.verdict.same and row.judged else row.verdict.text
    if not row.judged and row.reference is not None:
        mark = f"(not judged) {row.verdict.text}"
    print(f"| {c.mode} | {c.client}; {c.situation} | {c.reference}: {ref} | {fn} | {mark} |")
    sys.stdout.flush()


def _record(rows: list[Row]) -> None:
    import datetime
    import os

    from harness.fidelity import CASES
    from harness.fidelity.readme import RECORDED, load_recorded, merge_rows

    old = load_recorded()["rows"] if RECORDED.exists() else []
    order = [(c.mode, c.client, c.situation, c.reference) for c in CASES]
    # The record is the README's modes table's: the TCP rows (the UDP rows have none).
    tcp = [r.to_json() for r in rows if r.case.protocol == "tcp"]
    merged = merge_rows(old, tcp, order)
    document = {
        "recorded": {
            "by": "python -m harness.fidelity --record",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "kernel": os.uname().release,
        },
        "rows": merged,
    }
    RECORDED.write_text(json.dumps(document, indent=1) + "\n")


def _chosen(args: argparse.Namespace, cases: list[Case]) -> list[Case]:
    """The *cases* of ``--protocol`` and ``--mode`` (UsageError for a mode with none)."""
    if args.protocol:
        cases = [c for c in cases if c.protocol == args.protocol]
    if args.mode:  # checked first: --readme-table ignored a mode that has no rows
        unknown = sorted(set(args.mode) - {c.mode for c in cases})
        if unknown:
            raise UsageError(f"no fidelity rows for mode {', '.join(unknown)}")
        cases = [c for c in cases if c.mode in args.mode]
    return cases


def _run(args: argparse.Namespace) -> int:
    if args.toxics:
        return _run_toxics(args)  # refuses --mode and --protocol itself
    # Here, not at the top: registering the command must not import the proxy.
    from harness.fidelity import CASES, UDP_CASES, enter_private_netns, run

    cases = _chosen(args, [*CASES, *UDP_CASES])
    if args.readme_table:
        from harness.fidelity.readme import modes_table

        print(modes_table())
        return 0
    if args.judged_only:
        if args.record:
            raise UsageError("--record writes every row of a mode: not with --judged-only")
        cases = [c for c in cases if c.contrast is None]
    enter_private_netns()
    if not args.json:
        print("| mode | client; situation | kernel's own fault | faultnet | verdict |")
        print("|---|---|---|---|---|")
    rows = run(cases, on_row=None if args.json else _print_row)
    if args.json:
        json.dump({"rows": [r.to_json() for r in rows]}, sys.stdout, indent=1)
        print()
    if args.record:
        _record(rows)
    differ = (r.judged and not r.verdict.same and not r.verdict.inconclusive for r in rows)
    return 1 if any(differ) else 0


def _run_toxics(args: argparse.Namespace) -> int:
    given = [f"--{n}" for n in ("mode", "protocol", "record", "judged_only") if getattr(args, n)]
    if given:
        raise UsageError(f"--toxics runs the toxics' rows: not with {given[0].replace('_', '-')}")
    from harness.fidelity._toxics import TOXIC_CASES, run_toxic, toxic_servers

    if not args.json:
        print("| toxic's row | seen | promise | breakages |")
        print("|---|---|---|---|")
    rows, failed = [], False
    with toxic_servers() as servers:
        for case in TOXIC_CASES:
            row = run_toxic(case, servers)
            rows.append(row)
            told = sum(not b.same for b in row.broken)
            failed |= not row.verdict.same or told < len(row.broken)
            if not args.json:
                print(
                    f"| {case.name} | {row.seen} | {row.verdict.text} |"
                    f" {told} of {len(row.broken)} told apart |",
                    flush=True,
                )
    if args.json:
        json.dump({"toxics": [r.to_json() for r in rows]}, sys.stdout, indent=1)
        print()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser("python -m harness.fidelity", __doc__, EXAMPLE)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CommandError as exc:
        return fail("fidelity", exc)
    except KeyboardInterrupt:
        return 130
