"""The enclave IRC server (trio): the I/O shell around the command engine
(:mod:`harness.enclave._engine`: registration, authentication, channels, relay,
EnclaveServ). This module owns the sockets, the send queues, flood control, keepalive
and closing; the engine owns every rule about what a line means.

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

import dataclasses
import itertools
import math
import os
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

import trio

from drivers.irc import LineBuffer, encode, format_line
from faultnet.addresses import is_loopback
from harness.enclave._engine import Close, Closing, Engine, Event, Output, Send, Session
from harness.enclave._events import EventSink, make_record, stderr_sink
from harness.enclave._flood import ExcessFlood, FloodBucket, FloodLimits
from harness.enclave._registry import Registry

__all__ = ["EnclaveServer", "ServerConfig", "open_server"]


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


@dataclass(eq=False)
class Client:
    """One connection's I/O state; its protocol state is :attr:`session` (the engine's).
    Mutated only from the trio loop."""

    session: Session
    stream: trio.SocketStream
    out_send: trio.MemorySendChannel[bytes | None]
    out_recv: trio.MemoryReceiveChannel[bytes | None]
    flood: FloodBucket
    accepted_at: float
    last_rx: float
    ping_sent_at: float | None = None
    ping_token: str | None = None
    scope: trio.CancelScope | None = None
    #: Set to make the watchdog recompute its deadlines (e.g. after registration).
    poke: trio.Event = field(default_factory=trio.Event)
    #: The engine closed it and the shell has ended (or is ending) its writer.
    ended: bool = False
    rx_lines: int = 0
    tx_lines: int = 0

    @property
    def id(self) -> int:
        return self.session.id

    @property
    def nick(self) -> str | None:
        return self.session.nick

    @property
    def closing(self) -> bool:
        return self.session.closing


class EnclaveServer:
    """A running (or ready-to-run) server. Use :meth:`serve` or :func:`open_server`."""

    def __init__(self, config: ServerConfig, *, events: EventSink | None = None) -> None:
        self.config = config
        self.registry = Registry(config.state_dir)
        self.engine = Engine(self.registry)
        self._emit_sink: EventSink = events or stderr_sink
        self._ids = itertools.count(1)
        self._ping_ids = itertools.count(1)
        self.clients: dict[int, Client] = {}
        self.address: tuple[str, int] | None = None
        self.started_wall = self.engine.started_wall
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
        session = self.engine.connect(next(self._ids), str(peer[0]), int(peer[1]))
        c = Client(
            session=session,
            stream=stream,
            out_send=send,
            out_recv=recv,
            flood=FloodBucket(cfg.flood),
            accepted_at=now,
            last_rx=now,
        )
        self.clients[c.id] = c
        self.emit("accepted", conn=c.id, peer=f"{session.host}:{session.port}")
        try:
            async with trio.open_nursery() as nursery:
                c.scope = nursery.cancel_scope
                nursery.start_soon(self._writer, c)
                nursery.start_soon(self._watchdog, c)
                await self._reader(c)
        finally:
            self.close(c, session.close_reason or "Connection closed", error=False)
            self.clients.pop(c.id, None)
            self.engine.forget(c.id)
            self._gone.set()
            self.emit(
                "closed",
                conn=c.id,
                nick=c.nick,
                reason=session.close_reason,
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
                was_registered = c.session.registered
                self._apply(self.engine.receive(c.id, item))
                if c.session.registered and not was_registered:
                    c.poke.set()  # the watchdog's deadlines change on registration
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
            if not c.session.registered:
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
            bot = c.session.bot
            if bot is not None and bot.expires_at is not None:
                left = bot.expires_at - time.time()
                if left <= 0:
                    self.emit("expired", conn=c.id, nick=c.nick, expires_at=bot.expires_at)
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

    # ---------------------------------------------------------------- the engine's outputs

    def _apply(self, outputs: Iterable[Output]) -> None:
        """Carry out what the engine decided, in its order."""
        for out in outputs:
            if isinstance(out, Send):
                c = self.clients.get(out.conn)
                if c is not None:
                    self.send(c, out.line)
            elif isinstance(out, Close):
                c = self.clients.get(out.conn)
                if c is not None:
                    self._end(c, flush=out.flush)
            elif isinstance(out, Event):
                self.emit(out.name, **out.fields)

    def send(self, c: Client, line: str) -> None:
        """Queue one line for *c* (never blocks). Overflow drops the client."""
        if c.ended:
            return
        try:
            c.out_send.send_nowait(encode(line) + b"\r\n")
            c.tx_lines += 1
        except trio.WouldBlock:
            if c.closing:  # the engine is closing it already: stop waiting for the peer
                self._end(c, flush=False)
            else:
                self.close(c, "SendQ exceeded", error=False, flush=False)
        except trio.ClosedResourceError:
            pass

    def close(self, c: Client, reason: str, **how: Unpack[Closing]) -> None:
        """Start closing *c* (idempotent, never blocks): the engine leaves its channels,
        tells its peers and queues ``ERROR :Closing Link`` (if *error*); then the writer
        finishes."""
        self._apply(self.engine.close_conn(c.id, reason, **how))

    def _end(self, c: Client, *, flush: bool) -> None:
        """End *c*'s writer: after what is queued (at most ``close_grace`` on), or now."""
        if c.ended and flush:
            return
        c.ended = True
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
