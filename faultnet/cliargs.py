"""What more than one command line shares: argparse types (a value they refuse is
argparse's usage error: one line, exit 2) and the examples section every command's
``--help`` ends with (:func:`examples`; a test walks every ``faultnet`` command for it)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from typing import Any

__all__ = [
    "EXAMPLES",
    "command_parsers",
    "doc_command",
    "doc_parser",
    "examples",
    "keep_examples",
    "plain",
    "positive_number",
]

#: The heading of the section that ends every command's --help (argparse's own headings
#: are lower case too: "usage:", "options:").
EXAMPLES = "examples:"


def positive_number(text: str) -> float:
    """A finite number greater than 0 (a number of seconds, a factor, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0: {text!r}")
    return value


def examples(*lines: str) -> str:
    """An epilog: :data:`EXAMPLES` and *lines* (command lines, each shown as written)."""
    return EXAMPLES + "\n" + "\n".join(f"  {line}" for line in lines)


def plain(doc: str) -> str:
    """A docstring as help text: reST's marks (``code``, :role:`name`) taken off, which a
    terminal shows as they are."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc).replace("``", "")


def _doc_help(doc: str, epilog: str) -> dict[str, Any]:
    return {
        "description": plain(doc),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
        "epilog": epilog,
    }


def doc_parser(prog: str, doc: str, epilog: str) -> argparse.ArgumentParser:
    """A command's parser whose --help is a module's docstring *doc* (:func:`plain`, its
    lines kept as written), then *epilog* (:func:`examples`)."""
    return argparse.ArgumentParser(prog=prog, **_doc_help(doc, epilog))


def doc_command(sub: Any, name: str, doc: str, help: str, epilog: str) -> argparse.ArgumentParser:
    """The subcommand *name* of *sub* (what ``add_subparsers()`` returned), its --help
    as :func:`doc_parser` makes it; *help* is its line in the parent's list."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, **_doc_help(doc, epilog))
    return parser


class _KeepsExamples(argparse.HelpFormatter):
    # argparse fills an epilog as one paragraph, which runs the example lines together;
    # the prose before the heading is filled as the parser's formatter would.
    def _fill_text(self, text: str, width: int, indent: str) -> str:
        prose, heading, block = text.partition(EXAMPLES)
        filled = super()._fill_text(prose, width, indent) if prose.strip() else ""
        if not heading:
            return filled
        kept = "".join(indent + line for line in (heading + block).splitlines(keepends=True))
        return f"{filled}\n\n{kept}" if filled else kept


def command_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """*parser* and every parser below it (subcommands, depth first), each with its path
    of command names."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_parsers(sub, (*path, name))


def keep_examples(parser: argparse.ArgumentParser) -> None:
    """Make *parser* and every parser below it print an :func:`examples` epilog line by
    line, whatever formatter it was given."""
    for _, p in command_parsers(parser):
        base: Any = p.formatter_class
        if not issubclass(base, _KeepsExamples):
            kept: Any = type(f"KeepsExamples{base.__name__}", (_KeepsExamples, base), {})
            p.formatter_class = kept
