"""Every ``faultnet`` command's --help, walked from the parser tree (the commands
registered by faultnet and by the packages above it): it ends with an examples section
of command lines, and shows no reST markup (``code``, :mod:`x`) from a docstring."""

from __future__ import annotations

import re

import pytest

from faultnet.cli import build_parser
from faultnet.cliargs import EXAMPLES, command_parsers

PARSERS = list(command_parsers(build_parser()))


def test_the_walk_reaches_every_level() -> None:
    paths = {" ".join(path) for path, _ in PARSERS}
    assert {"", "server", "toxic", "toxic add", "proxy control-test", "chaos"} <= paths
    assert {"demo", "report", "fidelity"} <= paths, "the harness's commands are installed"


@pytest.mark.parametrize(
    "path, parser", PARSERS, ids=[" ".join(p) or "faultnet" for p, _ in PARSERS]
)
def test_help_ends_with_examples_and_has_no_markup(path: tuple[str, ...], parser: object) -> None:
    text = parser.format_help()  # type: ignore[attr-defined]
    sections = re.split(r"\n\n(?=\S)", text.rstrip())
    last = sections[-1].splitlines()
    assert last[0] == EXAMPLES, f"`faultnet {' '.join(path)} --help` ends without examples"
    lines = [line.strip() for line in last[1:]]
    assert lines and all(lines), last
    # Each example is a whole command line a reader can paste.
    assert all(re.match(r"(\w+=\S+ )*(sudo )?(faultnet|curl) ", line) for line in lines), lines
    if path:
        assert all(" ".join(path) in line for line in lines if "faultnet" in line), lines
    assert "``" not in text and not re.search(r":[a-z]+:`", text), text


def test_toxic_add_lists_every_registered_type() -> None:
    from faultnet.toxics import TOXICS

    (add,) = [p for path, p in PARSERS if path == ("toxic", "add")]
    (type_help,) = [a.help for a in add._actions if "--type" in a.option_strings]
    text = " ".join(add.format_help().split())
    assert len(TOXICS) >= 10
    for name in TOXICS:
        assert re.search(rf"\b{name}\b", text), name
    assert "..." not in str(type_help)
