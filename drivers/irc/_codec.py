"""IRC line format (RFC 1459/2812 plus IRCv3 message tags): parse, format, frame.

The fixture side's one codec: the enclave server and the IRC observer both use it. The
reference bot deliberately has its own (``harness.bot._irc_proto``: it is the program
under test), and ``tests/drivers/test_irc_codec.py`` runs both, and jaraco's ``irc``
parser, over one table of lines; where they differ, the table says so and why.

A line is ``[@tags ][:prefix ]COMMAND[ params...][ :trailing]`` terminated by CRLF (a bare
LF is accepted on input). Semantics this module guarantees:

* **A line without a command** (empty, blanks, or only tags and/or a prefix) is an error:
  :func:`parse_line` raises ``ValueError``. Framing (:class:`LineBuffer`) never yields a
  blank line, so a caller sees this only for a line such as ``:prefix`` alone.
* **Case mapping is RFC 1459 as ISUPPORT ``CASEMAPPING=rfc1459`` defines it**: ASCII
  ``A-Z`` plus ``[]\\~`` are the upper case of ``a-z`` plus ``{}|^``; nothing else folds
  (``É`` stays ``É``), so two names equal under it are equal on every rfc1459 server.
* **The last parameter is always sent as a trailing parameter** (with its ``:``) by
  :func:`format_line`, whatever it contains. A receiver therefore gets a one-word message
  body intact; a server that wrote ``PRIVMSG #c word`` instead of ``PRIVMSG #c :word``
  invites parsers that read the body as a middle parameter to lose it.
* **512 bytes** is the limit for everything after the tags, CRLF included
  (:data:`MAX_LINE`). :func:`format_line` truncates the trailing parameter at a UTF-8
  character boundary to stay under it; it never splits a multi-byte character.
* Text is carried as ``str`` decoded with ``surrogateescape``, so bytes that are not UTF-8
  survive a parse/format round trip unchanged.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

__all__ = [
    "MAX_LINE",
    "MAX_TAGS",
    "IrcLine",
    "LineBuffer",
    "LineTooLong",
    "casefold",
    "decode",
    "encode",
    "escape_tag_value",
    "format_line",
    "parse_line",
    "unescape_tag_value",
]

#: Bytes allowed for the non-tag part of a line, CRLF included (RFC 1459 section 2.3).
MAX_LINE = 512
#: Bytes allowed for the tag section including ``@`` and the trailing space (IRCv3).
MAX_TAGS = 8191

_TAG_ESCAPES = {";": r"\:", " ": r"\s", "\\": "\\\\", "\r": r"\r", "\n": r"\n"}
_TAG_UNESCAPES = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


_RFC1459 = str.maketrans(string.ascii_uppercase + "[]\\~", string.ascii_lowercase + "{}|^")


def casefold(name: str) -> str:
    """RFC 1459 case mapping (ASCII letters and ``[]\\~`` -> ``{}|^``; nothing else)."""
    return name.translate(_RFC1459)


def escape_tag_value(value: str) -> str:
    return "".join(_TAG_ESCAPES.get(ch, ch) for ch in value)


def unescape_tag_value(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\":
            i += 1
            if i < len(raw):
                out.append(_TAG_UNESCAPES.get(raw[i], raw[i]))
            # A lone trailing backslash is dropped (IRCv3 message-tags).
        else:
            out.append(ch)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class IrcLine:
    """One parsed line. ``command`` is upper-cased; numerics stay as three digits; a tag
    without a value has the value ``""`` (IRCv3: the two are equivalent)."""

    command: str
    params: tuple[str, ...] = ()
    prefix: str | None = None
    tags: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def nick(self) -> str | None:
        """The nick part of the prefix (``nick!user@host``), or None."""
        if self.prefix is None:
            return None
        return self.prefix.split("!", 1)[0].split("@", 1)[0]

    def param(self, index: int, default: str = "") -> str:
        return self.params[index] if index < len(self.params) else default


def parse_line(line: str) -> IrcLine:
    """Parse one line (a trailing CRLF or LF is ignored). ValueError: no command in it."""
    rest = line.rstrip("\r\n")
    tags: dict[str, str] = {}
    if rest.startswith("@"):
        raw_tags, _, rest = rest[1:].partition(" ")
        for item in raw_tags.split(";"):
            if not item:
                continue
            key, eq, value = item.partition("=")
            tags[key] = unescape_tag_value(value) if eq else ""
        rest = rest.lstrip(" ")
    prefix = None
    if rest.startswith(":"):
        prefix, _, rest = rest[1:].partition(" ")
        rest = rest.lstrip(" ")
    trailing: str | None = None
    if " :" in rest:
        rest, trailing = rest.split(" :", 1)
    elif rest.startswith(":"):
        trailing, rest = rest[1:], ""
    words = rest.split()
    if not words:
        raise ValueError(f"no command in line {line!r}")
    params = words[1:] if trailing is None else [*words[1:], trailing]
    return IrcLine(words[0].upper(), tuple(params), prefix, tags)


def _truncate_utf8(text: str, max_bytes: int) -> str:
    data = encode(text)
    if len(data) <= max_bytes:
        return text
    cut = max(max_bytes, 0)
    # Back off to a character boundary: continuation bytes are 0b10xxxxxx.
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return decode(data[:cut])


def format_line(
    command: str,
    *params: str,
    prefix: str | None = None,
    tags: dict[str, str] | None = None,
) -> str:
    """Render a line WITHOUT its CRLF; the last parameter is always trailing (``:``).

    Middle parameters must be non-empty and contain no space and not start with ``:``
    (ValueError otherwise: such a parameter would be silently re-split by the receiver).
    If the line would exceed :data:`MAX_LINE` the trailing parameter is shortened.
    """
    head: list[str] = []
    if tags:
        items = [k if v == "" else f"{k}={escape_tag_value(v)}" for k, v in tags.items()]
        head.append("@" + ";".join(items))
    if prefix:
        head.append(":" + prefix)
    body = [command]
    if params:
        *middle, last = params
        for p in middle:
            if not p or " " in p or p.startswith(":") or "\r" in p or "\n" in p:
                raise ValueError(f"bad middle parameter {p!r}")
        body.extend(middle)
        last = last.replace("\r", " ").replace("\n", " ").replace("\0", " ")
        fixed = " ".join(([":" + prefix] if prefix else []) + body) + " :"
        room = MAX_LINE - 2 - len(encode(fixed))
        body.append(":" + _truncate_utf8(last, room))
    tag_part = head[0] + " " if tags else ""
    pre = ":" + prefix + " " if prefix else ""
    return tag_part + pre + " ".join(body)


class LineTooLong(ValueError):
    """A received line exceeded the limits; the line was discarded."""


class LineBuffer:
    """Split a byte stream into lines, enforcing :data:`MAX_LINE` on the non-tag part.

    :meth:`feed` returns the complete lines in arrival order; an over-long line is
    returned as a :class:`LineTooLong` instance in its place (so the caller can answer
    417 in order) and its bytes are discarded up to the next LF.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[str | LineTooLong]:
        self._buf += data
        out: list[str | LineTooLong] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_TAGS + MAX_LINE:
                    if not self._discarding:
                        out.append(LineTooLong("line too long"))
                    self._discarding = True
                    self._buf.clear()
                break
            raw = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if self._discarding:
                self._discarding = False
                continue
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            if not raw.strip():
                continue
            body = raw
            if raw.startswith(b"@"):
                tag_part, _, body = raw.partition(b" ")
                if len(tag_part) + 1 > MAX_TAGS:
                    out.append(LineTooLong("tags too long"))
                    continue
            if len(body) + 2 > MAX_LINE:
                out.append(LineTooLong("line too long"))
                continue
            out.append(decode(raw))
        return out
