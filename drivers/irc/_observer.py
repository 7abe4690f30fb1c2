"""An IRC observer: a plain client that connects straight to a server and records.

It is the independent witness of an experiment: it talks to the server directly (never
through a fault proxy), joins a channel and records every PRIVMSG and NOTICE it receives
with its arrival time. It answers the server's PINGs, so a server with a short ping
interval keeps it connected however long it sits idle.

    async with open_observer("127.0.0.1", port, "watcher", "#enclave") as obs:
        await obs.privmsg("#enclave", "hello there")
        msg = await obs.wait_for("from the bot", timeout=5)   # Message or None

Semantics:

* ``wait_for`` / ``wait_notice`` search everything recorded so far (from index
  ``since``, default 0) and then wait; they return the first match, or ``None`` when the
  timeout passes. ``None`` is "not seen within the bound", never an observation that it
  was not sent.
* ``Message.time`` is the wall clock (``time.time()``) when the line was read off the
  socket and ``Message.mono`` the ``time.monotonic()`` of the same instant, comparable
  with other processes' monotonic stamps on the same host.
* The observer sends nothing on its own except PONGs (and a QUIT when the block exits).
* Errors during connect/registration/join raise :class:`IrcError` with the server's
  words, or ``TimeoutError`` if the server said nothing in time.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from drivers.irc._codec import IrcLine, LineBuffer, LineTooLong, casefold, parse_line

__all__ = ["IrcError", "Line", "Message", "Observer", "open_observer", "parse"]

#: Numerics that end registration with a failure.
_REGISTRATION_ERRORS = {"431", "432", "433", "436", "464", "465", "902", "904", "905"}
_JOIN_ERRORS = {"403", "405", "471", "473", "474", "475", "476"}


class IrcError(Exception):
    """The server refused something (its line is in the message)."""


@dataclass(frozen=True)
class Line(IrcLine):
    """One received line, parsed by the shared codec, with when it was read."""

    time: float = 0.0
    mono: float = 0.0
    raw: str = ""


@dataclass(frozen=True)
class Message:
    """A PRIVMSG (``kind="PRIVMSG"``) or NOTICE received by the observer."""

    time: float
    sender: str
    target: str
    text: str
    kind: str = "PRIVMSG"
    mono: float = 0.0
    tags: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


def parse(raw: str, now: float | None = None, mono: float | None = None) -> Line:
    """Parse one line (the shared codec's :func:`parse_line`) and stamp it with *now*
    and *mono* (default: the clocks now). ValueError for a line with no command."""
    msg = parse_line(raw)
    return Line(
        msg.command,
        msg.params,
        msg.prefix,
        msg.tags,
        time.time() if now is None else now,
        time.monotonic() if mono is None else mono,
        raw,
    )


class Observer:
    """A connected, registered client. Create with :func:`open_observer`."""

    def __init__(self, stream: trio.abc.Stream, nick: str, channel: str | None) -> None:
        self.stream = stream
        self.nick = nick
        self.channel = channel
        #: Every PRIVMSG received, in arrival order.
        self.messages: list[Message] = []
        #: Every NOTICE received, in arrival order.
        self.notices: list[Message] = []
        #: Every line received (parsed), in arrival order.
        self.lines: list[Line] = []
        #: PINGs received from the server and answered.
        self.pings_answered = 0
        #: Received lines that were not IRC (no command, or over the length limit).
        self.unparsed = 0
        #: Set when the server closed the connection (or it broke); see ``close_reason``.
        self.closed = trio.Event()
        self.close_reason: str | None = None
        self._changed = trio.Event()
        self._send_lock = trio.Lock()

    # ------------------------------------------------------------------ sending

    async def send_raw(self, line: str) -> None:
        """Send one line as given (CRLF added). Raises ValueError on an embedded CR/LF."""
        line = line.removesuffix("\r\n")
        if "\r" in line or "\n" in line:
            raise ValueError("one line at a time: no CR or LF inside")
        async with self._send_lock:
            await self.stream.send_all(line.encode("utf-8", errors="surrogateescape") + b"\r\n")

    async def privmsg(self, target: str, text: str) -> None:
        """``PRIVMSG target :text`` (the body always as a trailing parameter)."""
        await self.send_raw(f"PRIVMSG {target} :{text}")

    # ------------------------------------------------------------------ waiting

    async def _wait(self, find: Callable[[], object | None], timeout: float) -> object | None:
        with trio.move_on_after(timeout):
            while True:
                found = find()
                if found is not None:
                    return found
                if self.closed.is_set():
                    # Nothing more can arrive; the last check above saw everything.
                    return None
                await self._changed.wait()
        return None

    async def wait_for(
        self, text: str, timeout: float, *, since: int = 0, sender: str | None = None
    ) -> Message | None:
        """The first PRIVMSG (from index *since*) whose text contains *text*, else None."""

        def find() -> Message | None:
            for m in self.messages[since:]:
                if text in m.text and (sender is None or m.sender.lower() == sender.lower()):
                    return m
            return None

        found = await self._wait(find, timeout)
        return found if isinstance(found, Message) else None

    async def wait_notice(
        self, regex: str | re.Pattern[str], timeout: float, *, since: int = 0
    ) -> Message | None:
        """The first NOTICE (from index *since*) whose text matches *regex* (``search``)."""
        pattern = re.compile(regex) if isinstance(regex, str) else regex

        def find() -> Message | None:
            for m in self.notices[since:]:
                if pattern.search(m.text):
                    return m
            return None

        found = await self._wait(find, timeout)
        return found if isinstance(found, Message) else None

    async def wait_line(
        self, match: Callable[[Line], bool], timeout: float, *, since: int = 0
    ) -> Line | None:
        """The first received line (from index *since*) for which *match* is true."""

        def find() -> Line | None:
            for line in self.lines[since:]:
                if match(line):
                    return line
            return None

        found = await self._wait(find, timeout)
        return found if isinstance(found, Line) else None

    # ------------------------------------------------------------------ reading

    def _record(self, line: Line) -> None:
        self.lines.append(line)
        if line.command in ("PRIVMSG", "NOTICE") and len(line.params) >= 2:
            msg = Message(
                line.time,
                line.nick or "",
                line.params[0],
                line.params[-1],
                line.command,
                line.mono,
                line.tags,
            )
            (self.messages if line.command == "PRIVMSG" else self.notices).append(msg)
        elif line.command == "ERROR":
            self.close_reason = line.params[-1] if line.params else "ERROR"
        self._changed.set()
        self._changed = trio.Event()

    async def _reader(self) -> None:
        buf = LineBuffer()
        try:
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    self.close_reason = self.close_reason or "EOF"
                    return
                now, mono = time.time(), time.monotonic()
                for text in buf.feed(data):
                    # A line over the length limit, or one with no command, is the
                    # server's bug: counted, never recorded as a line.
                    if isinstance(text, LineTooLong):
                        self.unparsed += 1
                        continue
                    try:
                        line = parse(text, now, mono)
                    except ValueError:
                        self.unparsed += 1
                        continue
                    if line.command == "PING":
                        token = line.params[-1] if line.params else ""
                        await self.send_raw(f"PONG :{token}")
                        self.pings_answered += 1
                    self._record(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.close_reason = self.close_reason or f"broken: {exc.__cause__ or exc}"
        finally:
            self.closed.set()
            self._changed.set()


_Match = Callable[[Line], bool]


def _is(*commands: str) -> _Match:
    return lambda ln: ln.command in commands


def _cap(sub: str) -> _Match:
    return lambda ln: ln.command == "CAP" and ln.params[1:2] == (sub,)


_WELCOME = _is("001")
_REFUSED = _is("ERROR", *_REGISTRATION_ERRORS)


async def _exchange(
    obs: Observer,
    send: list[str],
    what: str,
    ok: _Match,
    bad: _Match,
    timeout: float,
    *,
    since: int | None = None,
) -> Line:
    """Send *send*, then wait for the first line (from *since*, default: from before the
    send) that is *ok* (returned) or *bad* (IrcError with the server's line)."""
    mark = len(obs.lines) if since is None else since
    for text in send:
        await obs.send_raw(text)
    line = await obs.wait_line(lambda ln: ok(ln) or bad(ln), timeout, since=mark)
    if line is None:
        if obs.closed.is_set():
            raise IrcError(f"{what}: connection closed ({obs.close_reason})")
        raise TimeoutError(f"{what}: no answer from the server within {timeout} s")
    if bad(line):
        raise IrcError(f"{what}: {line.raw}")
    return line


@asynccontextmanager
async def open_observer(
    host: str,
    port: int,
    nick: str,
    channel: str | None,
    *,
    sasl: tuple[str, str] | None = None,
    password: str | None = None,
    caps: tuple[str, ...] = (),
    timeout: float = 10.0,
) -> AsyncIterator[Observer]:
    """Connect, register (optionally with SASL PLAIN ``(authcid, password)`` or PASS),
    join *channel* (if not None), and yield the :class:`Observer`.

    *caps* are extra capabilities to request (e.g. ``("server-time",)``); the request
    fails with :class:`IrcError` if the server NAKs it. Exiting sends QUIT and closes.
    """
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
    obs = Observer(stream, nick, channel)
    try:
        async with _unwrapped_nursery() as nursery:
            nursery.start_soon(obs._reader)
            await _register(obs, nick, sasl=sasl, password=password, caps=caps, timeout=timeout)
            if channel is not None:

                def joined(ln: Line) -> bool:
                    return ln.command == "JOIN" and casefold(ln.nick or "") == casefold(nick)

                refused = _is(*_JOIN_ERRORS)
                await _exchange(
                    obs, [f"JOIN {channel}"], f"JOIN {channel}", joined, refused, timeout
                )
            try:
                yield obs
            finally:
                with trio.move_on_after(1, shield=True):
                    try:
                        await obs.send_raw("QUIT :observer done")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


@asynccontextmanager
async def _unwrapped_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery whose lone exception is re-raised as itself, not in an ExceptionGroup,
    so ``pytest.raises(IrcError)`` and ``except TimeoutError`` work on the context
    manager. Several concurrent errors still arrive as a group."""
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
            raise group.exceptions[0] from None
        raise


def _sasl_plain(authcid: str, secret: str) -> list[str]:
    """``AUTHENTICATE`` lines for PLAIN: base64 in 400-byte chunks, ``+`` after a full one."""
    blob = base64.b64encode(f"{authcid}\0{authcid}\0{secret}".encode()).decode()
    chunks = [blob[i : i + 400] for i in range(0, len(blob), 400)] or ["+"]
    if len(chunks[-1]) == 400:
        chunks.append("+")
    return [f"AUTHENTICATE {chunk}" for chunk in chunks]


async def _register(
    obs: Observer,
    nick: str,
    *,
    sasl: tuple[str, str] | None,
    password: str | None,
    caps: tuple[str, ...],
    timeout: float,
) -> None:
    wanted = " ".join([*caps, *(["sasl"] if sasl else [])])
    hello = [f"PASS {password}"] if password is not None else []
    hello += ["CAP LS 302", f"NICK {nick}", f"USER {nick[:10]} 0 * :faultnet observer"]
    mark = len(obs.lines)
    listed = _cap("LS")
    first = await _exchange(
        obs, hello, "registration", lambda ln: listed(ln) or _WELCOME(ln), _REFUSED, timeout
    )
    if first.command == "001":  # a server without CAP support registered us directly
        if wanted:
            raise IrcError(f"server does not support capabilities, wanted {wanted}")
        return
    if wanted:
        await _exchange(
            obs, [f"CAP REQ :{wanted}"], f"CAP REQ {wanted}", _cap("ACK"), _cap("NAK"), timeout
        )
    if sasl is not None:
        authcid, secret = sasl
        started, failed = _is("AUTHENTICATE"), _is("904", "905", "908")
        await _exchange(obs, ["AUTHENTICATE PLAIN"], "AUTHENTICATE PLAIN", started, failed, timeout)
        done, failed = _is("903"), _is("902", "904", "905", "906")
        await _exchange(
            obs, _sasl_plain(authcid, secret), f"SASL PLAIN as {authcid}", done, failed, timeout
        )
    await _exchange(obs, ["CAP END"], "registration", _WELCOME, _REFUSED, timeout, since=mark)
