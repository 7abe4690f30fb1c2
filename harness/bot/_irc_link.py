"""The IRC side of the bot: one link to the enclave, kept alive, re-made when it fails.

Lifecycle. :meth:`IrcLink.run` loops forever: connect (TCP, ``CAP LS 302``, the login
its answer decides -- SASL PLAIN or ``PASS``, see ``BOT_AUTH`` --, ``CAP REQ``,
registration, ``JOIN``), serve the registered link until it fails, tear it
down, connect again. Connection attempts that fail are retried by tenacity with
exponential back-off: ``BOT_RECONNECT_BASE_S`` doubling per failed attempt up to
``BOT_RECONNECT_MAX_S``; the first attempt after a registered link drops is immediate.
The whole of one attempt (connect to JOIN) is bounded by ``BOT_REGISTER_TIMEOUT_S``.

One connection = one :class:`_Session` object. Everything known about a link -- its
acknowledged caps, its nick, whether the channel is joined, pending confirmations and
service requests -- lives on that object and nowhere else, and the object is discarded
whole when the link drops. No cached view of a dead link can survive a reconnect, and a
post waiting on the old link is woken at once with "link dropped".

Keepalive. The idle clock measures time since the last INBOUND byte. After
``BOT_KEEPALIVE_IDLE_S`` of silence the bot sends ``PING``; if the matching ``PONG``
does not arrive within ``BOT_PONG_TIMEOUT_S`` it emits ``pong_timeout``, closes the
socket and reconnects. A frozen link (no bytes, no FIN, writes still succeed) is thereby
detected within idle + PONG timeout of its last inbound byte. Outbound writes do NOT
touch the idle clock: a write only proves the local kernel took the bytes.

Confirmation. A post writes ``PRIVMSG`` and ``PING :confirm-<unique>`` in one write and
waits up to ``BOT_CONFIRM_BUDGET_S`` for that token's ``PONG``. The server answers PINGs
in order after processing the PRIVMSG, so the PONG proves the server consumed the post.
No PONG in time -> the result says UNCONFIRMED. An unconfirmed post does not drop the
link; detecting dead links is the keepalive's job alone.

Every wait is bounded: a tool call never blocks on a dead link for longer than its budget.
"""

from __future__ import annotations

import base64
import collections
import itertools
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import trio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from harness.bot._config import BotConfig
from harness.bot._events import EventSink
from harness.bot._irc_proto import Line, LineSplitter, casefold, parse, render

__all__ = [
    "SERVICE_NICK",
    "WANTED_CAPS",
    "ChannelMessage",
    "ConnectFailed",
    "IrcLink",
    "PostResult",
    "ServiceReply",
]

#: Capabilities the bot asks for (those the server offers). sasl is mandatory.
WANTED_CAPS: tuple[str, ...] = ("sasl", "echo-message", "message-tags", "server-time")
#: The enclave's registry service.
SERVICE_NICK = "EnclaveServ"
#: Longest single line of text a post may carry (bytes, UTF-8): the 512-byte IRC line
#: minus the command, the channel and a server-added prefix of up to ~100 bytes.
MAX_TEXT_BYTES = 380

_CAP_END = render("CAP", "END")
_NICK_REFUSED = {"431", "432", "433", "436", "437"}
_SASL_REFUSED = {"902", "904", "905", "906", "908"}
_JOIN_REFUSED = {"403", "405", "471", "473", "474", "475", "476", "477"}


class ConnectFailed(Exception):
    """One connection attempt failed before the link was usable; it will be retried."""


class _Eof(Exception):
    """The server closed its side of the connection."""


@dataclass(frozen=True)
class ChannelMessage:
    """A PRIVMSG received on a channel. ``time`` is ISO 8601 UTC (server-time if sent)."""

    channel: str
    sender: str
    text: str
    time: str


