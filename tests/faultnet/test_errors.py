"""faultnet.errors: the one pair of exit-2 errors every front door reports as one line."""

from __future__ import annotations

import io

import pytest

from faultnet.errors import CommandError, EnvironmentProblem, UsageError, fail


@pytest.mark.parametrize("cls", [UsageError, EnvironmentProblem])
def test_both_are_command_errors_and_fail_prints_one_line_and_returns_2(cls: type) -> None:
    err = io.StringIO()
    code = fail("prog", cls("no such\n  directory:   /x"), file=err)
    assert code == 2
    assert issubclass(cls, CommandError)
    assert err.getvalue() == "prog: error: no such directory: /x\n"


def test_a_usage_error_is_not_an_environment_problem() -> None:
    assert not issubclass(UsageError, EnvironmentProblem)
    assert not issubclass(EnvironmentProblem, UsageError)
