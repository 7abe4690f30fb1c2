"""The bot's own IRC line codec (deliberately independent of the enclave server's).

The bot is the program under test and the server is part of the fixture; sharing one
parser would let a parsing bug cancel out on both ends of the wire.

Semantics: :func:`render` always sends the last parameter as a trailing parameter (with
its ``:``), so a one-word message body is never mistaken for a middle parameter by the
receiver. Any CR, LF or NUL in a parameter raises ValueError instead of being sent: a
line break inside a parameter would inject a second command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Line", "LineSplitter", "casefold", "parse", "render"]

_UNESCAPE = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}
_CASE = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ[]\\~", "abcdefghijklmnopqrstuvwxyz{}|^")

#: Longest line we buffer before giving up on the peer (IRCv3: 8191 bytes of tags + 512).
MAX_BUFFERED = 8191 + 512


def casefold(name: str) -> str:
    """RFC 1459 case mapping, used to compare nicks and channel names."""
    return name.translate(_CASE)


@dataclass(frozen=True)
class Line:
    """One received line. ``command`` is upper case; ``source`` is the prefix or None."""

    command: str
    params: tuple[str, ...] = ()
    source: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def source_nick(self) -> str | None:
        if self.source is None:
            return None
        return self.source.split("!", 1)[0].split("@", 1)[0]

    def arg(self, index: int) -> str:
        """Parameter *index*, or '' if absent (negative indexes count from the end)."""
        try:
            return self.params[index]
        except IndexError:
            return ""


def _unescape(value: str) -> str:
    out: list[str] = []
    chars = iter(value)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, "")
            out.append(_UNESCAPE.get(nxt, nxt))
        else:
            out.append(ch)
    return "".join(out)


def parse(text: str) -> Line:
    """Parse one line without its line ending. ValueError if it has no command."""
    rest = text
    tags: dict[str, str] = {}
    if rest.startswith("@"):
        raw, _, rest = rest[1:].partition(" ")
        for item in raw.split(";"):
            if item:
                key, _, value = item.partition("=")
                tags[key] = _unescape(value)
        rest = rest.lstrip(" ")
    source = None
    if rest.startswith(":"):
        source, _, rest = rest[1:].partition(" ")
        rest = rest.lstrip(" ")
    trailing = None
    if rest.startswith(":"):
        rest, trailing = "", rest[1:]
    elif " :" in rest:
        rest, trailing = rest.split(" :", 1)
    words = rest.split()
    if not words:
        raise ValueError(f"IRC line without a command: {text!r}")
    params = words[1:] + ([trailing] if trailing is not None else [])
    return Line(words[0].upper(), tuple(params), source, tags)


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