@dataclass(frozen=True)
class PostResult:
    """Outcome of one send-channel.

    ``outcome`` is ``confirmed`` (the server's PONG came back in budget), ``skipped``
    (no-confirm defect: delivery claimed without confirmation), ``unconfirmed`` (written,
    no confirmation), or ``not_connected`` (nothing was written).
    """

    outcome: str
    text: str
    elapsed_ms: float
    lines: int

    @property
    def claims_delivery(self) -> bool:
        return self.outcome in ("confirmed", "skipped")


@dataclass(frozen=True)
class ServiceReply:
    """EnclaveServ's answer to SPAWN/REVOKE. ``fields`` holds the parsed reply words."""

    ok: bool
    text: str
    fields: dict[str, str] = field(default_factory=dict)


class _Waiter:
    """A one-shot slot for an awaited reply; the first :meth:`resolve` wins."""

    __slots__ = ("at", "event", "outcome", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.outcome: str | None = None
        self.value: Any = None
        #: trio clock when resolved: a reply is judged by when it came, not when read.
        self.at = float("inf")

    def resolve(self, outcome: str, value: Any = None) -> None:
        if self.outcome is None:
            self.outcome, self.value = outcome, value
            self.at = trio.current_time()
            self.event.set()


_Matcher = Callable[[Line], "ServiceReply | None"]


class _Session:
    """Everything known about ONE connection; discarded whole when it drops."""

    def __init__(self, number: int, stream: trio.SocketStream, now: float) -> None:
        self.number = number
        self.stream = stream
        self.splitter = LineSplitter()
        self.pending: collections.deque[str] = collections.deque()
        self.offered: dict[str, str] = {}
        #: The login chosen for this connection ("sasl", "pass", "none"); "" until chosen.
        self.auth = ""
        self.caps: frozenset[str] = frozenset()
        self.nick: str | None = None
        self.server_name: str | None = None
        self.joined = False
        self.ready = False
        self.opened_mono = now
        self.ready_mono: float | None = None
        self.last_inbound = now
        # What the keepalive measures idleness from. Only inbound bytes move it, unless
        # the outbound-refreshes-idle defect is on.
        self.idle_mark = now
        self.write_lock = trio.Lock()
        self.pongs: dict[str, _Waiter] = {}
        self.services: list[tuple[_Matcher, _Waiter]] = []
        self.scope: trio.CancelScope | None = None
        self.down_reason: str | None = None
        self.down_detail = ""


def _os_error_text(exc: OSError) -> str:
    """The underlying reason (e.g. "Connection refused"): trio's open_tcp_stream wraps
    the per-address errors in a generic "all attempts to connect ... failed"."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        inner = [e for e in cause.exceptions if isinstance(e, OSError)]
        if inner:
            return "; ".join(sorted({e.strerror or str(e) for e in inner}))
    return exc.strerror or str(exc)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(seconds: float) -> float:
    """Seconds as milliseconds, to the microsecond: how every event reports a duration."""
    return round(seconds * 1000, 3)


def _plural(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _answer_services(s: _Session, line: Line) -> None:
    """Hand the NOTICE *line* to every service request of *s* whose matcher takes it
    (each one answered leaves the list)."""
    for entry in list(s.services):
        matcher, waiter = entry
        reply = matcher(line)
        if reply is not None:
            s.services.remove(entry)
            waiter.resolve("reply", reply)


class IrcLink:
    """The bot's link to the enclave. Start :meth:`run` in a nursery; call the rest from
    any task in the same trio run."""

    def __init__(
        self,
        config: BotConfig,
        events: EventSink,
        on_channel_message: Callable[[ChannelMessage], None],
    ) -> None:
        self._cfg = config
        self._events = events
        self._on_message = on_channel_message
        self._session: _Session | None = None
        self._registered = 0  # sessions that reached "connected"
        self._down_since: float | None = None
        self._last_down: dict[str, Any] | None = None
        self._tokens = itertools.count(1)
        self._leaked: list[int] = []  # leak-fd-on-reconnect: never closed, by design
        self.counters: collections.Counter[str] = collections.Counter()

    def _record(self, event: str, **fields: Any) -> None:
        """Count *event* in :attr:`counters` and emit it as a BOTEVENT record."""
        self.counters[event] += 1
        self._events.emit(event, **fields)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a link up until cancelled. Never returns otherwise."""
        task_status.started()
        while True:
            session = await self._connect()
            await self._serve(session)

    async def _connect(self) -> _Session:
        retrying = AsyncRetrying(
            sleep=trio.sleep,
            retry=retry_if_exception_type(ConnectFailed),
            wait=wait_exponential(
                multiplier=self._cfg.reconnect_base_s, max=self._cfg.reconnect_max_s
            ),
            before_sleep=self._before_retry,
            reraise=True,
        )
        session: _Session | None = None
        async for attempt in retrying:
            with attempt:
                session = await self._open()
        assert session is not None
        return session

    def _before_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else None
        self._record(
            "connect_failed",
            attempt=state.attempt_number,
            reason=str(exc),
            retry_in_s=wait,
        )

    async def _open(self) -> _Session:
        """One connection attempt, bounded by the registration timeout."""
        cfg = self._cfg
        stream: trio.SocketStream | None = None
        try:
            with trio.move_on_after(cfg.register_timeout_s):
                try:
                    stream = await trio.open_tcp_stream(cfg.host, cfg.port)
                except OSError as exc:
                    raise ConnectFailed(
                        f"connect to {cfg.host}:{cfg.port} failed: {_os_error_text(exc)}"
                    ) from None
                session = _Session(self._registered + 1, stream, time.monotonic())
                try:
                    await self._register(session)
                except _Eof:
                    raise ConnectFailed(
                        "server closed the connection during registration"
                    ) from None
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise ConnectFailed(f"connection failed during registration: {exc}") from None
                self._mark_ready(session)
                return session
            raise ConnectFailed(
                f"not registered and joined within BOT_REGISTER_TIMEOUT_S={cfg.register_timeout_s:g} s"
            )
        except BaseException:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise

    def _wanted_caps(self) -> tuple[str, ...]:
        if self._registered > 0 and self._cfg.has("drop-caps-on-reconnect"):
            return ("sasl",)
        return WANTED_CAPS

    def _choose_auth(self, offered: dict[str, str]) -> str:
        """The login for this connection, from ``BOT_AUTH`` and what the server offered
        (nothing, for a server without CAP). ConnectFailed if SASL is required but absent."""
        mechs = offered.get("sasl", "")
        sasl = "sasl" in offered and (not mechs or "PLAIN" in mechs.upper().split(","))
        auth = self._cfg.auth
        if auth == "auto":
            auth = "none" if self._cfg.token is None else "sasl" if sasl else "pass"
        if auth == "sasl" and not sasl:
            raise ConnectFailed("server does not offer SASL PLAIN (BOT_AUTH=sasl)")
        return auth

    def _hello(self, auth: str) -> bytes:
        """PASS (if that is the login), NICK and USER: sent once the login is chosen, as
        PASS must precede NICK/USER and is chosen from the server's CAP LS."""
        cfg = self._cfg
        login = render("PASS", cfg.token) if auth == "pass" and cfg.token else b""
        return (
            login
            + render("NICK", cfg.nick)
            + render("USER", cfg.nick, "0", "*", "enclave reference bot")
        )

    async def _register(self, s: _Session) -> None:
        """CAP LS 302 first; its answer decides the login; then PASS/NICK/USER, CAP REQ,
        SASL when chosen, CAP END, and JOIN. A server that answers CAP with 410/421 has
        no capabilities: the login is chosen from nothing and registration goes on."""
        cfg = self._cfg
        wanted = self._wanted_caps()
        await self._write(s, render("CAP", "LS", "302"))
        offered: dict[str, str] = {}
        requested: set[str] = set()
        while True:
            line = parse(await self._read_line(s))
            cmd = line.command
            refused = self._refusal(line)
            if refused is not None:
                raise ConnectFailed(refused)
            if cmd == "PING":
                await self._write(s, render("PONG", *line.params))
            elif cmd == "CAP":
                requested = await self._on_cap(s, line, wanted, offered, requested)
            elif cmd == "AUTHENTICATE" and line.arg(0) == "+":
                await self._write(s, self._sasl_plain())
            elif cmd == "903":
                await self._write(s, _CAP_END)
            elif cmd in ("410", "421") and line.arg(1).upper() in ("CAP", "LS") and not s.auth:
                s.auth = self._choose_auth({})  # a server without IRCv3 capabilities
                await self._write(s, self._hello(s.auth))
            elif cmd == "001":
                s.nick = line.arg(0) or cfg.nick
                s.server_name = line.source
                await self._write(s, render("JOIN", cfg.channel))
            elif cmd == "JOIN" and self._is_me(s, line.source_nick):
                if casefold(line.arg(0)) == casefold(cfg.channel):
                    s.joined = True
                    return

    def _refusal(self, line: Line) -> str | None:
        """Why the server refused the registration *line* answers, or None."""
        cmd, cfg = line.command, self._cfg
        if cmd in _SASL_REFUSED:
            return f"SASL authentication refused ({cmd} {line.arg(-1)})"
        if cmd in _NICK_REFUSED:
            return f"nick {cfg.nick} refused ({cmd} {line.arg(-1)})"
        if cmd in ("464", "465"):
            return f"refused by the server ({cmd} {line.arg(-1)})"
        if cmd in _JOIN_REFUSED:
            return f"cannot join {cfg.channel} ({cmd} {line.arg(-1)})"
        if cmd == "ERROR":
            return f"server closed the link: {line.arg(-1)}"
        return None

    async def _on_cap(
        self,
        s: _Session,
        line: Line,
        wanted: tuple[str, ...],
        offered: dict[str, str],
        requested: set[str],
    ) -> set[str]:
        """One CAP answer during registration (LS, ACK or NAK); returns the caps now
        requested. LS lines accumulate in *offered* until the last decides the login."""
        sub = line.arg(1).upper()
        if sub == "LS":
            for item in line.arg(-1).split():
                key, _, value = item.partition("=")
                offered[key] = value
            if len(line.params) >= 4 and line.arg(2) == "*":
                return requested  # more LS lines follow
            s.offered = dict(offered)
            s.auth = self._choose_auth(offered)
            requested = {c for c in wanted if c in offered}
            if s.auth != "sasl":
                requested.discard("sasl")
            ask = render("CAP", "REQ", " ".join(sorted(requested)))
            await self._write(s, self._hello(s.auth) + (ask if requested else _CAP_END))
        elif sub == "ACK":
            for cap in line.arg(-1).split():
                if cap.startswith("-"):
                    s.caps = s.caps - {cap[1:]}
                else:
                    s.caps = s.caps | {cap}
            sasl = s.auth == "sasl" and "sasl" in s.caps
            await self._write(s, render("AUTHENTICATE", "PLAIN") if sasl else _CAP_END)
        elif sub == "NAK":
            if s.auth != "sasl":
                await self._write(s, _CAP_END)  # go on without the extras
            elif requested == {"sasl"}:
                raise ConnectFailed("server refused CAP REQ sasl")
            else:
                requested = {"sasl"}  # ask for the one cap we cannot do without
                await self._write(s, render("CAP", "REQ", "sasl"))
        return requested

    def _sasl_plain(self) -> bytes:
        """``AUTHENTICATE`` lines for PLAIN (authzid = authcid = nick), 400-byte chunks."""
        cfg = self._cfg
        blob = base64.b64encode(f"{cfg.nick}\0{cfg.nick}\0{cfg.token}".encode()).decode()
        chunks = [blob[i : i + 400] for i in range(0, len(blob), 400)]
        if not chunks or len(chunks[-1]) == 400:
            chunks.append("+")  # an exact multiple of 400 is terminated by an empty chunk
        return b"".join(render("AUTHENTICATE", c) for c in chunks)

    def _is_me(self, s: _Session, nick: str | None) -> bool:
        mine = s.nick or self._cfg.nick
        return nick is not None and casefold(nick) == casefold(mine)

    def _mark_ready(self, s: _Session) -> None:
        now = time.monotonic()
        s.ready, s.ready_mono = True, now
        self._registered += 1
        self._session = s
        self._record(
            "connected",
            session=s.number,
            server=f"{self._cfg.host}:{self._cfg.port}",
            auth=s.auth,
            caps=sorted(s.caps),
            channel=self._cfg.channel,
            register_ms=_ms(now - s.opened_mono),
        )
        if s.number > 1:
            down_ms = None if self._down_since is None else _ms(now - self._down_since)
            self._record(
                "reconnected",
                session=s.number,
                down_ms=down_ms,
                caps=sorted(s.caps),
                previous=self._last_down,
            )
        self._down_since = None

    async def _serve(self, s: _Session) -> None:
        """Run the reader and the keepalive until the link drops, then tear it down."""
        try:
            async with trio.open_nursery() as nursery:
                s.scope = nursery.cancel_scope
                if s.down_reason is not None:  # dropped before we got here
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._reader, s)
                nursery.start_soon(self._keepalive, s)
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown(s)

    def _drop(self, s: _Session, reason: str, detail: str) -> None:
        """Declare *s* dead (first reason wins) and stop its tasks. Safe from any task."""
        if s.down_reason is None:
            s.down_reason, s.down_detail = reason, detail
        s.ready = False
        if s.scope is not None:
            s.scope.cancel()

    async def _teardown(self, s: _Session) -> None:
        if self._session is s:
            self._session = None
        s.ready = False
        for waiter in s.pongs.values():
            waiter.resolve("link_down")
        s.pongs.clear()
        for _, waiter in s.services:
            waiter.resolve("link_down")
        s.services.clear()
        if s.down_reason is not None:  # a link failure, not process shutdown
            now = time.monotonic()
            self._down_since = now
            if self._cfg.has("leak-fd-on-reconnect"):
                # The defect: a copy of the socket that nobody will ever close. Shut the
                # connection down first so the leak is ONLY a descriptor (the peer still
                # sees the close it would have seen), keeping the pair's arms comparable.
                sock = s.stream.socket
                self._leaked.append(os.dup(sock.fileno()))
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._last_down = {"session": s.number, "reason": s.down_reason}
            self._record(
                "disconnected",
                session=s.number,
                reason=s.down_reason,
                detail=s.down_detail,
                connected_for_s=round(now - (s.ready_mono or s.opened_mono), 3),
            )
        await trio.aclose_forcefully(s.stream)

    # ------------------------------------------------------------------ I/O

    async def _read_line(self, s: _Session) -> str:
        while not s.pending:
            data = await s.stream.receive_some(65536)
            if not data:
                raise _Eof
            now = time.monotonic()
            s.last_inbound = now
            s.idle_mark = now  # inbound traffic is the only proof the link is alive
            try:
                s.pending.extend(s.splitter.feed(data))
            except ValueError as exc:
                raise OSError(str(exc)) from None
        return s.pending.popleft()

    async def _write(self, s: _Session, data: bytes) -> None:
        """Write under the session's lock; no timeout (callers bound it)."""
        async with s.write_lock:
            await s.stream.send_all(data)
        if self._cfg.has("outbound-refreshes-idle"):
            s.idle_mark = time.monotonic()  # the defect: a write "proves" nothing

    async def _send(self, s: _Session, data: bytes, timeout: float) -> bool:
        """Write within *timeout*; on failure drop the link and return False.

        A write that cannot complete in time means the peer stopped reading long enough
        to fill both socket buffers; the stream is left half-written, so it is dropped.
        """
        with trio.move_on_after(timeout):
            try:
                await self._write(s, data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._drop(s, "error", f"write failed: {exc}")
                return False
            return True
        self._drop(s, "write_stalled", f"a write did not complete within {timeout:g} s")
        return False

    async def _reader(self, s: _Session) -> None:
        try:
            while True:
                text = await self._read_line(s)
                try:
                    line = parse(text)
                except ValueError:
                    continue
                if not await self._dispatch(s, line):
                    return
        except _Eof:
            self._drop(s, "eof", "server closed the connection")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._drop(s, "error", f"read failed: {exc}")

    async def _dispatch(self, s: _Session, line: Line) -> bool:
        """Handle one line on a registered link; False once the link is done."""
        cmd = line.command
        if cmd == "PING":
            return await self._send(s, render("PONG", *line.params), self._cfg.pong_timeout_s)
        if cmd == "PONG":
            waiter = s.pongs.pop(line.arg(-1), None)
            if waiter is not None:
                waiter.resolve("pong")
        elif cmd == "PRIVMSG":
            self._on_privmsg(line)
        elif cmd == "NOTICE":
            _answer_services(s, line)
        elif cmd == "JOIN" and self._is_me(s, line.source_nick):
            s.joined = True
        elif cmd in ("PART", "KICK"):
            who = line.source_nick if cmd == "PART" else line.arg(1)
            if self._is_me(s, who) and casefold(line.arg(0)) == casefold(self._cfg.channel):
                s.joined = False
                if cmd == "KICK":
                    return await self._send(
                        s, render("JOIN", self._cfg.channel), self._cfg.pong_timeout_s
                    )
        elif cmd == "CAP":
            sub = line.arg(1).upper()
            if sub == "DEL":
                s.caps = s.caps - set(line.arg(-1).split())
        elif cmd == "ERROR":
            self._drop(s, "server_error", line.arg(-1))
            return False
        return True

    def _on_privmsg(self, line: Line) -> None:
        """A PRIVMSG to a channel is counted and handed on; any other is passed over."""
        target = line.arg(0)
        if target[:1] in ("#", "&"):
            self.counters["channel_messages"] += 1
            self._on_message(
                ChannelMessage(
                    channel=target,
                    sender=line.source_nick or "",
                    text=line.arg(1) if len(line.params) > 1 else "",
                    time=line.tags.get("time") or _now_iso(),
                )
            )

    async def _keepalive(self, s: _Session) -> None:
        cfg = self._cfg
        while True:
            # Re-read the mark after every sleep: inbound traffic moves it while we sleep.
            idle_for = time.monotonic() - s.idle_mark
            if idle_for < cfg.keepalive_idle_s:
                await trio.sleep(cfg.keepalive_idle_s - idle_for)
                continue
            token = f"keepalive-{s.number}-{next(self._tokens)}"
            waiter = _Waiter()
            s.pongs[token] = waiter
            sent_at = time.monotonic()
            inbound_age = sent_at - s.last_inbound
            deadline = trio.current_time() + cfg.pong_timeout_s
            if await self._send(s, render("PING", token), cfg.pong_timeout_s):
                with trio.move_on_at(deadline):
                    await waiter.event.wait()
            s.pongs.pop(token, None)
            if waiter.outcome == "pong":
                continue
            if s.down_reason is None:
                now = time.monotonic()
                self._record(
                    "pong_timeout",
                    session=s.number,
                    idle_s=cfg.keepalive_idle_s,
                    pong_timeout_s=cfg.pong_timeout_s,
                    waited_ms=_ms(now - sent_at),
                    last_inbound_age_ms=_ms(now - s.last_inbound),
                    inbound_age_at_ping_ms=_ms(inbound_age),
                )
                self._drop(s, "pong_timeout", f"no PONG within {cfg.pong_timeout_s:g} s")
            return

    # ------------------------------------------------------------------ tools

    def _ready_session(self) -> _Session | None:
        s = self._session
        return s if s is not None and s.ready else None

    async def post(self, text: str) -> PostResult:
        """Post *text* (one PRIVMSG per non-blank line) to the channel and confirm it.

        Returns within ``BOT_CONFIRM_BUDGET_S`` (plus scheduling) whatever the link does.
        ValueError for text that cannot be posted (empty, or a line too long).
        """
        cfg = self._cfg
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise ValueError("text is empty")
        for ln in lines:
            if "\0" in ln:
                raise ValueError("text contains a NUL character")
            if len(ln.encode()) > MAX_TEXT_BYTES:
                raise ValueError(f"a line is longer than {MAX_TEXT_BYTES} bytes; split it")
        chan, n, budget = cfg.channel, len(lines), cfg.confirm_budget_s
        t0 = time.monotonic()
        s = self._ready_session()
        if s is None:
            return self._posted(
                "not_connected",
                t0,
                n,
                f"UNCONFIRMED: not connected to the enclave (reconnecting); "
                f"nothing was sent to {chan}",
                None,
            )
        payload = b"".join(render("PRIVMSG", chan, ln) for ln in lines)
        if cfg.has("no-confirm"):
            if await self._send(s, payload, budget):
                return self._posted("skipped", t0, n, f"Broadcast to {chan} ({_plural(n)})", s)
            return self._posted(
                "unconfirmed",
                t0,
                n,
                f"UNCONFIRMED: the write to {chan} failed ({s.down_detail}); "
                "the message was not delivered",
                s,
            )
        token = f"confirm-{s.number}-{next(self._tokens)}"
        waiter = _Waiter()
        s.pongs[token] = waiter
        # One deadline for write + confirmation. The write has its own bound (a stalled
        # write drops the link, see _send) so it is never cut off half-way from outside.
        deadline = trio.current_time() + budget
        sent = False
        try:
            sent = await self._send(s, payload + render("PING", token), budget)
            if sent and cfg.has("stall-loop-on-confirm"):
                # The defect: block the whole event loop (nothing is read meanwhile).
                time.sleep(0.6 * budget)  # noqa: ASYNC251
            if sent:
                with trio.move_on_at(deadline):
                    await waiter.event.wait()
        finally:
            s.pongs.pop(token, None)
        # A PONG that arrived past the deadline (e.g. while a slow write was still being
        # finished) is late, not a confirmation within the budget.
        if waiter.outcome == "pong" and waiter.at <= deadline:
            ms = (time.monotonic() - t0) * 1000
            return self._posted(
                "confirmed",
                t0,
                n,
                f"Broadcast to {chan} ({_plural(n)}); confirmed by the server in {ms:.0f} ms",
                s,
            )
        if waiter.outcome == "link_down" or (not sent and s.down_reason is not None):
            why = f"the link dropped ({s.down_reason}) before the server confirmed it"
        else:
            why = f"the server did not confirm it within {budget:g} s"
        return self._posted(
            "unconfirmed",
            t0,
            n,
            f"UNCONFIRMED: {_plural(n)} written toward {chan} but {why}; "
            "it may not have been delivered",
            s,
        )

    def _posted(self, outcome: str, t0: float, n: int, text: str, s: _Session | None) -> PostResult:
        elapsed_ms = _ms(time.monotonic() - t0)
        result = "unconfirmed" if outcome == "not_connected" else outcome
        self.counters[f"post_{outcome}"] += 1
        self._events.emit(
            "post_confirm",
            result=result,
            elapsed_ms=elapsed_ms,
            lines=n,
            session=s.number if s is not None else None,
            connected=outcome != "not_connected",
        )
        return PostResult(outcome, text, elapsed_ms, n)

    async def service(self, verb: str, nick: str, *args: str) -> ServiceReply:
        """Send ``VERB nick args`` to EnclaveServ and wait for its NOTICE about *nick*.

        Bounded by ``BOT_SERVICE_TIMEOUT_S``. Only a leader's token may spawn/revoke;
        the server says so with ``ERROR ... NOT_ALLOWED``.
        """
        verb = verb.upper()
        if verb not in ("SPAWN", "REVOKE") or not nick or " " in nick:
            raise ValueError(f"bad service request {verb} {nick!r}")
        s = self._ready_session()
        if s is None:
            return ServiceReply(False, "not connected to the enclave (reconnecting); try again")
        key = casefold(nick)
        done = "SPAWNED" if verb == "SPAWN" else "REVOKED"

        def match(line: Line) -> ServiceReply | None:
            src = line.source or ""
            if "!" in src and casefold(line.source_nick or "") != casefold(SERVICE_NICK):
                return None  # a NOTICE from some user, not the service
            words = line.arg(-1).split(" ")
            if len(words) >= 2 and words[0] == done and casefold(words[1]) == key:
                fields = {"nick": words[1]}
                if verb == "SPAWN" and len(words) >= 4:
                    fields.update(token=words[2], expires=words[3])
                return ServiceReply(True, line.arg(-1), fields)
            if (
                len(words) >= 4
                and words[0] == "ERROR"
                and words[1].upper() == verb
                and casefold(words[2]) == key
            ):
                human = line.arg(-1).split(" :", 1)[1] if " :" in line.arg(-1) else ""
                return ServiceReply(False, line.arg(-1), {"code": words[3], "message": human})
            return None

        waiter = _Waiter()
        entry = (match, waiter)
        s.services.append(entry)
        timeout = self._cfg.service_timeout_s
        deadline = trio.current_time() + timeout
        try:
            request = " ".join([verb, nick, *args])
            if await self._send(s, render("PRIVMSG", SERVICE_NICK, request), timeout):
                with trio.move_on_at(deadline):
                    await waiter.event.wait()
        finally:
            if entry in s.services:
                s.services.remove(entry)
        if waiter.outcome == "reply":
            reply: ServiceReply = waiter.value
            return reply
        if waiter.outcome == "link_down" or s.down_reason is not None:
            return ServiceReply(False, f"the link dropped before {SERVICE_NICK} answered")
        return ServiceReply(False, f"{SERVICE_NICK} did not answer within {timeout:g} s")

    def status(self) -> dict[str, Any]:
        """A snapshot of the link, for the status tool. Only the live session's view."""
        cfg = self._cfg
        s = self._session
        now = time.monotonic()
        live = s is not None and s.ready
        return {
            "nick": cfg.nick,
            "channel": cfg.channel,
            "server": f"{cfg.host}:{cfg.port}",
            "connected": live,
            "session": s.number if live and s else None,
            "joined": bool(live and s and s.joined),
            "auth": s.auth if live and s else None,
            "caps": sorted(s.caps) if live and s else [],
            "connected_for_s": round(now - (s.ready_mono or now), 3) if live and s else None,
            "last_inbound_age_s": round(now - s.last_inbound, 3) if live and s else None,
            "down_for_s": round(now - self._down_since, 3) if self._down_since else None,
            "reconnects": max(self._registered - 1, 0),
            "defects": sorted(cfg.defects),
            "timings": {
                "keepalive_idle_s": cfg.keepalive_idle_s,
                "pong_timeout_s": cfg.pong_timeout_s,
                "confirm_budget_s": cfg.confirm_budget_s,
                "reconnect_base_s": cfg.reconnect_base_s,
                "reconnect_max_s": cfg.reconnect_max_s,
            },
            "counters": dict(self.counters),
            "pid": os.getpid(),
        }
