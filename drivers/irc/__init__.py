"""IRC for the fixture side: one line codec and an observer.

* :mod:`drivers.irc._codec` -- the IRC line format (parse, format, frame, case mapping),
  shared by the enclave server (``harness.enclave``) and the observer, so the fixture
  has one reading of the wire. The reference bot keeps its own on purpose.
* :mod:`drivers.irc._observer` -- :func:`open_observer`, the independent witness that
  connects straight to a server and records what it receives.
"""

from drivers.irc._codec import (
    MAX_LINE,
    MAX_TAGS,
    IrcLine,
    LineBuffer,
    LineTooLong,
    casefold,
    decode,
    encode,
    escape_tag_value,
    format_line,
    parse_line,
    unescape_tag_value,
)
from drivers.irc._observer import IrcError, Line, Message, Observer, open_observer, parse

__all__ = [
    "MAX_LINE",
    "MAX_TAGS",
    "IrcError",
    "IrcLine",
    "Line",
    "LineBuffer",
    "LineTooLong",
    "Message",
    "Observer",
    "casefold",
    "decode",
    "encode",
    "escape_tag_value",
    "format_line",
    "open_observer",
    "parse",
    "parse_line",
    "unescape_tag_value",
]
