"""The UDP fault proxy: per-client sessions, each mapped to its own upstream socket.

A datagram from a new client address opens a *session*: a fresh socket connected to the
upstream, so the upstream sees one distinct peer per client (as behind a NAT) and its
replies go back to the client that asked, from the proxy's listening address. A session
with no datagram either way for ``idle_timeout`` seconds expires (its upstream socket is
closed); the client's next datagram opens a new one.

Fault modes, each per direction (``stream``: ``upstream`` = client to server,
``downstream`` = server to client, or ``both``), on every session, current and new:

* ``freeze`` -- datagrams are **held** (up to ``hold_limit`` per session and direction;
  more are dropped and counted) and released in order on ``thaw``, as TCP's freeze holds
  bytes;
* ``blackhole`` -- datagrams are **dropped**: a route that died. ``thaw`` ends it;
  nothing comes back;
* impairments (:mod:`faultnet.udp.impairments`): ``loss``, ``latency`` with jitter,
  ``duplicate``, ``reorder`` and ``size_limit`` (truncate or drop), all seeded: the proxy's
  ``seed`` reproduces the exact fate of every datagram, keyed by its index in its
  direction across all sessions (so whatever source ports the kernel picks). ``clear``
  removes them.

Every fault call is total when it returns: the next datagram read is treated under the
new state (datagrams already delayed in a lane keep the fate they were given).
Every session and every fault is one record in the JSONL event log; a session's record
at its close counts what happened to its datagrams.
"""

from __future__ import annotations

import random
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from faultnet.addresses import format_address
from faultnet.eventlog import JsonlWriter
from faultnet.events import EVENTS
from faultnet.proxy import listen_error
from faultnet.sockopts import raise_fd_limit
from faultnet.udp.impairments import Impairment, fate
from faultnet.udp.lane import Lane

__all__ = ["SessionInfo", "UdpCounts", "UdpProxy", "open_udp_proxy"]

Address = tuple[str, int]
#: client to server, server to client (Toxiproxy's names, as on TCP).
STREAMS = ("upstream", "downstream")
_STREAM_CHOICES = ("both", *STREAMS)
#: Bytes read per datagram: more than the largest UDP payload of either family (IPv4
#: 65,507 = 65,535 - 20 - 8; IPv6 65,527 = 65,535 - 8, its length field not counting its
#: own header). Sized for IPv4 alone it cut IPv6's largest (65,527 in, 65,508 out) and
#: nothing said so. A longer datagram (none on loopback) is still seen: it is read with
#: MSG_TRUNC, which returns its real length, and counted and logged as cut.
RECV_BUFFER = 65536
#: Datagrams a reader handles before it yields to other tasks when more keep coming.
#: A checkpoint per datagram (a task switch each) held the proxy to ~7,400 echo round
#: trips/s against ~47,000 direct; one per 16 is the copy path's fairness, as the thread plane's.
_FAIRNESS = 16
#: Gate states of one direction.
OPEN, FROZEN, BLACKHOLED = "open", "frozen", "blackholed"


def _streams(stream: str) -> tuple[str, ...]:
    if stream not in _STREAM_CHOICES:
        raise ValueError(f"stream must be one of {', '.join(_STREAM_CHOICES)}, not {stream!r}")
    return STREAMS if stream == "both" else (stream,)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


@dataclass
class UdpCounts:
    """What happened to one direction's datagrams in one session."""

    #: read by the proxy
    received: int = 0
    #: handed to the kernel towards the other side (duplicates count twice)
    sent: int = 0
    lost: int = 0
    oversize_dropped: int = 0
    truncated: int = 0
    duplicated: int = 0
    reordered: int = 0
    blackholed: int = 0
    held: int = 0
    released: int = 0
    #: held beyond ``hold_limit``: dropped
    hold_overflow: int = 0
    #: refused by the kernel (e.g. ECONNREFUSED after an ICMP port unreachable, EMSGSIZE
    #: for a payload longer than the other side's family carries); logged as send_failed
    send_errors: int = 0
    #: longer than the proxy's receive buffer, so cut to it; logged as datagram_cut
    cut_on_receive: int = 0


