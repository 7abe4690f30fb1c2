"""The enclave's IRC command engine: lines in, lines and events out, no I/O.

:class:`Engine` holds every connection's protocol state (a :class:`Session`: nick,
capabilities, authentication, channels), the nick table and the channels, and turns one
received line into what follows from it: :class:`Send` (a line for a connection),
:class:`Close` (end a connection, after its queued lines or at once) and :class:`Event`
(a record for the event log), in order. It reads no socket, no clock it was not given,
and writes nothing; the bot registry it consults is handed in (:class:`Credentials`).
:class:`~harness.enclave._server.EnclaveServer` is the shell: sockets, send queues,
flood control, keepalive and the clock of deadlines.

The rules (each test in ``tests/harness/enclave/test_engine.py`` is a row of lines in and
lines out): the semantics in :mod:`harness.enclave._server`'s docstring that are about
commands (registration, authentication, ghosts, revocation, relay) live here.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, Unpack

from drivers.irc import IrcLine, LineTooLong, casefold, format_line, parse_line
from harness.enclave._registry import SERVICE_NICK, BotRecord, RegistryError, valid_nick

__all__ = [
    "SERVER_NAME",
    "Close",
    "Closing",
    "Credentials",
    "Engine",
    "Event",
    "Output",
    "Send",
    "Session",
    "parse_duration",
]

SERVER_NAME = "enclave"
SERVER_VERSION = "enclave-1"
SUPPORTED_CAPS = ("sasl", "echo-message", "message-tags", "server-time")
#: Commands allowed before registration completes.
_PRE_REGISTRATION = {"CAP", "AUTHENTICATE", "PASS", "NICK", "USER", "PING", "PONG", "QUIT"}
_CHANNEL_RE = re.compile(r"^[#&][^\x00\x07\r\n ,:]{1,49}$")
_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([smhd]?)$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: SASL (IRCv3): a client sends base64 in chunks of at most 400 bytes.
_SASL_CHUNK = 400
_SASL_MAX = 8192
#: A message names at most this many targets (``PRIVMSG a,b,c``); the rest are ignored.
_MAX_TARGETS = 8


def parse_duration(text: str) -> float:
    """``"30"``, ``"1.5"``, ``"1e3"``, ``"30s"``, ``"30m"``, ``"2h"``, ``"1d"`` -> seconds.

    Range (positive, finite) is the registry's to check.
    """
    m = _DURATION_RE.match(text.strip().lower())
    if m:
        return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    try:
        return float(text)  # what str(float) prints, e.g. "1e-05"
    except ValueError:
        raise ValueError(f"not a duration: {text!r}") from None


# ---------------------------------------------------------------- what comes out


@dataclass(frozen=True)
class Send:
    """Queue *line* (no CR LF) for connection *conn*."""

    conn: int
    line: str


@dataclass(frozen=True)
class Close:
    """End connection *conn*: after the lines already queued for it (*flush*), or at once."""

    conn: int
    flush: bool = True


@dataclass(frozen=True)
class Event:
    """One event-log record: *name* and its fields."""

    name: str
    fields: dict[str, Any]


Output = Send | Close | Event


class Closing(TypedDict, total=False):
    """How a connection is closed (:meth:`Engine.close`), declared once for the engine
    and the server that passes it on: *error* (default True) queues ``ERROR :Closing
    Link`` first; *flush* (default True) closes after what was queued, else at once;
    *quit_message* (default: the reason) is what its peers see in its QUIT."""

    error: bool
    flush: bool
    quit_message: str | None


class Credentials(Protocol):
    """What the engine asks of the bot registry (:class:`~harness.enclave.Registry`)."""

    def lookup(self, nick: str) -> BotRecord | None: ...

    def authenticate(self, nick: str, token: str) -> tuple[BotRecord | None, str]: ...

    def spawn(self, leader: str, nick: str, expires_in: float) -> tuple[str, int]: ...

    def revoke(self, leader: str, nick: str) -> BotRecord: ...


# ---------------------------------------------------------------- state


@dataclass(eq=False)
class Session:
    """One connection's protocol state. Owned by the engine."""

    id: int
    host: str
    port: int
    nick: str | None = None
    user: str | None = None
    realname: str = ""
    registered: bool = False
    cap_negotiating: bool = False
    cap_version: int = 0
    caps: set[str] = field(default_factory=set)
    password: str | None = None
    account: str | None = None
    bot: BotRecord | None = None
    auth_method: str = "guest"
    sasl_mech: str | None = None
    sasl_buf: str = ""
    channels: set[str] = field(default_factory=set)
    closing: bool = False
    close_reason: str = ""

    @property
    def prefix(self) -> str:
        return f"{self.nick or '*'}!{self.user or 'unknown'}@{self.host}"

    @property
    def key(self) -> str | None:
        return casefold(self.nick) if self.nick else None


