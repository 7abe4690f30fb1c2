"""The one check every toxic fidelity row gets (tests/fidelity/test_toxics.py's rows
and test_http_rows.py's pairs against nginx): the row holds, and its judge calls each
breakage it lists broken."""

from __future__ import annotations

import pytest

from harness.fidelity._toxics import ToxicCase, ToxicServers, run_toxic


def row_param(case: ToxicCase) -> object:
    """*case* as a pytest parameter, named by its row's name up to its first colon."""
    return pytest.param(case, id=case.name.split(":")[0])


def check_toxic_row(case: ToxicCase, servers: ToxicServers) -> None:
    """Run *case*'s row once: its verdict is the same, and every breakage it was not
    asked for is judged not the same."""
    row = run_toxic(case, servers)
    assert row.verdict.same, f"{case.name}: {row.verdict.text} ({row.seen})"
    for asked, broken in zip(case.breakages, row.broken, strict=True):
        assert not broken.same, f"{case.name}, judged as {asked}: {broken.text} ({row.seen})"
