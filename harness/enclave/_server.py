"""The enclave IRC server (trio): connections, registration, channels, relay, keepalive.

Semantics that other code relies on:

* **One client's lines are processed strictly in order**, each to completion before the
  next is read: a command never awaits another client. Replies and relays are queued on
  the recipients' send queues in that order, so ``PRIVMSG ...`` followed by ``PING tok``
  yields a ``PONG ... :tok`` only after the PRIVMSG has been relayed to every recipient's
  queue (the server consumed it). Delivery to a recipient whose link is dead is, of
  course, not implied.
* **Send queues are bounded** (``sendq`` lines). A client whose queue overflows is
  dropped ("SendQ exceeded") instead of stalling the server or other clients.
* **Flood control is per sender** (:mod:`harness.enclave._flood`): past a burst, a
  client's lines are read at ``flood.rate`` per second at most; the rest waits unread
  (backpressure), and a client held back ``flood.limit_s`` in all is dropped
  ("Excess Flood"). So a flooder slows itself down; its audience, reading at
  any ordinary speed, is never dropped for SendQ on its account.
* **Keepalive**: any bytes received from a client count as activity. After
  ``ping_interval`` seconds without any, the server sends ``PING :<token>``; if nothing
  at all arrives within ``ping_timeout`` more, the client is dropped with
  ``ERROR :Closing Link: ... (Ping timeout: N seconds)``. The same bound
  (interval + timeout) applies to finishing registration.
* **Closing** a client queues ``ERROR :Closing Link`` after whatever was already queued
  and closes the socket once that is written, or after ``close_grace`` seconds if the
  peer does not take the bytes (a frozen peer cannot hold a connection open).
* **Authentication**: a nick that has a registry row can only be used with its valid,
  unexpired, unrevoked token (SASL PLAIN with authcid = nick, or ``PASS <token>``);
  otherwise registration fails with 464 and the connection is closed. Other nicks are
  guests. A client that presents credentials must present valid ones.
* **Ghosts**: when a bot registers with valid credentials while an older connection
  still holds its nick (a link that died without a close), the older connection is
  closed ("Ghost replaced") and the new one takes the nick. A guest gets 433 instead.
* **Revocation and expiry act on live connections**: revoking a bot closes its
  connection ("Revoked"); a bot whose token expires is closed at that moment
  ("Token expired").
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import math
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drivers.irc import (
    IrcLine,
    LineBuffer,
    LineTooLong,
    casefold,
    encode,
    format_line,
    parse_line,
)
from faultnet.addresses import is_loopback
from harness.enclave._events import EventSink, make_record, stderr_sink
from harness.enclave._flood import ExcessFlood, FloodBucket, FloodLimits
from harness.enclave._registry import (
    SERVICE_NICK,
    BotRecord,
    Registry,
    RegistryError,
    valid_nick,
)

__all__ = ["EnclaveServer", "ServerConfig", "open_server"]

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


@dataclass
class ServerConfig:
    """How to run a server. Times are seconds (floats allowed)."""

    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    ping_interval: float = 90.0
    ping_timeout: float = 60.0
    #: Lines queued for one client before it is dropped as too slow.
    sendq: int = 4096
    #: Per-client flood control (harness.enclave._flood).
    flood: FloodLimits = field(default_factory=FloodLimits)
    #: How long a closing client gets to take its final bytes.
    close_grace: float = 2.0
    port_file: Path | None = None


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


@dataclass(eq=False)
class Client:
    """One connection's state. Owned by the server; mutated only from the trio loop."""

    id: int
    stream: trio.SocketStream
    host: str
    port: int
    out_send: trio.MemorySendChannel[bytes | None]
    out_recv: trio.MemoryReceiveChannel[bytes | None]
    flood: FloodBucket
    accepted_at: float
    last_rx: float
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
    ping_sent_at: float | None = None
    ping_token: str | None = None
    scope: trio.CancelScope | None = None
    #: Set to make the watchdog recompute its deadlines (e.g. after registration).
    poke: trio.Event = field(default_factory=trio.Event)
    closing: bool = False
    close_reason: str = ""
    rx_lines: int = 0
    tx_lines: int = 0

    @property
    def prefix(self) -> str:
        return f"{self.nick or '*'}!{self.user or 'unknown'}@{self.host}"

    @property
    def key(self) -> str | None:
        return casefold(self.nick) if self.nick else None