@dataclass(frozen=True)
class SessionInfo:
    id: int
    peer: str
    #: the session's own address towards the upstream
    local: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    #: datagrams held by a freeze, per direction
    held: dict[str, int] = field(default_factory=dict)
    age_s: float = 0.0
    idle_s: float = 0.0
    #: open, or the gates of the proxy: frozen, blackholed (per direction: -upstream...)
    state: str = "open"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Session:
    """One client address and its upstream socket. Created by :class:`UdpProxy`."""

    def __init__(self, proxy: UdpProxy, session_id: int, peer: Address) -> None:
        self.proxy = proxy
        self.id = session_id
        self.peer = peer
        self.peer_text = format_address(peer)
        host, port = proxy.upstream
        self.upstream = socket.socket(_family(host), socket.SOCK_DGRAM)
        try:
            self.upstream.setblocking(False)
            self.upstream.connect((host, port))  # UDP connect: no packet, just the route
        except OSError:
            self.upstream.close()  # the caller logs session_failed; no socket outlives it
            raise
        assert proxy._sock is not None
        listener = proxy._sock
        self.lanes = {
            "upstream": Lane(
                self.upstream,
                self._send_upstream,
                lambda exc, data: self._send_failed("upstream", exc, data),
            ),
            "downstream": Lane(
                listener,
                lambda data: listener.sendto(data, peer),
                lambda exc, data: self._send_failed("downstream", exc, data),
            ),
        }
        self.counts = {s: UdpCounts() for s in STREAMS}
        #: (stream, errno) pairs and streams already logged: a flood logs once per session.
        self._logged: set[object] = set()
        self.held: dict[str, deque[tuple[int, bytes]]] = {s: deque() for s in STREAMS}
        self.started = self.last_active = time.monotonic()
        self.scope = trio.CancelScope()
        self.closed = False
        self._refused_logged = False

    def _send_upstream(self, data: bytes) -> None:
        try:
            self.upstream.send(data)
        except ConnectionRefusedError:
            self._refused()
            raise

    def _refused(self) -> None:
        # An ICMP port unreachable for an earlier datagram: nothing listens upstream
        # (yet). The kernel reports it on the socket's next send or recv, whichever comes
        # first. Said once per session; the session keeps going.
        if not self._refused_logged:
            self._refused_logged = True
            self.proxy.log.write("upstream_refused", session=self.id)

    def _send_failed(self, stream: str, exc: OSError, payload: bytes) -> None:
        # Counted by the lane (send_errors); said once per session, stream and errno.
        if isinstance(exc, ConnectionRefusedError) or (stream, exc.errno) in self._logged:
            return  # refusals have their own record, upstream_refused
        self._logged.add((stream, exc.errno))
        self.proxy.log.write(
            "send_failed",
            session=self.id,
            stream=stream,
            bytes=len(payload),
            error=exc.strerror or str(exc),
        )

    def ingress(self, stream: str, payload: bytes, length: int | None = None) -> None:
        """One datagram read from the client (``upstream``) or the server. *length* is
        its real length when the read cut it to *payload* (counted and logged)."""
        self.last_active = time.monotonic()
        counts = self.counts[stream]
        counts.received += 1
        if length is not None and length > len(payload):
            counts.cut_on_receive += 1
            if stream not in self._logged:
                self._logged.add(stream)
                self.proxy.log.write(
                    "datagram_cut", session=self.id, stream=stream, bytes=length, kept=len(payload)
                )
        # The index in the proxy's direction, not the session's: fates must not depend
        # on how the kernel's choice of source ports cut the traffic into sessions.
        seq = self.proxy._seq[stream]
        self.proxy._seq[stream] = seq + 1
        gate = self.proxy._gates[stream]
        if gate == BLACKHOLED:
            counts.blackholed += 1
        elif gate == FROZEN:
            if len(self.held[stream]) < self.proxy.hold_limit:
                self.held[stream].append((seq, payload))
                counts.held += 1
            else:
                counts.hold_overflow += 1
        else:
            self._impair(stream, seq, payload)

    def _impair(self, stream: str, seq: int, payload: bytes) -> None:
        imp = self.proxy._impairments[stream]
        f = fate(imp, payload, seed=self.proxy.seed, stream=stream, seq=seq)
        counts = self.counts[stream]
        counts.truncated += f.truncated
        if f.dropped == "loss":
            counts.lost += 1
            return
        if f.dropped == "oversize":
            counts.oversize_dropped += 1
            return
        counts.duplicated += f.copies - 1
        counts.reordered += f.reorder
        self.lanes[stream].put(
            f.payload,
            copies=f.copies,
            delay_s=f.delay_s,
            defer=f.reorder,
            defer_s=imp.reorder_gap_ms / 1000.0,
        )

    def release(self, stream: str) -> int:
        """Pass the datagrams a freeze held on *stream* on, in order; return how many."""
        held = self.held[stream]
        n = len(held)
        while held:
            seq, payload = held.popleft()
            self.counts[stream].released += 1
            self._impair(stream, seq, payload)
        return n

    def info(self) -> SessionInfo:
        now = time.monotonic()
        counts = {}
        for s in STREAMS:
            c = self.counts[s]
            c.sent, c.send_errors = self.lanes[s].sent, self.lanes[s].send_errors
            counts[s] = asdict(c)
        try:
            local = format_address(self.upstream.getsockname())
        except OSError:
            local = "closed"
        gates = self.proxy._gates
        if gates["upstream"] == gates["downstream"]:
            state = gates["upstream"]
        else:
            closed = [s for s in STREAMS if gates[s] != OPEN]
            state = f"{gates[closed[0]]}-{closed[0]}"
        return SessionInfo(
            state=state,
            id=self.id,
            peer=self.peer_text,
            local=local,
            counts=counts,
            held={s: len(self.held[s]) for s in STREAMS},
            age_s=round(now - self.started, 3),
            idle_s=round(now - self.last_active, 3),
        )

    async def run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                for lane in self.lanes.values():
                    nursery.start_soon(lane.run)
                await self._read_upstream()

    async def _read_upstream(self) -> None:
        buf = self.proxy._recv_buf
        sock = self.upstream
        ops = 0
        while True:
            try:
                n = sock.recv_into(buf, 0, socket.MSG_TRUNC)  # n: the datagram's real length
            except BlockingIOError:
                ops = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except ConnectionRefusedError:
                self._refused()
                continue
            # No await between the read and the copy: tasks never share the buffer.
            self.ingress("downstream", bytes(buf[:n]), n)
            ops += 1
            if ops >= _FAIRNESS:
                ops = 0
                await trio.lowlevel.checkpoint()


