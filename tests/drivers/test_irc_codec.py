"""One conformance table for every IRC codec in the project, and jaraco's ``irc``.

The codecs: ``shared`` (``drivers.irc``: the enclave server and the observer), ``bot``
(``harness.bot._irc_proto``: the program under test keeps its own on purpose) and
``jaraco`` (the ``irc`` package a stock client uses, installed by the test extra). Each
row gives a line and what every codec must make of it; a codec that differs has its
own expected value in the row, with the reason. A difference nobody decided fails.

Adapters bring each codec's result to one form, ``(command, params, prefix, tags)`` or
:data:`REJECTED`, and say what they normalise: jaraco's client names commands in lower
case (``privmsg``, ``welcome``), so its raw command is upper-cased; its tags are a list
of ``{key, value}`` with ``None`` for no value, made a dict with ``""`` (IRCv3: a missing
value and an empty one are the same).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import drivers.irc as shared
from harness.bot import _irc_proto as bot

jaraco_client = pytest.importorskip("irc.client")
jaraco_message = pytest.importorskip("irc.message")
jaraco_strings = pytest.importorskip("irc.strings")
jaraco_buffer = pytest.importorskip("jaraco.stream.buffer")

Parsed = tuple[str, tuple[str, ...], str | None, dict[str, str]]
REJECTED = "rejected: no command"
DECODE_ERROR = "UnicodeDecodeError"


def _ours(parse: Callable[[str], Any], prefix: str) -> Callable[[str], Parsed | str]:
    """Our codecs raise ValueError for a line with no command; *prefix* is the name of
    the attribute holding the line's prefix (``prefix`` or the bot's ``source``)."""

    def adapted(line: str) -> Parsed | str:
        try:
            m = parse(line)
        except ValueError:
            return REJECTED
        return (m.command, m.params, getattr(m, prefix), m.tags)

    return adapted


def _jaraco(line: str) -> Parsed | str:
    # What irc.client.ServerConnection._process_line does with a line (its regex is
    # private; it is the parser the client runs). No match is its only refusal.
    match = jaraco_client._rfc_1459_command_regexp.match(line)
    if match is None:
        return REJECTED
    tags = jaraco_message.Tag.from_group(match["tags"]) or []
    return (
        match["command"].upper(),
        tuple(jaraco_message.Arguments.from_group(match["argument"])),
        match["prefix"],
        {t["key"]: t["value"] or "" for t in tags},
    )


PARSERS: dict[str, Callable[[str], Parsed | str]] = {
    "shared": _ours(shared.parse_line, "prefix"),
    "bot": _ours(bot.parse, "source"),
    "jaraco": _jaraco,
}


@dataclass(frozen=True)
class Row:
    #: the input: a line, a list of received chunks, or (command, *params) to format
    line: Any
    expected: Any
    #: codec -> (its expected value, why the difference is accepted)
    differs: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def expected_for(self, codec: str) -> Any:
        return self.differs[codec][0] if codec in self.differs else self.expected


_SPEC_SHOULD = "IRCv3 message-tags: a lone trailing backslash SHOULD produce nothing"
_NO_COMMAND = "jaraco's regex reads the first word as the command whatever it is"

PARSE_TABLE: dict[str, Row] = {
    "privmsg with a prefix": Row(
        ":n!u@h PRIVMSG #c :hello world", ("PRIVMSG", ("#c", "hello world"), "n!u@h", {})
    ),
    "one-word trailing with ':'": Row(
        "PRIVMSG #c :single", ("PRIVMSG", ("#c", "single"), None, {})
    ),
    "one-word trailing without ':'": Row(
        "PRIVMSG #c single", ("PRIVMSG", ("#c", "single"), None, {})
    ),
    "empty trailing": Row("PRIVMSG #c :", ("PRIVMSG", ("#c", ""), None, {})),
    "trailing keeps colons and spaces": Row(
        "PRIVMSG #c :a :b  c", ("PRIVMSG", ("#c", "a :b  c"), None, {})
    ),
    "trailing that starts with ':'": Row(
        "PRIVMSG #c ::-) hi", ("PRIVMSG", ("#c", ":-) hi"), None, {})
    ),
    "only a trailing parameter": Row("PING :tok en", ("PING", ("tok en",), None, {})),
    "no parameters": Row("QUIT", ("QUIT", (), None, {})),
    "lower-case command": Row("privmsg #c :x", ("PRIVMSG", ("#c", "x"), None, {})),
    "numeric": Row(":srv 001 me :Welcome", ("001", ("me", "Welcome"), "srv", {})),
    "repeated spaces": Row(":srv   MODE   #c  +b   a:b ", ("MODE", ("#c", "+b", "a:b"), "srv", {})),
    "tags": Row(
        "@time=2026-01-01T00:00:00.000Z;msgid=1 :n PRIVMSG #c :t",
        ("PRIVMSG", ("#c", "t"), "n", {"time": "2026-01-01T00:00:00.000Z", "msgid": "1"}),
    ),
    "tag value escapes": Row(
        r"@+x=a\sb\:c\\d\re\nf PING :x",
        ("PING", ("x",), None, {"+x": "a b;c\\d\re\nf"}),
    ),
    "an escaped backslash before 's'": Row(
        r"@k=a\\s PING :x", ("PING", ("x",), None, {"k": "a\\s"})
    ),
    "unknown escape drops the backslash": Row(
        r"@k=a\bc PING :x", ("PING", ("x",), None, {"k": "abc"})
    ),
    "lone trailing backslash": Row(
        "@k=ab\\ PING :x",
        ("PING", ("x",), None, {"k": "ab"}),
        {"jaraco": (("PING", ("x",), None, {"k": "ab\\"}), _SPEC_SHOULD)},
    ),
    "tags without a value": Row("@a;b= PING :x", ("PING", ("x",), None, {"a": "", "b": ""})),
    "a repeated tag: the last wins": Row("@k=1;k=2 PING :x", ("PING", ("x",), None, {"k": "2"})),
    "empty line": Row("", REJECTED),
    "blanks": Row("   ", REJECTED),
    "a prefix alone": Row(":srv", REJECTED, {"jaraco": ((":SRV", (), None, {}), _NO_COMMAND)}),
    "tags alone": Row("@a=b", REJECTED, {"jaraco": (("@A=B", (), None, {}), _NO_COMMAND)}),
    "tags and a prefix": Row(
        "@a=b :srv", REJECTED, {"jaraco": ((":SRV", (), None, {"a": "b"}), _NO_COMMAND)}
    ),
}


@pytest.mark.parametrize("codec", sorted(PARSERS))
@pytest.mark.parametrize("case", sorted(PARSE_TABLE))
def test_every_codec_parses_the_table(case: str, codec: str) -> None:
    row = PARSE_TABLE[case]
    assert PARSERS[codec](row.line) == row.expected_for(codec)


CASEFOLDS: dict[str, Callable[[str], str]] = {
    "shared": shared.casefold,
    "bot": bot.casefold,
    "jaraco": jaraco_strings.lower,
}
# jaraco folds with str.lower (all of Unicode) and maps ^ to ~, the reverse of ISUPPORT's
# rfc1459 (where ~ is the upper case of ^). Ours follow CASEMAPPING=rfc1459 to the letter.
_UNICODE = "jaraco lowers all of Unicode; rfc1459 folds ASCII only"
_CARET = "jaraco treats ^ as the upper case of ~; rfc1459 says ~ is the upper case of ^"
CASEFOLD_TABLE: dict[str, Row] = {
    "ascii": Row("NiCk", "nick"),
    "brackets and backslash": Row("[]\\", "{}|"),
    "tilde": Row("A~", "a^", {"jaraco": ("a~", _CARET)}),
    "caret stays": Row("Foo^", "foo^", {"jaraco": ("foo~", _CARET)}),
    "non-ASCII does not fold": Row(
        "ÉLAN[]~", "Élan{}^", {"jaraco": ("élan{}~", f"{_UNICODE}; {_CARET}")}
    ),
    "dotted capital I": Row("İrc", "İrc", {"jaraco": ("i̇rc", _UNICODE)}),
}


@pytest.mark.parametrize("codec", sorted(CASEFOLDS))
@pytest.mark.parametrize("case", sorted(CASEFOLD_TABLE))
def test_every_codec_casefolds_the_table(case: str, codec: str) -> None:
    row = CASEFOLD_TABLE[case]
    assert CASEFOLDS[codec](row.line) == row.expected_for(codec)


def _frame_shared(chunks: list[bytes]) -> list[str] | str:
    buf = shared.LineBuffer()
    return [line for chunk in chunks for line in buf.feed(chunk) if isinstance(line, str)]


def _frame_bot(chunks: list[bytes]) -> list[str] | str:
    splitter = bot.LineSplitter()
    return [line for chunk in chunks for line in splitter.feed(chunk)]


def _frame_jaraco(chunks: list[bytes]) -> list[str] | str:
    # The buffer irc.client uses, with its default (strict) decoding; the client skips
    # the blank lines the buffer yields, so the adapter does too.
    buf = jaraco_buffer.DecodingLineBuffer()
    out: list[str] = []
    try:
        for chunk in chunks:
            buf.feed(chunk)
            out.extend(line for line in buf.lines() if line)
    except UnicodeDecodeError:
        return DECODE_ERROR
    return out


FRAMERS: dict[str, Callable[[list[bytes]], list[str] | str]] = {
    "shared": _frame_shared,
    "bot": _frame_bot,
    "jaraco": _frame_jaraco,
}
FRAMING_TABLE: dict[str, Row] = {
    "CRLF": Row([b"PING :a\r\n"], ["PING :a"]),
    "bare LF": Row([b"PING :a\n"], ["PING :a"]),
    "split across reads": Row(
        [b"PING :a\r\nPING :b\nPI", b"NG :c\r", b"\n"],
        ["PING :a", "PING :b", "PING :c"],
    ),
    "blank lines skipped": Row([b"\r\n\n\r\nPING :a\r\n"], ["PING :a"]),
    "a lone CR is data": Row([b"PING :a\rb\r\n"], ["PING :a\rb"]),
    "an unfinished line waits": Row([b"PING :a"], []),
    "a character split across reads": Row(
        [b"PING :caf\xc3", b"\xa9\r\n"],
        ["PING :café"],
    ),
    "bytes that are not UTF-8": Row(
        [b"PING :\xff\r\n"],
        ["PING :\udcff"],
        {"jaraco": (DECODE_ERROR, "its buffer decodes strictly unless told otherwise")},
    ),
}


@pytest.mark.parametrize("codec", sorted(FRAMERS))
@pytest.mark.parametrize("case", sorted(FRAMING_TABLE))
def test_every_codec_frames_the_table(case: str, codec: str) -> None:
    row = FRAMING_TABLE[case]
    assert FRAMERS[codec](row.line) == row.expected_for(codec)


def _format_shared(command: str, *params: str) -> str:
    return shared.format_line(command, *params)


def _format_bot(command: str, *params: str) -> str:
    return bot.render(command, *params).decode().removesuffix("\r\n")


FORMATTERS: dict[str, Callable[..., str]] = {"shared": _format_shared, "bot": _format_bot}
_INJECTION = (
    "the server relays what clients sent and must never split it into two commands, so it "
    "blanks CR/LF/NUL; the bot refuses to send a parameter that would inject a line"
)
FORMAT_TABLE: dict[str, Row] = {
    "one word is trailing": Row(("PRIVMSG", "#c", "word"), "PRIVMSG #c :word"),
    "empty trailing": Row(("PRIVMSG", "#c", ""), "PRIVMSG #c :"),
    "only a trailing": Row(("PING", "tok"), "PING :tok"),
    "no parameters": Row(("QUIT",), "QUIT"),
    "trailing starting with ':'": Row(("PRIVMSG", "#c", ":-)"), "PRIVMSG #c ::-)"),
    "a middle parameter with a space": Row(("PRIVMSG", "a b", "x"), ValueError),
    "a line break in the text": Row(
        ("PRIVMSG", "#c", "a\r\nQUIT"),
        "PRIVMSG #c :a  QUIT",
        {"bot": (ValueError, _INJECTION)},
    ),
}


@pytest.mark.parametrize("codec", sorted(FORMATTERS))
@pytest.mark.parametrize("case", sorted(FORMAT_TABLE))
def test_every_codec_formats_the_table(case: str, codec: str) -> None:
    row = FORMAT_TABLE[case]
    expected = row.expected_for(codec)
    if expected is ValueError:
        with pytest.raises(ValueError):
            FORMATTERS[codec](*row.line)
    else:
        assert FORMATTERS[codec](*row.line) == expected


_middle = st.text(
    st.characters(blacklist_characters=" \r\n\0", blacklist_categories=("Cs",)), min_size=1
).filter(lambda p: p.split() == [p] and not p.startswith(":"))
_trailing = st.text(st.characters(blacklist_characters="\r\n\0", blacklist_categories=("Cs",)))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["PRIVMSG", "NOTICE", "PING", "001"]),
    st.lists(_middle, max_size=3),
    _trailing,
)
def test_what_one_codec_formats_every_parser_reads_back(
    command: str, middle: list[str], trailing: str
) -> None:
    """Round trip across codecs: each formatter's line, parsed by every parser, gives
    back the same command and parameters (the body as the last one, intact)."""
    params = (*middle, trailing)
    for fmt in FORMATTERS.values():
        line = fmt(command, *params)
        if len(shared.encode(line)) + 2 > shared.MAX_LINE:
            continue  # the shared formatter truncates; that is its own test
        for codec, parse in PARSERS.items():
            assert parse(line) == (command, params, None, {}), codec
