"""The bot's own IRC line codec, written independently of the fixture's on purpose.

Why not share ``drivers.irc`` (the codec the enclave server and the observer use)? The
bot is the program under test: it is what gets scored. A codec shared by the server and
the bot could carry one parsing bug to both ends of the wire, where it would cancel out
(the server writes what the bot misreads in the same way) and every experiment would
still pass. So this module is a second implementation, built differently (one regular
expression for the grammar where the fixture's codec splits by hand), and
``tests/drivers/test_irc_codec.py`` holds both, and jaraco's ``irc`` parser, to one
table of lines; where they differ the table says so.

Semantics (the same decisions as the fixture's codec, checked by that table):

* :func:`parse` takes one line without its line ending; a line with no command (empty,
  blanks, only tags and/or a source) raises ValueError. Tag values are unescaped per
  IRCv3 (a lone trailing backslash is dropped); a tag without a value is ``""``.
* :func:`casefold` is ISUPPORT ``CASEMAPPING=rfc1459``: ASCII letters and ``[]\\~``
  fold to lower case and ``{}|^``; nothing else folds.
* :func:`render` always sends the last parameter as a trailing parameter (with its
  ``:``), so a one-word message body is never mistaken for a middle parameter by the
  receiver. Any CR, LF or NUL in a parameter raises ValueError instead of being sent: a
  line break inside a parameter would inject a second command.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Line", "LineSplitter", "casefold", "parse", "render"]

#: Longest line we buffer before giving up on the peer (IRCv3: 8191 bytes of tags + 512).
MAX_BUFFERED = 8191 + 512

# [@tags SP] [:source SP] COMMAND [params]; spaces between the parts may repeat.
_GRAMMAR = re.compile(
    r"""
    (?: @ (?P<tags> [^ ]*) [ ]+ )?
    (?: : (?P<source> [^ ]*) [ ]+ )?
    (?P<command> [^ :@][^ ]* )
    (?P<params> .* )
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
_ESCAPED = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}
_LOWER = {ord(up): ord(low) for up, low in zip("[]\\~", "{}|^", strict=True)}


def casefold(name: str) -> str:
    """RFC 1459 case mapping, used to compare nicks and channel names."""
    return "".join(ch.lower() if "A" <= ch <= "Z" else ch for ch in name).translate(_LOWER)


class Line(NamedTuple):
    """One received line, its parts in wire order. ``command`` is upper case."""

    tags: dict[str, str]
    source: str | None
    command: str
    params: tuple[str, ...]

    @property
    def source_nick(self) -> str | None:
        """The nick in ``nick!user@host`` (the whole source when it has neither part)."""
        return None if self.source is None else re.split(r"[!@]", self.source, maxsplit=1)[0]

    def arg(self, index: int) -> str:
        """Parameter *index*, or '' if absent (negative indexes count from the end)."""
        return self.params[index] if -len(self.params) <= index < len(self.params) else ""


def _tags(text: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in (text or "").split(";"):
        key, _, value = item.partition("=")
        if key:
            found[key] = _ESCAPE.sub(lambda m: _ESCAPED.get(m[1], m[1]), value)
    return found


def parse(text: str) -> Line:
    """Parse one line without its line ending. ValueError if it has no command."""
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        raise ValueError(f"IRC line without a command: {text!r}")
    middle, colon, trailing = m["params"].partition(" :")
    params = middle.split() + ([trailing] if colon else [])
    return Line(_tags(m["tags"]), m["source"], m["command"].upper(), tuple(params))


def render(command: str, *params: str) -> bytes:
    """Encode one line with its CRLF; the last parameter is always trailing."""
    for p in params:
        if any(ch in p for ch in "\r\n\0"):
            raise ValueError(f"CR, LF or NUL in IRC parameter {p!r}")
    parts = [command]
    if params:
        *middle, last = params
        for p in middle:
            if not p or " " in p or p.startswith(":"):
                raise ValueError(f"bad middle IRC parameter {p!r}")
        parts.extend(middle)
        parts.append(":" + last)
    return (" ".join(parts) + "\r\n").encode("utf-8", errors="surrogateescape")


class LineSplitter:
    """Turns received bytes into decoded lines (CRLF or bare LF); blank lines are skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        lines: list[str] = []
        while (nl := self._buf.find(b"\n")) >= 0:
            raw = bytes(self._buf[:nl]).rstrip(b"\r")
            del self._buf[: nl + 1]
            if raw.strip():
                lines.append(raw.decode("utf-8", errors="surrogateescape"))
        if len(self._buf) > MAX_BUFFERED:
            raise ValueError(f"peer sent more than {MAX_BUFFERED} bytes without a line end")
        return lines
