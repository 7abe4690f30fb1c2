"""The harness's own commands (the pair runner, each experiment, env) end their --help
with examples and show no reST markup, as every `faultnet` command does
(tests/faultnet/test_cli_help.py)."""

from __future__ import annotations

import argparse
import re

import pytest

from faultnet.cliargs import EXAMPLES, command_parsers
from harness import env, pair, runner

PARSERS = [
    *command_parsers(pair.build_parser(), ("harness.pair",)),
    *command_parsers(env._parser(), ("harness.env",)),
    *(
        (("harness.exp_" + name,), runner.build_parser(pair.load_experiment(name)))
        for name in pair.EXPERIMENTS
    ),
]


@pytest.mark.parametrize("path, parser", PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_help_ends_with_examples_and_has_no_markup(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    last = re.split(r"\n\n(?=\S)", text.rstrip())[-1].splitlines()
    assert last[0] == EXAMPLES, f"`{' '.join(path)} --help` ends without examples"
    assert all(line.strip() for line in last[1:]) and len(last) > 1, last
    assert all(path[0] in line for line in last[1:]), last
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text