class UdpProxy:
    """A UDP proxy from ``listen`` to ``upstream`` with per-direction fault modes.

    Run it with ``await nursery.start(proxy.serve)`` or ``async with open_udp_proxy(...)``.
    ``address`` is the bound address (port 0 becomes the real port). ``seed`` (logged)
    fixes every random decision; ``idle_timeout`` is the seconds of silence after which a
    session expires; ``hold_limit`` bounds the datagrams a freeze holds per session and
    direction.
    """

    def __init__(
        self,
        upstream: Address,
        listen: Address = ("127.0.0.1", 0),
        *,
        name: str = "udp-proxy",
        event_log: str | None | JsonlWriter = None,
        seed: int | None = None,
        idle_timeout: float = 30.0,
        hold_limit: int = 10_000,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, not {idle_timeout}")
        self.name = name
        self.upstream = (upstream[0], int(upstream[1]))
        self.listen = (listen[0], int(listen[1]))
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.idle_timeout = idle_timeout
        self.hold_limit = hold_limit
        self.log = (
            event_log
            if isinstance(event_log, JsonlWriter)
            else JsonlWriter(event_log, vocabulary=EVENTS, proxy=name)
        )
        self.address: Address | None = None
        self.fd_limit = raise_fd_limit()
        self._sock: socket.socket | None = None
        self._recv_buf = memoryview(bytearray(RECV_BUFFER))
        self._sessions: dict[Address, Session] = {}
        self._next_id = 1
        self._nursery: trio.Nursery | None = None
        self._closed = trio.Event()
        self._gates = dict.fromkeys(STREAMS, OPEN)
        #: Datagrams read so far per direction, all sessions: the index fates are keyed by.
        self._seq = dict.fromkeys(STREAMS, 0)
        self._impairments = dict.fromkeys(STREAMS, Impairment())

    @property
    def event_log_path(self) -> str | None:
        return str(self.log.path) if self.log.path is not None else None

    # -- running --

    def _bind(self) -> None:
        sock = socket.socket(_family(self.listen[0]), socket.SOCK_DGRAM)
        try:
            sock.bind(self.listen)
        except OSError as exc:
            sock.close()
            raise listen_error(self.listen, exc) from None
        sock.setblocking(False)
        self._sock = sock
        self.address = sock.getsockname()[:2]

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Receive and proxy until :meth:`aclose` or cancellation. Reports the address.

        Raises :class:`faultnet.proxy.ProxyError` before reporting if it cannot bind."""
        if self._sock is None:
            self._bind()
        assert self.address is not None and self._sock is not None
        self.log.write(
            "listening",
            protocol="udp",
            listen=format_address(self.address),
            upstream=format_address(self.upstream),
            seed=self.seed,
            idle_timeout=self.idle_timeout,
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._receive_loop, self._sock)
                nursery.start_soon(self._expire_loop)
                task_status.started(self.address)
                await self._closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            for session in list(self._sessions.values()):
                self._close_session(session, "closed")
            self._sock.close()
            self._sock = None
            self.log.write("stopped")

    async def aclose(self) -> None:
        """Stop: close every session and the listening socket."""
        self._closed.set()

    async def _receive_loop(self, sock: socket.socket) -> None:
        buf = self._recv_buf
        ops = 0
        while True:
            try:
                n, addr = sock.recvfrom_into(buf, 0, socket.MSG_TRUNC)  # n: its real length
            except BlockingIOError:
                ops = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                # A stray ICMP error on the shared socket must not stop the proxy.
                self.log.write("receive_error", error=exc.strerror or str(exc))
                await trio.lowlevel.checkpoint()
                continue
            data = bytes(buf[:n])  # copied before any await: the buffer is shared
            addr = addr[:2]
            session = self._sessions.get(addr)
            if session is None:
                session = self._open_session(addr)
            if session is not None:
                session.ingress("upstream", data, n)
            ops += 1
            if ops >= _FAIRNESS:
                ops = 0
                await trio.lowlevel.checkpoint()

    def _open_session(self, addr: Address) -> Session | None:
        assert self._nursery is not None
        try:
            session = Session(self, self._next_id, addr)
        except OSError as exc:
            self.log.write(
                "session_failed", peer=format_address(addr), error=exc.strerror or str(exc)
            )
            return None
        self._next_id += 1
        self._sessions[addr] = session
        self.log.write("session_open", session=session.id, peer=session.peer_text)
        self._nursery.start_soon(self._run_session, session)
        return session

    async def _run_session(self, session: Session) -> None:
        # A session's task ends only by cancellation (expiry, or the proxy stopping) or
        # by an error, which is logged and contained: it never takes the proxy down.
        how = "closed"
        try:
            await session.run()
        except Exception as exc:
            self.log.write("session_error", session=session.id, error=repr(exc))
            how = "error"
        finally:
            self._close_session(session, how)

    def _close_session(self, session: Session, how: str) -> None:
        if session.closed:
            return
        session.closed = True
        session.scope.cancel()
        if self._sessions.get(session.peer) is session:
            del self._sessions[session.peer]
        info = session.info()
        trio.lowlevel.notify_closing(session.upstream)
        session.upstream.close()
        self.log.write(
            "session_close",
            session=session.id,
            peer=session.peer_text,
            how=how,
            age_s=info.age_s,
            counts=info.counts,
            unsent={s: lane.pending for s, lane in session.lanes.items()},
            held=info.held,
        )

    async def _expire_loop(self) -> None:
        # Looked at four times per idle_timeout (at most once a second): a session expires
        # between idle_timeout and 1.25 x idle_timeout after its last datagram.
        interval = min(self.idle_timeout / 4, 1.0)
        while True:
            await trio.sleep(interval)
            deadline = time.monotonic() - self.idle_timeout
            for session in list(self._sessions.values()):
                if session.last_active < deadline and not any(
                    lane.pending for lane in session.lanes.values()
                ):
                    self._close_session(session, "expired")

    # -- faults --

    def _set_gate(self, mode: str, gate: str, stream: str) -> int:
        streams = _streams(stream)
        for s in streams:
            self._gates[s] = gate
        self.log.write(
            "fault_applied", protocol="udp", mode=mode, stream=stream, sessions=len(self._sessions)
        )
        return len(self._sessions)

    async def freeze(self, stream: str = "both") -> int:
        """Hold every datagram on *stream* (every session, current and new) until
        :meth:`thaw`, which releases them in order. Returns the sessions open now."""
        return self._set_gate("freeze", FROZEN, stream)

    async def blackhole(self, stream: str = "both") -> int:
        """Drop every datagram on *stream* until :meth:`thaw` (a dead route)."""
        # Datagrams a freeze held on these streams are dropped now: a route that died.
        for session in self._sessions.values():
            for s in _streams(stream):
                session.counts[s].blackholed += len(session.held[s])
                session.held[s].clear()
        return self._set_gate("blackhole", BLACKHOLED, stream)

    async def thaw(self, stream: str = "both") -> int:
        """Undo freeze and blackhole on *stream*: datagrams a freeze held are passed on,
        in order, through the impairments in force. Returns how many were released."""
        streams = _streams(stream)
        for s in streams:
            self._gates[s] = OPEN
        released = sum(session.release(s) for session in self._sessions.values() for s in streams)
        self.log.write(
            "fault_removed", protocol="udp", mode="thaw", stream=stream, released=released
        )
        return released

    async def impair(self, stream: str = "both", **attributes: Any) -> dict[str, Any]:
        """Set impairment attributes (see :class:`~faultnet.udp.impairments.Impairment`)
        on *stream*, keeping the others; return the new impairment of the first stream.
        Raises ValueError for an unknown attribute or a bad value (nothing changed)."""
        streams = _streams(stream)
        new = {s: self._impairments[s].with_(**attributes) for s in streams}
        self._impairments.update(new)
        self.log.write(
            "fault_applied",
            protocol="udp",
            mode="impair",
            stream=stream,
            attributes=attributes,
            seed=self.seed,
        )
        return new[streams[0]].to_json()

    async def loss(self, percent: float, stream: str = "both") -> dict[str, Any]:
        """Drop *percent* of datagrams, chosen by the seed."""
        return await self.impair(stream, loss=percent)

    async def latency(
        self, latency_ms: float, jitter_ms: float = 0.0, stream: str = "both"
    ) -> dict[str, Any]:
        """Delay each datagram by *latency_ms* +- up to *jitter_ms* (order kept)."""
        return await self.impair(stream, latency_ms=latency_ms, jitter_ms=jitter_ms)

    async def duplicate(self, percent: float, stream: str = "both") -> dict[str, Any]:
        """Send *percent* of datagrams twice."""
        return await self.impair(stream, duplicate=percent)

    async def reorder(
        self, percent: float, stream: str = "both", *, gap_ms: float = 100.0
    ) -> dict[str, Any]:
        """Hold *percent* of datagrams back until after the next one (at most *gap_ms*)."""
        return await self.impair(stream, reorder=percent, reorder_gap_ms=gap_ms)

    async def size_limit(
        self, limit: int, action: str = "truncate", stream: str = "both"
    ) -> dict[str, Any]:
        """Truncate (or drop) payloads longer than *limit* bytes."""
        return await self.impair(stream, size_limit=limit, size_action=action)

    async def clear(self, stream: str = "both") -> None:
        """Remove every impairment on *stream* (freeze and blackhole stay: see thaw)."""
        for s in _streams(stream):
            self._impairments[s] = Impairment()
        self.log.write("fault_removed", protocol="udp", mode="clear", stream=stream)

    # -- observation --

    def sessions(self) -> list[SessionInfo]:
        return [s.info() for s in list(self._sessions.values())]

    #: The server lists a UDP proxy's sessions where a TCP proxy's connections go.
    connections = sessions

    @property
    def state(self) -> dict[str, Any]:
        return {
            "protocol": "udp",
            "gates": dict(self._gates),
            "impairments": {s: imp.to_json() for s, imp in self._impairments.items()},
            "sessions": len(self._sessions),
            "seed": self.seed,
        }


@asynccontextmanager
async def open_udp_proxy(
    upstream: Address, listen: Address = ("127.0.0.1", 0), **kwargs: Any
) -> AsyncIterator[UdpProxy]:
    """Run a :class:`UdpProxy` for the duration of the block; closed on exit."""
    proxy = UdpProxy(upstream, listen, **kwargs)
    proxy._bind()  # outside the nursery: a bind error arrives unwrapped
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        try:
            yield proxy
        finally:
            await proxy.aclose()