@dataclass
class Channel:
    name: str
    members: dict[int, Session] = field(default_factory=dict)


class Engine:
    """Every connection's protocol state, and the commands that change it.

    Feed it with :meth:`connect`, :meth:`receive` (one line, or a LineTooLong) and
    :meth:`close_conn`; each returns the outputs that follow, in order. *clock* is the wall
    clock (token expiry, the ``server-time`` tag, the creation date in 003).
    """

    def __init__(
        self,
        registry: Credentials,
        *,
        clock: Callable[[], float] = time.time,
        started_wall: float | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.started_wall = clock() if started_wall is None else started_wall
        self.sessions: dict[int, Session] = {}
        self.by_nick: dict[str, Session] = {}
        self.channels: dict[str, Channel] = {}
        self._msgids = itertools.count(1)
        self._out: list[Output] = []

    # ---------------------------------------------------------------- entry points

    def connect(self, conn: int, host: str, port: int) -> Session:
        """A new connection *conn* from *host*:*port*."""
        s = self.sessions[conn] = Session(conn, host, port)
        return s

    def receive(self, conn: int, item: str | LineTooLong) -> list[Output]:
        """One line (or an over-long one) from *conn*: what follows from it."""
        c = self.sessions.get(conn)
        if c is not None and not c.closing:
            self._dispatch(c, item)
        return self._take()

    def close_conn(self, conn: int, reason: str, **how: Unpack[Closing]) -> list[Output]:
        """Close *conn* (idempotent): see :meth:`close`."""
        c = self.sessions.get(conn)
        if c is not None:
            self.close(c, reason, **how)
        return self._take()

    def forget(self, conn: int) -> None:
        """*conn* is gone: drop its session (close it first)."""
        self.sessions.pop(conn, None)

    def _take(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    def emit(self, event: str, **fields: Any) -> None:
        self._out.append(Event(event, fields))

    # ---------------------------------------------------------------- output

    def send(self, c: Session, line: str) -> None:
        """Queue one line for *c* (the shell's queue is bounded: see EnclaveServer)."""
        if c.closing:
            return
        self._out.append(Send(c.id, line))

    def reply(self, c: Session, numeric: str, *params: str) -> None:
        self.send(c, format_line(numeric, _target(c), *params, prefix=SERVER_NAME))

    def notice_from_service(self, c: Session, text: str) -> None:
        self.send(
            c,
            format_line(
                "NOTICE", c.nick or "*", text, prefix=f"{SERVICE_NICK}!service@{SERVER_NAME}"
            ),
        )

    def close(self, c: Session, reason: str, **how: Unpack[Closing]) -> None:
        """Start closing *c* (idempotent): queue ``ERROR :Closing Link`` (if *error*),
        leave its channels and tell its peers, then :class:`Close` it (after what was
        queued for it if *flush*, else at once). See :class:`Closing` for the defaults."""
        if c.closing:
            return
        flush = how.get("flush", True)
        if how.get("error", True):
            self.send(c, format_line("ERROR", f"Closing Link: {c.host} ({reason})"))
        c.closing = True
        c.close_reason = reason
        self._detach(c, how.get("quit_message") or reason)
        self._out.append(Close(c.id, flush))

    def _detach(self, c: Session, quit_message: str) -> None:
        if c.registered and c.key is not None and self.by_nick.get(c.key) is c:
            del self.by_nick[c.key]
        peers: dict[int, Session] = {}
        for key in list(c.channels):
            chan = self.channels.get(key)
            if chan is None:
                continue
            chan.members.pop(c.id, None)
            peers.update(chan.members)
            if not chan.members:
                del self.channels[key]
        c.channels.clear()
        if c.registered:
            line = format_line("QUIT", quit_message, prefix=c.prefix)
            for peer in peers.values():
                self.send(peer, line)

    # ---------------------------------------------------------------- dispatch

    def _dispatch(self, c: Session, item: str | LineTooLong) -> None:
        if isinstance(item, LineTooLong):
            self.reply(c, "417", "Input line was too long")
            return
        try:
            msg = parse_line(item)
        except ValueError:
            return
        if not c.registered and msg.command not in _PRE_REGISTRATION:
            self.reply(c, "451", "You have not registered")
            return
        handler = getattr(self, f"_cmd_{msg.command.lower()}", None)
        if handler is None:
            self.reply(c, "421", msg.command, "Unknown command")
            return
        handler(c, msg)

    # ---------------------------------------------------------------- registration

    def _cmd_cap(self, c: Session, msg: IrcLine) -> None:
        sub = msg.param(0).upper()
        target = _target(c)
        if sub == "LS":
            if not c.registered:
                c.cap_negotiating = True
            try:
                c.cap_version = max(c.cap_version, int(msg.param(1, "0")))
            except ValueError:
                pass
            caps = [
                "sasl=PLAIN" if cap == "sasl" and c.cap_version >= 302 else cap
                for cap in SUPPORTED_CAPS
            ]
            self.send(c, format_line("CAP", target, "LS", " ".join(caps), prefix=SERVER_NAME))
        elif sub == "LIST":
            self.send(
                c, format_line("CAP", target, "LIST", " ".join(sorted(c.caps)), prefix=SERVER_NAME)
            )
        elif sub == "REQ":
            if not c.registered:
                c.cap_negotiating = True
            wanted = msg.param(1).split()
            names = [w.lstrip("-") for w in wanted]
            if not wanted or any(n not in SUPPORTED_CAPS for n in names):
                self.send(c, format_line("CAP", target, "NAK", msg.param(1), prefix=SERVER_NAME))
                return
            for w in wanted:
                if w.startswith("-"):
                    c.caps.discard(w[1:])
                else:
                    c.caps.add(w)
            self.send(c, format_line("CAP", target, "ACK", msg.param(1), prefix=SERVER_NAME))
        elif sub == "END":
            c.cap_negotiating = False
            self._try_register(c)
        else:
            self.reply(c, "410", sub or "*", "Invalid CAP command")

    def _cmd_pass(self, c: Session, msg: IrcLine) -> None:
        if c.registered:
            self.reply(c, "462", "You may not reregister")
        elif not msg.params:
            self.reply(c, "461", "PASS", "Not enough parameters")
        else:
            c.password = msg.params[0]

    def _cmd_nick(self, c: Session, msg: IrcLine) -> None:
        new = msg.param(0)
        if not new:
            self.reply(c, "431", "No nickname given")
            return
        if not valid_nick(new) or casefold(new) == casefold(SERVICE_NICK):
            self.reply(c, "432", new, "Erroneous nickname")
            return
        holder = self.by_nick.get(casefold(new))
        if not c.registered:
            # A registered (registry) nick may be taken over by its authenticated owner
            # at registration (ghost replacement); a guest nick in use is refused now.
            if holder is not None and holder is not c and self.registry.lookup(new) is None:
                self.reply(c, "433", new, "Nickname is already in use")
                return
            c.nick = new
            self._try_register(c)
            return
        if c.bot is not None:
            self.reply(c, "432", new, "Authenticated bots keep their nick")
            return
        if holder is not None and holder is not c:
            self.reply(c, "433", new, "Nickname is already in use")
            return
        if self.registry.lookup(new) is not None:
            self.reply(c, "432", new, "Nickname is registered to a bot")
            return
        line = format_line("NICK", new, prefix=c.prefix)
        old_key = c.key
        if old_key is not None:
            self.by_nick.pop(old_key, None)
        c.nick = new
        assert c.key is not None
        self.by_nick[c.key] = c
        peers = {c.id: c}
        for key in c.channels:
            peers.update(self.channels[key].members)
        for peer in peers.values():
            self.send(peer, line)

    def _cmd_user(self, c: Session, msg: IrcLine) -> None:
        if c.registered:
            self.reply(c, "462", "You may not reregister")
            return
        if len(msg.params) < 4 or not msg.params[0]:
            self.reply(c, "461", "USER", "Not enough parameters")
            return
        user = re.sub(r"[^A-Za-z0-9_.~-]", "", msg.params[0])[:10] or "user"
        c.user = user
        c.realname = msg.params[3]
        self._try_register(c)

    def _auth_fail(self, c: Session, reason: str, *, method: str) -> None:
        self.emit("auth_failed", conn=c.id, nick=c.nick, method=method, reason=reason)
        self.reply(c, "464", f"Password incorrect: {reason}")
        self.close(c, f"Bad credentials: {reason}")

    def _authenticate(self, c: Session, nick: str) -> bool:
        """May *c* register as *nick*? A registered bot's nick takes a live SASL
        account of that name or its PASS; a guest's takes no PASS. False once the
        failure is answered and *c* closed; else *c*'s bot and auth method are set."""
        record = self.registry.lookup(nick)
        if c.account is not None and casefold(c.account) != casefold(nick):
            self._auth_fail(c, f"SASL account {c.account} cannot use nick {nick}", method="sasl")
            return False
        if record is None:
            if c.password is not None:
                self._auth_fail(c, f"PASS given for unregistered nick {nick}", method="pass")
                return False
            return True
        if c.account is not None:
            if not record.live(self.clock()):
                reason = "revoked" if record.revoked_at is not None else "expired"
                self._auth_fail(c, reason, method="sasl")
                return False
            c.bot, c.auth_method = record, "sasl"
        elif c.password is not None:
            checked, reason = self.registry.authenticate(nick, c.password)
            if checked is None:
                self._auth_fail(c, reason, method="pass")
                return False
            c.bot, c.auth_method = checked, "pass"
        else:
            self._auth_fail(
                c,
                f"{nick} is a registered bot: authenticate with SASL PLAIN or PASS",
                method="none",
            )
            return False
        return True

    def _try_register(self, c: Session) -> None:
        if c.registered or c.closing or c.cap_negotiating or c.sasl_mech is not None:
            return
        if c.nick is None or c.user is None:
            return
        nick = c.nick
        if not self._authenticate(c, nick):
            return
        key = casefold(nick)
        holder = self.by_nick.get(key)
        if holder is not None and holder is not c:
            if c.bot is None:
                self.reply(c, "433", nick, "Nickname is already in use")
                c.nick = None
                return
            self.emit("ghost_replaced", conn=holder.id, by_conn=c.id, nick=nick)
            self.close(holder, "Ghost replaced by a new authenticated connection")
        c.registered = True
        self.by_nick[key] = c
        self.emit(
            "registered",
            conn=c.id,
            nick=nick,
            auth=c.auth_method,
            role=c.bot.role if c.bot else "guest",
            owner=c.bot.owner if c.bot else None,
            caps=sorted(c.caps),
        )
        created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_wall))
        self.reply(c, "001", f"Welcome to the enclave network, {c.prefix}")
        self.reply(c, "002", f"Your host is {SERVER_NAME}, running version {SERVER_VERSION}")
        self.reply(c, "003", f"This server was created {created}")
        self.reply(c, "004", SERVER_NAME, SERVER_VERSION, "i", "n")
        self.reply(
            c,
            "005",
            "CASEMAPPING=rfc1459",
            "CHANTYPES=#&",
            "NICKLEN=30",
            "CHANNELLEN=50",
            "NETWORK=enclave",
            "are supported by this server",
        )
        self.reply(c, "422", "MOTD File is missing")

    def _cmd_authenticate(self, c: Session, msg: IrcLine) -> None:
        arg = msg.param(0)
        if "sasl" not in c.caps:
            self.reply(c, "904", "SASL authentication failed (request the sasl capability)")
            return
        if c.registered or c.account is not None:
            self.reply(c, "907", "You have already authenticated using SASL")
            return
        if arg == "*":
            c.sasl_mech, c.sasl_buf = None, ""
            self.reply(c, "906", "SASL authentication aborted")
            self._try_register(c)
            return
        if c.sasl_mech is None:
            if arg.upper() != "PLAIN":
                self.reply(c, "908", "PLAIN", "are available SASL mechanisms")
                self.reply(c, "904", "SASL authentication failed")
                return
            c.sasl_mech = "PLAIN"
            self.send(c, format_line("AUTHENTICATE", "+"))
            return
        if len(arg) > _SASL_CHUNK or len(c.sasl_buf) + len(arg) > _SASL_MAX:
            c.sasl_mech, c.sasl_buf = None, ""
            self.reply(c, "905", "SASL message too long")
            return
        if arg != "+":
            c.sasl_buf += arg
        if len(arg) == _SASL_CHUNK:
            return  # more chunks follow (a final "+" if the length was a multiple of 400)
        payload, c.sasl_mech, c.sasl_buf = c.sasl_buf, None, ""
        try:
            parts = base64.b64decode(payload, validate=True).decode("utf-8").split("\0")
        except (binascii.Error, UnicodeDecodeError):
            parts = []
        if len(parts) != 3 or (parts[0] and parts[0] != parts[1]):
            self.emit("auth_failed", conn=c.id, nick=c.nick, method="sasl", reason="malformed")
            self.reply(c, "904", "SASL authentication failed")
            return
        _authzid, authcid, token = parts
        record, reason = self.registry.authenticate(authcid, token)
        if record is None:
            self.emit("auth_failed", conn=c.id, nick=authcid, method="sasl", reason=reason)
            self.reply(c, "904", "SASL authentication failed")
            return
        c.account = record.nick
        self.reply(
            c,
            "900",
            c.prefix,
            record.nick,
            f"You are now logged in as {record.nick}",
        )
        self.reply(c, "903", "SASL authentication successful")
        self._try_register(c)

    # ---------------------------------------------------------------- keepalive, quit

    def _cmd_ping(self, c: Session, msg: IrcLine) -> None:
        if not msg.params or msg.params[0] == "":
            self.reply(c, "409", "No origin specified")
            return
        self.send(c, format_line("PONG", SERVER_NAME, msg.params[0], prefix=SERVER_NAME))

    def _cmd_pong(self, c: Session, msg: IrcLine) -> None:
        pass  # receipt itself (any bytes) already reset the keepalive clock

    def _cmd_quit(self, c: Session, msg: IrcLine) -> None:
        text = msg.param(0)
        reason = f"Quit: {text}" if text else "Quit"
        self.close(c, reason, quit_message=reason)

    # ---------------------------------------------------------------- channels

    def _names(self, c: Session, chan: Channel) -> None:
        names = sorted(m.nick for m in chan.members.values() if m.nick)
        chunk: list[str] = []
        for name in names:
            chunk.append(name)
            if len(" ".join(chunk)) > 380:
                self.reply(c, "353", "=", chan.name, " ".join(chunk))
                chunk = []
        if chunk:
            self.reply(c, "353", "=", chan.name, " ".join(chunk))
        self.reply(c, "366", chan.name, "End of /NAMES list")

    def _cmd_join(self, c: Session, msg: IrcLine) -> None:
        if not msg.params:
            self.reply(c, "461", "JOIN", "Not enough parameters")
            return
        if msg.params[0] == "0":
            for key in list(c.channels):
                self._part(c, self.channels[key], "Left all channels")
            return
        for name in msg.params[0].split(","):
            if not _CHANNEL_RE.match(name):
                self.reply(c, "403", name or "*", "No such channel")
                continue
            key = casefold(name)
            chan = self.channels.get(key)
            if chan is None:
                chan = self.channels[key] = Channel(name)
            if c.id in chan.members:
                continue
            chan.members[c.id] = c
            c.channels.add(key)
            line = format_line("JOIN", chan.name, prefix=c.prefix)
            for member in chan.members.values():
                self.send(member, line)
            self.emit("joined", conn=c.id, nick=c.nick, channel=chan.name)
            self._names(c, chan)

    def _part(self, c: Session, chan: Channel, reason: str | None) -> None:
        params = [chan.name] + ([reason] if reason else [])
        line = format_line("PART", *params, prefix=c.prefix)
        for member in chan.members.values():
            self.send(member, line)
        chan.members.pop(c.id, None)
        key = casefold(chan.name)
        c.channels.discard(key)
        if not chan.members:
            self.channels.pop(key, None)

    def _cmd_part(self, c: Session, msg: IrcLine) -> None:
        if not msg.params:
            self.reply(c, "461", "PART", "Not enough parameters")
            return
        reason = msg.param(1) or None
        for name in msg.params[0].split(","):
            chan = self.channels.get(casefold(name))
            if chan is None:
                self.reply(c, "403", name or "*", "No such channel")
            elif c.id not in chan.members:
                self.reply(c, "442", chan.name, "You're not on that channel")
            else:
                self._part(c, chan, reason)

    def _cmd_names(self, c: Session, msg: IrcLine) -> None:
        for name in msg.param(0).split(",") if msg.params else []:
            chan = self.channels.get(casefold(name))
            if chan is not None:
                self._names(c, chan)
            else:
                self.reply(c, "366", name or "*", "End of /NAMES list")

    def _cmd_who(self, c: Session, msg: IrcLine) -> None:
        mask = msg.param(0, "*")
        chan = self.channels.get(casefold(mask))
        members = list(chan.members.values()) if chan else []
        if chan is None and (peer := self.by_nick.get(casefold(mask))) is not None:
            members = [peer]
        for m in members:
            self.reply(
                c,
                "352",
                chan.name if chan else "*",
                m.user or "unknown",
                m.host,
                SERVER_NAME,
                m.nick or "*",
                "H",
                f"0 {m.realname}",
            )
        self.reply(c, "315", mask, "End of WHO list")

    def _cmd_mode(self, c: Session, msg: IrcLine) -> None:
        target = msg.param(0)
        if not target:
            self.reply(c, "461", "MODE", "Not enough parameters")
            return
        chan = self.channels.get(casefold(target))
        if chan is not None:
            if len(msg.params) > 1 and msg.params[1] not in ("b", "+b"):
                self.reply(c, "482", chan.name, "You're not channel operator")
            elif len(msg.params) > 1:
                self.reply(c, "368", chan.name, "End of channel ban list")
            else:
                self.reply(c, "324", chan.name, "+n")
        elif c.nick is not None and casefold(target) == c.key:
            self.reply(c, "221", "+")
        elif target.startswith(("#", "&")):
            self.reply(c, "403", target, "No such channel")
        else:
            self.reply(c, "502", "Can't change mode for other users")

    def _cmd_motd(self, c: Session, msg: IrcLine) -> None:
        self.reply(c, "422", "MOTD File is missing")

    # ---------------------------------------------------------------- messages

    def _cmd_privmsg(self, c: Session, msg: IrcLine) -> None:
        self._message(c, msg, "PRIVMSG")

    def _cmd_notice(self, c: Session, msg: IrcLine) -> None:
        self._message(c, msg, "NOTICE")

    def _cmd_tagmsg(self, c: Session, msg: IrcLine) -> None:
        self._message(c, msg, "TAGMSG")

    def _message(self, c: Session, msg: IrcLine, command: str) -> None:
        errors = command != "NOTICE"  # RFC: a NOTICE never provokes an automatic reply
        if not msg.params or not msg.params[0]:
            if errors:
                self.reply(c, "411", f"No recipient given ({command})")
            return
        text = msg.param(1) if command != "TAGMSG" else None
        if command != "TAGMSG" and not text:
            if errors:
                self.reply(c, "412", "No text to send")
            return
        client_tags = {k: v for k, v in msg.tags.items() if k.startswith("+")}
        msgid = f"enc-{next(self._msgids)}"
        now = self.clock()  # one reading for both parts, so the stamp cannot go backwards
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        stamp += f".{int(now * 1000) % 1000:03d}Z"
        for target in msg.params[0].split(",")[:_MAX_TARGETS]:
            if casefold(target) == casefold(SERVICE_NICK):
                if command == "PRIVMSG" and text is not None:
                    self._service(c, text)
                found: tuple[str, list[Session]] | None = (target, [])
            else:
                found = self._recipients(c, target, errors)
            if found is None:
                continue
            name, recipients = found
            if "echo-message" in c.caps:
                recipients.append(c)
            params = [name] if text is None else [name, text]
            tags = {**client_tags, "msgid": msgid}
            plain = format_line(command, *params, prefix=c.prefix)
            for r in recipients:
                self._relay(r, plain, command, params, c.prefix, tags, stamp)

    def _recipients(
        self, c: Session, target: str, errors: bool
    ) -> tuple[str, list[Session]] | None:
        """Who a message from *c* to *target* (a channel or a nick) reaches, and the
        target's canonical name; None (with the numeric, if *errors*) if nobody."""
        key = casefold(target)
        if target.startswith(("#", "&")):
            chan = self.channels.get(key)
            if chan is None:
                if errors:
                    self.reply(c, "403", target, "No such channel")
                return None
            if c.id not in chan.members:
                if errors:
                    self.reply(c, "404", chan.name, "Cannot send to channel")
                return None
            return chan.name, [m for m in chan.members.values() if m is not c]
        peer = self.by_nick.get(key)
        if peer is None:
            if errors:
                self.reply(c, "401", target, "No such nick/channel")
            return None
        return peer.nick or target, [peer] if peer is not c else []

    def _relay(
        self,
        r: Session,
        plain: str,
        command: str,
        params: list[str],
        prefix: str,
        tags: dict[str, str],
        stamp: str,
    ) -> None:
        """Send one relayed message to *r* with the tags its capabilities ask for: the
        client's ``+`` tags and ``msgid`` with message-tags (a TAGMSG only then), the
        time with server-time."""
        has_tags = "message-tags" in r.caps
        if command == "TAGMSG" and not has_tags:
            return
        mine = dict(tags) if has_tags else {}
        if "server-time" in r.caps:
            mine["time"] = stamp
        self.send(r, format_line(command, *params, prefix=prefix, tags=mine) if mine else plain)

    # ---------------------------------------------------------------- EnclaveServ

    def _service(self, c: Session, text: str) -> None:
        """``SPAWN <nick> <expires-in>``, ``REVOKE <nick>``, ``HELP`` (see package docs).
        A refusal (a RegistryError, the registry's or the request's own) is answered
        ``ERROR <verb> <nick> <CODE> :<text>`` and emitted as ``service_error``."""
        words = text.split()
        verb = words[0].upper() if words else "*"
        target = words[1] if len(words) > 1 else "*"
        if verb == "HELP":
            for line in (
                "SPAWN <nick> <expires-in-seconds> -> SPAWNED <nick> <token> <expires-unix>",
                "REVOKE <nick> -> REVOKED <nick>",
                "errors: ERROR <SPAWN|REVOKE> <nick> <CODE> :<text>",
            ):
                self.notice_from_service(c, line)
            return
        try:
            if verb not in ("SPAWN", "REVOKE"):
                raise RegistryError("BAD_REQUEST", "unknown command; use SPAWN, REVOKE or HELP")
            if c.bot is None or c.bot.role != "leader":
                raise RegistryError(
                    "NOT_ALLOWED", "only an authenticated leader may spawn or revoke"
                )
            if verb == "SPAWN":
                self._spawn(c, c.bot, words, target)
            else:
                self._revoke(c, c.bot, words, target)
        except RegistryError as exc:
            self.emit(
                "service_error", conn=c.id, nick=c.nick, verb=verb, target=target, code=exc.code
            )
            self.notice_from_service(c, f"ERROR {verb} {target} {exc.code} :{exc.text}")

    def _spawn(self, c: Session, leader: BotRecord, words: list[str], target: str) -> None:
        if len(words) != 3:
            raise RegistryError("BAD_REQUEST", "usage: SPAWN <nick> <expires-in-seconds>")
        try:
            expires_in = parse_duration(words[2])
        except ValueError:
            raise RegistryError(
                "BAD_REQUEST", f"expires-in {words[2]!r} is not a number of seconds"
            ) from None
        holder = self.by_nick.get(casefold(target))
        if holder is not None and valid_nick(target):
            raise RegistryError("NAME_TAKEN", f"{holder.nick} is in use on the server")
        token, expires_at = self.registry.spawn(leader.nick, target, expires_in)
        self.emit("spawned", conn=c.id, leader=c.nick, nick=target, expires_at=expires_at)
        self.notice_from_service(c, f"SPAWNED {target} {token} {expires_at}")

    def _revoke(self, c: Session, leader: BotRecord, words: list[str], target: str) -> None:
        if len(words) != 2:
            raise RegistryError("BAD_REQUEST", "usage: REVOKE <nick>")
        record = self.registry.revoke(leader.nick, target)
        live = self.by_nick.get(casefold(target))
        self.emit("revoked", conn=c.id, leader=c.nick, nick=record.nick, live=live is not None)
        self.notice_from_service(c, f"REVOKED {record.nick}")
        for other in list(self.sessions.values()):
            # Every connection authenticated as that bot, registered or still registering.
            if other.bot is not None and casefold(other.bot.nick) == casefold(record.nick):
                self.close(other, "Revoked")
            elif other.account is not None and casefold(other.account) == casefold(record.nick):
                self.close(other, "Revoked")


def _target(c: Session) -> str:
    """The first parameter of a numeric or CAP reply: ``*`` until registered."""
    return c.nick if c.registered and c.nick else "*"