@dataclass
class Channel:
    name: str
    members: dict[int, Client] = field(default_factory=dict)


class EnclaveServer:
    """A running (or ready-to-run) server. Use :meth:`serve` or :func:`open_server`."""

    def __init__(self, config: ServerConfig, *, events: EventSink | None = None) -> None:
        self.config = config
        self.registry = Registry(config.state_dir)
        self._emit_sink: EventSink = events or stderr_sink
        self._ids = itertools.count(1)
        self._msgids = itertools.count(1)
        self._ping_ids = itertools.count(1)
        self.clients: dict[int, Client] = {}
        self.by_nick: dict[str, Client] = {}
        self.channels: dict[str, Channel] = {}
        self.address: tuple[str, int] | None = None
        self.started_wall = time.time()
        #: Set whenever a connection finishes (see close_all).
        self._gone = trio.Event()

    # ---------------------------------------------------------------- lifecycle

    def emit(self, event: str, **fields: Any) -> None:
        self._emit_sink(make_record(event, **fields))

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled. ``task_status.started((host, port))``."""
        host = self.config.host
        if not is_loopback(host):
            raise ValueError(f"refusing to listen on non-loopback host {host!r}")
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            await sock.bind((host, self.config.port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        listener = trio.SocketListener(sock)
        bound = sock.getsockname()
        self.address = (bound[0], bound[1])
        if self.config.port_file is not None:
            _write_atomic(self.config.port_file, f"{self.address[1]}\n")
        self.emit(
            "listening",
            host=self.address[0],
            port=self.address[1],
            pid=os.getpid(),
            ping_interval=self.config.ping_interval,
            ping_timeout=self.config.ping_timeout,
            flood=dataclasses.asdict(self.config.flood),
        )
        task_status.started(self.address)
        try:
            await trio.serve_listeners(self._handle, [listener])
        finally:
            self.emit("stopped", clients=len(self.clients))

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            peer = stream.socket.getpeername()
        except OSError:
            await trio.aclose_forcefully(stream)
            return
        cfg = self.config
        send, recv = trio.open_memory_channel[bytes | None](cfg.sendq)
        now = trio.current_time()
        c = Client(
            id=next(self._ids),
            stream=stream,
            host=str(peer[0]),
            port=int(peer[1]),
            out_send=send,
            out_recv=recv,
            flood=FloodBucket(cfg.flood),
            accepted_at=now,
            last_rx=now,
        )
        self.clients[c.id] = c
        self.emit("accepted", conn=c.id, peer=f"{c.host}:{c.port}")
        try:
            async with trio.open_nursery() as nursery:
                c.scope = nursery.cancel_scope
                nursery.start_soon(self._writer, c)
                nursery.start_soon(self._watchdog, c)
                await self._reader(c)
        finally:
            self.close(c, c.close_reason or "Connection closed", error=False)
            self.clients.pop(c.id, None)
            self._gone.set()
            self.emit(
                "closed",
                conn=c.id,
                nick=c.nick,
                reason=c.close_reason,
                rx_lines=c.rx_lines,
                tx_lines=c.tx_lines,
            )
            await trio.aclose_forcefully(stream)

    async def _reader(self, c: Client) -> None:
        buf = LineBuffer()
        while not c.closing:
            try:
                data = await c.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close(c, f"Read error: {exc.__cause__ or exc}", error=False)
                return
            if not data:
                self.close(c, "Remote host closed the connection")
                return
            c.last_rx = trio.current_time()
            c.ping_sent_at = None
            for item in buf.feed(data):
                try:
                    if await c.flood.take():
                        # Lines are waiting on it: a held-back client is not an idle one.
                        c.last_rx, c.ping_sent_at = trio.current_time(), None
                except ExcessFlood:
                    self.emit(
                        "excess_flood",
                        conn=c.id,
                        nick=c.nick,
                        rx_lines=c.rx_lines,
                        held_s=round(c.flood.held_s, 3),
                    )
                    self.close(c, "Excess Flood")
                    return
                if c.closing:
                    return
                c.rx_lines += 1
                self._dispatch(c, item)
        # close() was called (QUIT, revoke, ...): the writer ends the connection.
        await trio.sleep_forever()

    async def _writer(self, c: Client) -> None:
        assert c.scope is not None
        try:
            while True:
                item = await c.out_recv.receive()
                batch = bytearray()
                done = item is None
                if item is not None:
                    batch += item
                # Coalesce what is already queued into one send: fewer syscalls, same order.
                while not done and len(batch) < 65536:
                    try:
                        more = c.out_recv.receive_nowait()
                    except trio.WouldBlock:
                        break
                    if more is None:
                        done = True
                    else:
                        batch += more
                if batch:
                    await c.stream.send_all(bytes(batch))
                if done:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.close(c, f"Write error: {exc.__cause__ or exc}", error=False)
        finally:
            c.scope.cancel()

    async def _watchdog(self, c: Client) -> None:
        cfg = self.config
        while not c.closing:
            now = trio.current_time()
            wake = math.inf
            if not c.registered:
                reg_deadline = c.accepted_at + cfg.ping_interval + cfg.ping_timeout
                if now >= reg_deadline:
                    self.close(c, "Registration timeout")
                    return
                wake = min(wake, reg_deadline)
            if c.ping_sent_at is not None:
                dead_at = c.ping_sent_at + cfg.ping_timeout
                if now >= dead_at:
                    idle = now - c.last_rx
                    self.emit("ping_timeout", conn=c.id, nick=c.nick, idle_s=round(idle, 3))
                    self.close(c, f"Ping timeout: {idle:.0f} seconds")
                    return
                wake = min(wake, dead_at)
            else:
                ping_at = c.last_rx + cfg.ping_interval
                if now >= ping_at:
                    c.ping_token = f"enclave-{next(self._ping_ids)}"
                    c.ping_sent_at = now
                    self.send(c, format_line("PING", c.ping_token))
                    self.emit("ping_sent", conn=c.id, nick=c.nick, token=c.ping_token)
                    continue
                wake = min(wake, ping_at)
            if c.bot is not None and c.bot.expires_at is not None:
                left = c.bot.expires_at - time.time()
                if left <= 0:
                    self.emit("expired", conn=c.id, nick=c.nick, expires_at=c.bot.expires_at)
                    self.close(c, "Token expired")
                    return
                wake = min(wake, now + left)
            # Sleep until the earliest deadline, or until registration changes them.
            with trio.move_on_at(wake):
                await c.poke.wait()
            c.poke = trio.Event()

    async def close_all(self, reason: str) -> None:
        """Close every client with ``ERROR :Closing Link: ... (reason)`` and wait, at
        most ``close_grace`` seconds, until all are gone. New connections are still
        accepted meanwhile; cancel :meth:`serve` afterwards to stop."""
        for c in list(self.clients.values()):
            self.close(c, reason)
        with trio.move_on_after(self.config.close_grace):
            while self.clients:
                await self._gone.wait()
                self._gone = trio.Event()

    # ---------------------------------------------------------------- output

    def send(self, c: Client, line: str) -> None:
        """Queue one line for *c* (never blocks). Overflow drops the client."""
        if c.closing:
            return
        try:
            c.out_send.send_nowait(encode(line) + b"\r\n")
            c.tx_lines += 1
        except trio.WouldBlock:
            self.close(c, "SendQ exceeded", error=False, flush=False)
        except trio.ClosedResourceError:
            pass

    def reply(self, c: Client, numeric: str, *params: str) -> None:
        self.send(c, format_line(numeric, _target(c), *params, prefix=SERVER_NAME))

    def notice_from_service(self, c: Client, text: str) -> None:
        self.send(
            c,
            format_line(
                "NOTICE", c.nick or "*", text, prefix=f"{SERVICE_NICK}!service@{SERVER_NAME}"
            ),
        )

    def close(
        self,
        c: Client,
        reason: str,
        *,
        error: bool = True,
        flush: bool = True,
        quit_message: str | None = None,
    ) -> None:
        """Start closing *c* (idempotent, never blocks): leave channels, tell peers,
        queue ``ERROR :Closing Link`` (if *error*), then let the writer finish."""
        if c.closing:
            return
        if error:
            self.send(c, format_line("ERROR", f"Closing Link: {c.host} ({reason})"))
            if c.closing:  # that send overflowed the queue and closed c already
                return
        c.closing = True
        c.close_reason = reason
        self._detach(c, quit_message or reason)
        if c.scope is None:
            return
        if not flush:
            c.scope.cancel()
            return
        try:
            c.out_send.send_nowait(None)
        except (trio.WouldBlock, trio.ClosedResourceError):
            c.scope.cancel()
            return
        c.scope.deadline = min(c.scope.deadline, trio.current_time() + self.config.close_grace)

    def _detach(self, c: Client, quit_message: str) -> None:
        if c.registered and c.key is not None and self.by_nick.get(c.key) is c:
            del self.by_nick[c.key]
        peers: dict[int, Client] = {}
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

    def _dispatch(self, c: Client, item: str | LineTooLong) -> None:
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

    def _cmd_cap(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_pass(self, c: Client, msg: IrcLine) -> None:
        if c.registered:
            self.reply(c, "462", "You may not reregister")
        elif not msg.params:
            self.reply(c, "461", "PASS", "Not enough parameters")
        else:
            c.password = msg.params[0]

    def _cmd_nick(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_user(self, c: Client, msg: IrcLine) -> None:
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

    def _auth_fail(self, c: Client, reason: str, *, method: str) -> None:
        self.emit("auth_failed", conn=c.id, nick=c.nick, method=method, reason=reason)
        self.reply(c, "464", f"Password incorrect: {reason}")
        self.close(c, f"Bad credentials: {reason}")

    def _try_register(self, c: Client) -> None:
        if c.registered or c.closing or c.cap_negotiating or c.sasl_mech is not None:
            return
        if c.nick is None or c.user is None:
            return
        nick = c.nick
        record = self.registry.lookup(nick)
        if c.account is not None and casefold(c.account) != casefold(nick):
            self._auth_fail(c, f"SASL account {c.account} cannot use nick {nick}", method="sasl")
            return
        if record is not None:
            if c.account is not None:
                if not record.live(time.time()):
                    reason = "revoked" if record.revoked_at is not None else "expired"
                    self._auth_fail(c, reason, method="sasl")
                    return
                c.bot, c.auth_method = record, "sasl"
            elif c.password is not None:
                checked, reason = self.registry.authenticate(nick, c.password)
                if checked is None:
                    self._auth_fail(c, reason, method="pass")
                    return
                c.bot, c.auth_method = checked, "pass"
            else:
                self._auth_fail(
                    c,
                    f"{nick} is a registered bot: authenticate with SASL PLAIN or PASS",
                    method="none",
                )
                return
        elif c.password is not None:
            self._auth_fail(c, f"PASS given for unregistered nick {nick}", method="pass")
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
        c.poke.set()
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

    def _cmd_authenticate(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_ping(self, c: Client, msg: IrcLine) -> None:
        if not msg.params or msg.params[0] == "":
            self.reply(c, "409", "No origin specified")
            return
        self.send(c, format_line("PONG", SERVER_NAME, msg.params[0], prefix=SERVER_NAME))

    def _cmd_pong(self, c: Client, msg: IrcLine) -> None:
        pass  # receipt itself (any bytes) already reset the keepalive clock

    def _cmd_quit(self, c: Client, msg: IrcLine) -> None:
        text = msg.param(0)
        reason = f"Quit: {text}" if text else "Quit"
        self.close(c, reason, quit_message=reason)

    # ---------------------------------------------------------------- channels

    def _names(self, c: Client, chan: Channel) -> None:
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

    def _cmd_join(self, c: Client, msg: IrcLine) -> None:
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

    def _part(self, c: Client, chan: Channel, reason: str | None) -> None:
        params = [chan.name] + ([reason] if reason else [])
        line = format_line("PART", *params, prefix=c.prefix)
        for member in chan.members.values():
            self.send(member, line)
        chan.members.pop(c.id, None)
        key = casefold(chan.name)
        c.channels.discard(key)
        if not chan.members:
            self.channels.pop(key, None)

    def _cmd_part(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_names(self, c: Client, msg: IrcLine) -> None:
        for name in msg.param(0).split(",") if msg.params else []:
            chan = self.channels.get(casefold(name))
            if chan is not None:
                self._names(c, chan)
            else:
                self.reply(c, "366", name or "*", "End of /NAMES list")

    def _cmd_who(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_mode(self, c: Client, msg: IrcLine) -> None:
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

    def _cmd_motd(self, c: Client, msg: IrcLine) -> None:
        self.reply(c, "422", "MOTD File is missing")

    # ---------------------------------------------------------------- messages

    def _cmd_privmsg(self, c: Client, msg: IrcLine) -> None:
        self._message(c, msg, "PRIVMSG")

    def _cmd_notice(self, c: Client, msg: IrcLine) -> None:
        self._message(c, msg, "NOTICE")

    def _cmd_tagmsg(self, c: Client, msg: IrcLine) -> None:
        self._message(c, msg, "TAGMSG")

    def _message(self, c: Client, msg: IrcLine, command: str) -> None:
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
        now = time.time()  # one reading for both parts, so the stamp cannot go backwards
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        stamp += f".{int(now * 1000) % 1000:03d}Z"
        for target in msg.params[0].split(",")[:8]:
            key = casefold(target)
            if key == casefold(SERVICE_NICK):
                recipients: list[Client] = []
                if command == "PRIVMSG" and text is not None:
                    self._service(c, text)
            elif target.startswith(("#", "&")):
                chan = self.channels.get(key)
                if chan is None:
                    if errors:
                        self.reply(c, "403", target, "No such channel")
                    continue
                if c.id not in chan.members:
                    if errors:
                        self.reply(c, "404", chan.name, "Cannot send to channel")
                    continue
                recipients = [m for m in chan.members.values() if m is not c]
                target = chan.name
            else:
                peer = self.by_nick.get(key)
                if peer is None:
                    if errors:
                        self.reply(c, "401", target, "No such nick/channel")
                    continue
                recipients = [peer] if peer is not c else []
                target = peer.nick or target
            if "echo-message" in c.caps:
                recipients.append(c)
            params = [target] if text is None else [target, text]
            plain = format_line(command, *params, prefix=c.prefix)
            for r in recipients:
                has_tags = "message-tags" in r.caps
                if command == "TAGMSG" and not has_tags:
                    continue
                tags: dict[str, str] = {}
                if has_tags:
                    tags.update(client_tags)
                    tags["msgid"] = msgid
                if "server-time" in r.caps:
                    tags["time"] = stamp
                if tags:
                    self.send(r, format_line(command, *params, prefix=c.prefix, tags=tags))
                else:
                    self.send(r, plain)

    # ---------------------------------------------------------------- EnclaveServ

    def _service(self, c: Client, text: str) -> None:
        """``SPAWN <nick> <expires-in>``, ``REVOKE <nick>``, ``HELP`` (see package docs)."""
        words = text.split()
        verb = words[0].upper() if words else "*"
        target = words[1] if len(words) > 1 else "*"

        def error(code: str, human: str) -> None:
            self.emit("service_error", conn=c.id, nick=c.nick, verb=verb, target=target, code=code)
            self.notice_from_service(c, f"ERROR {verb} {target} {code} :{human}")

        if verb == "HELP":
            for line in (
                "SPAWN <nick> <expires-in-seconds> -> SPAWNED <nick> <token> <expires-unix>",
                "REVOKE <nick> -> REVOKED <nick>",
                "errors: ERROR <SPAWN|REVOKE> <nick> <CODE> :<text>",
            ):
                self.notice_from_service(c, line)
            return
        if verb not in ("SPAWN", "REVOKE"):
            error("BAD_REQUEST", "unknown command; use SPAWN, REVOKE or HELP")
            return
        if c.bot is None or c.bot.role != "leader":
            error("NOT_ALLOWED", "only an authenticated leader may spawn or revoke")
            return
        if verb == "SPAWN":
            if len(words) != 3:
                error("BAD_REQUEST", "usage: SPAWN <nick> <expires-in-seconds>")
                return
            try:
                expires_in = parse_duration(words[2])
            except ValueError:
                error("BAD_REQUEST", f"expires-in {words[2]!r} is not a number of seconds")
                return
            holder = self.by_nick.get(casefold(target))
            if holder is not None and valid_nick(target):
                error("NAME_TAKEN", f"{holder.nick} is in use on the server")
                return
            try:
                token, expires_at = self.registry.spawn(c.bot.nick, target, expires_in)
            except RegistryError as exc:
                error(exc.code, exc.text)
                return
            self.emit("spawned", conn=c.id, leader=c.nick, nick=target, expires_at=expires_at)
            self.notice_from_service(c, f"SPAWNED {target} {token} {expires_at}")
            return
        if len(words) != 2:
            error("BAD_REQUEST", "usage: REVOKE <nick>")
            return
        try:
            record = self.registry.revoke(c.bot.nick, target)
        except RegistryError as exc:
            error(exc.code, exc.text)
            return
        live = self.by_nick.get(casefold(target))
        self.emit("revoked", conn=c.id, leader=c.nick, nick=record.nick, live=live is not None)
        self.notice_from_service(c, f"REVOKED {record.nick}")
        for other in list(self.clients.values()):
            # Every connection authenticated as that bot, registered or still registering.
            if other.bot is not None and casefold(other.bot.nick) == casefold(record.nick):
                self.close(other, "Revoked")
            elif other.account is not None and casefold(other.account) == casefold(record.nick):
                self.close(other, "Revoked")


def _target(c: Client) -> str:
    """The first parameter of a numeric or CAP reply: ``*`` until registered."""
    return c.nick if c.registered and c.nick else "*"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@asynccontextmanager
async def open_server(
    state_dir: str | os.PathLike[str],
    *,
    events: EventSink | None = None,
    **settings: Any,
) -> AsyncIterator[EnclaveServer]:
    """Run a server in the background for the duration of the block.

    *settings* are :class:`ServerConfig` fields (``ping_interval=0.2``,
    ``flood=FloodLimits(rate=0)``, ...). ``server.address`` is the bound ``(host, port)``; the
    registry is ``server.registry``. Leaving the block stops the server and closes every
    client.
    """
    config = ServerConfig(state_dir=Path(state_dir), **settings)
    server = EnclaveServer(config, events=events)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            yield server
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The block's own lone exception comes out as itself, not wrapped in a group.
        if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
            raise group.exceptions[0] from None
        raise
    finally:
        server.registry.close()
