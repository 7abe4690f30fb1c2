"""The UDP fault proxy: per-client sessions, each mapped to its own upstream socket.

A datagram from a new client address opens a *session*: a fresh socket connected to the
upstream, so the upstream sees one distinct peer per client (as behind a NAT) and its
replies go back to the client that asked, from the proxy's listening address. A session
with no datagram either way for ``idle_timeout`` seconds expires (its upstream socket is
closed); the client's next datagram opens a new one.

Fault modes, each per direction (``stream``: ``upstream`` = client to server,
``downstream`` = server to client, or ``both``), on every session, current and new:

* ``freeze`` -- datagrams are **held** (up to ``hold_limit`` per session and direction,
  and within the byte bounds below; more are dropped and counted) and released in order
  on ``thaw``, as TCP's freeze holds bytes;
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

Memory is bounded (issue 24 item 12: one frozen client of 65,507-byte datagrams held
8,815 of them, 551 MB, never given back; 10,000 sessions were 171 MB and took 5.6 s to
stop). Every datagram that waits -- held by a freeze, or queued by a delay, a reorder or
a full socket buffer -- takes its payload's bytes from its session's bound
(``session_bytes``, both directions) and the proxy's (``proxy_bytes``); one that finds
no room is dropped and counted (``hold_overflow``, ``queue_overflow``). At most
``max_sessions`` sessions are open: a new client beyond that evicts the longest idle
(its ``session_close`` says ``how: "evicted"``; ``state["evicted"]`` counts them).
Freed payloads are given back to the system (glibc's ``malloc_trim``) once a MiB or more
was freed: Python returns them to malloc, which kept the 551 MB after a thaw.
"""

from __future__ import annotations

import ctypes
import select
import socket
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from faultnet.addresses import format_address
from faultnet.eventlog import JsonlWriter
from faultnet.modes import FaultRequest
from faultnet.protocols.dns import DnsFaults, DnsRule
from faultnet.proxy import ProxyError, listen_error
from faultnet.proxybase import ProxyBase
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
#: Defaults of the memory bounds. A session may keep 16 MiB waiting (a freeze of 250
#: 64 KiB datagrams, or 160 ms of 100 MB/s behind a latency), the proxy 128 MiB; 4,096
#: sessions are ~27 MB (6.6 KB each measured: 10,000 sessions, 66 MB of RSS).
SESSION_BYTES = 16 << 20
PROXY_BYTES = 128 << 20
MAX_SESSIONS = 4096
#: Bytes freed since the last malloc_trim that make the next one worth its cost. A trim
#: walks the heap: measured 2 ms over a 160 MB heap with nothing to return, 37 ms when it
#: returned 160 MB; it runs at a thaw or blackhole and at most once a second otherwise.
_TRIM_AFTER = 1 << 20


def _load_malloc_trim() -> Callable[[int], int] | None:
    # glibc only; elsewhere (musl, macOS) nothing to call and nothing given back early.
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_malloc_trim()


def _streams(stream: str) -> tuple[str, ...]:
    if stream not in _STREAM_CHOICES:
        raise ValueError(f"stream must be one of {', '.join(_STREAM_CHOICES)}, not {stream!r}")
    return STREAMS if stream == "both" else (stream,)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class DnsRuleError(ProxyError, ValueError):
    """A dns rule the table let through but the rule refuses (an action without its
    figure, an address that is not one): the API answers 400 with its message."""


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
    #: found no room to be held (``hold_limit``, ``session_bytes``, ``proxy_bytes``): dropped
    hold_overflow: int = 0
    #: had to wait (a delay, a reorder, a full socket buffer) and found no room
    #: (``session_bytes``, ``proxy_bytes``): dropped
    queue_overflow: int = 0
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
        #: Payload bytes waiting in this session (held or queued), both directions.
        self.buffered = 0
        self.lanes = {
            "upstream": Lane(
                self.upstream,
                self._send_upstream,
                lambda exc, data: self._send_failed("upstream", exc, data),
                spawn=self._spawn_lane,
                budget=self,
            ),
            "downstream": Lane(
                listener,
                lambda data: listener.sendto(data, peer),
                lambda exc, data: self._send_failed("downstream", exc, data),
                spawn=self._spawn_lane,
                budget=self,
            ),
        }
        self.counts = {s: UdpCounts() for s in STREAMS}
        #: (stream, errno) pairs and streams already logged: a flood logs once per session.
        self._logged: set[object] = set()
        self.held: dict[str, deque[tuple[int, bytes]]] = {s: deque() for s in STREAMS}
        self.started = self.last_active = time.monotonic()
        self.closed = False
        self._refused_logged = False

    # -- the memory bound (the lanes' Budget) --

    def take(self, n: int) -> bool:
        """Reserve *n* bytes within the session's and the proxy's bounds."""
        proxy = self.proxy
        if self.buffered + n > proxy.session_bytes or proxy._buffered + n > proxy.proxy_bytes:
            return False
        self.buffered += n
        proxy._buffered += n
        return True

    def give(self, n: int) -> None:
        self.buffered -= n
        self.proxy._buffered -= n
        self.proxy._freed += n

    def _spawn_lane(self, run: Callable[[], Any]) -> None:
        # In the proxy's nursery (a session has no task of its own); the lane's own
        # scope ends it (Lane.close).
        assert self.proxy._nursery is not None
        self.proxy._nursery.start_soon(self._run_lane, run)

    async def _run_lane(self, run: Callable[[], Any]) -> None:
        try:
            await run()
        except Exception as exc:  # contained as the session task's errors are
            self.proxy.log.write("session_error", session=self.id, error=repr(exc))
            self.proxy._close_session(self, "error")

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
        if not self.closed:
            self.proxy._sessions.move_to_end(self.peer)  # kept in order of activity
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
            if len(self.held[stream]) < self.proxy.hold_limit and self.take(len(payload)):
                self.held[stream].append((seq, payload))
                counts.held += 1
            else:
                counts.hold_overflow += 1
        elif self.proxy._dns:
            self._dns(stream, seq, payload)
        else:
            self._impair(stream, seq, payload)

    def _dns(self, stream: str, seq: int, payload: bytes) -> None:
        """A datagram past the gate while DNS rules are in force: a query judged by
        them (answered, dropped or delayed here), an answer changed if its query's
        rule says so; then the impairments, as any datagram's."""
        faults = self.proxy._dns
        if stream == "downstream":
            self._impair(stream, seq, faults.answer(payload, self.peer))
            return
        decision = faults.query(payload, self.peer)
        if decision.fault is None:
            self._impair(stream, seq, payload)
            return
        self.proxy.log.write("dns_fault", session=self.id, **decision.to_event())
        if decision.verdict == "answer":
            # The client's answer, as if the server had sent it: the downstream
            # impairments and the gate's freeze or blackhole apply to it alike.
            self.ingress("downstream", decision.reply)
        elif decision.delay_s:
            self.lanes[stream].put(payload, delay_s=decision.delay_s)
        elif decision.verdict == "forward":  # its answer is changed on its way back
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
            self.give(len(payload))
            self.counts[stream].released += 1
            self._impair(stream, seq, payload)
        return n

    def drop_held(self, stream: str) -> int:
        """Drop what a freeze held on *stream* (a blackhole, or the session closing)."""
        held = self.held[stream]
        n = len(held)
        self.give(sum(len(payload) for _, payload in held))
        held.clear()
        return n

    def info(self) -> SessionInfo:
        now = time.monotonic()
        counts = {}
        for s in STREAMS:
            c, lane = self.counts[s], self.lanes[s]
            c.sent, c.send_errors, c.queue_overflow = lane.sent, lane.send_errors, lane.overflow
            counts[s] = dict(vars(c))  # asdict() deep-copies: a third of the time to stop
        try:
            local = format_address(self.upstream.getsockname())
        except OSError:
            local = "closed"
        return SessionInfo(
            state=self.proxy.session_state(),
            id=self.id,
            peer=self.peer_text,
            local=local,
            counts=counts,
            held={s: len(self.held[s]) for s in STREAMS},
            age_s=round(now - self.started, 3),
            idle_s=round(now - self.last_active, 3),
        )

    def read_upstream(self) -> None:
        """Read what the upstream sent, up to ``_FAIRNESS`` datagrams (the proxy's epoll
        set says when there is something; level-triggered, so the rest is read on the
        next round, after the other sessions')."""
        buf = self.proxy._recv_buf
        sock = self.upstream
        for _ in range(_FAIRNESS):
            try:
                n = sock.recv_into(buf, 0, socket.MSG_TRUNC)  # n: the datagram's real length
            except BlockingIOError:
                return
            except ConnectionRefusedError:
                self._refused()
                continue
            # No await between the read and the copy: one buffer serves every read.
            self.ingress("downstream", bytes(buf[:n]), n)


class UdpProxy(ProxyBase):
    """A UDP proxy from ``listen`` to ``upstream`` with per-direction fault modes.

    Run it with ``await nursery.start(proxy.serve)`` or ``async with open_udp_proxy(...)``.
    ``address`` is the bound address (port 0 becomes the real port). ``seed`` (logged)
    fixes every random decision; ``idle_timeout`` is the seconds of silence after which a
    session expires; ``hold_limit`` bounds the datagrams a freeze holds per session and
    direction; ``session_bytes`` and ``proxy_bytes`` bound the payload bytes waiting
    (held or queued) in one session and in all; ``max_sessions`` bounds the sessions (the
    longest idle is evicted for a new one).
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
        session_bytes: int = SESSION_BYTES,
        proxy_bytes: int = PROXY_BYTES,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, not {idle_timeout}")
        for what, value in (
            ("hold_limit", hold_limit),
            ("session_bytes", session_bytes),
            ("proxy_bytes", proxy_bytes),
            ("max_sessions", max_sessions),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{what} must be a positive whole number, not {value!r}")
        super().__init__(upstream, listen, name=name, event_log=event_log, seed=seed)
        self.idle_timeout = idle_timeout
        self.hold_limit = hold_limit
        self.session_bytes = session_bytes
        self.proxy_bytes = proxy_bytes
        self.max_sessions = max_sessions
        #: Payload bytes waiting in all sessions; freed since the last malloc_trim.
        self._buffered = 0
        self._freed = 0
        self.evicted = 0
        self._sock: socket.socket | None = None
        self._recv_buf = memoryview(bytearray(RECV_BUFFER))
        #: In order of last activity, the longest idle first (expiry and eviction read it).
        self._sessions: OrderedDict[Address, Session] = OrderedDict()
        self._next_id = 1
        self._nursery: trio.Nursery | None = None
        #: Every session's upstream socket, watched by one task (_upstream_loop).
        self._epoll: select.epoll | None = None
        self._by_fd: dict[int, Session] = {}
        self._closed = trio.Event()
        self._gates = dict.fromkeys(STREAMS, OPEN)
        #: Datagrams read so far per direction, all sessions: the index fates are keyed by.
        self._seq = dict.fromkeys(STREAMS, 0)
        self._impairments = dict.fromkeys(STREAMS, Impairment())
        #: The dns rules in force, and the faulted queries whose answers are awaited.
        self._dns = DnsFaults(self.seed)

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
        self.log_listening(
            protocol="udp",
            idle_timeout=self.idle_timeout,
            hold_limit=self.hold_limit,
            session_bytes=self.session_bytes,
            proxy_bytes=self.proxy_bytes,
            max_sessions=self.max_sessions,
        )
        self._epoll = epoll = select.epoll()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._receive_loop, self._sock)
                nursery.start_soon(self._upstream_loop, epoll)
                nursery.start_soon(self._expire_loop)
                task_status.started(self.address)
                await self._closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._close_all()
            epoll.close()
            self._epoll = None
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

    async def _upstream_loop(self, ep: select.epoll) -> None:
        # Theory of operation: one task reads every session's upstream socket, woken by
        # the epoll set they are all in (trio waits on the set's own descriptor). A task
        # per session was ~11 KB each and 10,000 of them took 5.2 s to stop (cancelling
        # them, and the exception group of their Cancelled); a session is now a socket,
        # two lanes and their counters.
        by_fd = self._by_fd
        while True:
            await trio.lowlevel.wait_readable(ep.fileno())
            for fd, _ in ep.poll(0, 1024):
                session = by_fd.get(fd)
                if session is None:
                    continue
                try:
                    session.read_upstream()
                except Exception as exc:
                    # Contained: a session's failure never takes the proxy down.
                    self.log.write("session_error", session=session.id, error=repr(exc))
                    self._close_session(session, "error")

    def _open_session(self, addr: Address) -> Session | None:
        assert self._nursery is not None
        if len(self._sessions) >= self.max_sessions:
            # The longest idle goes: the order of _sessions is the order of activity.
            self.evicted += 1
            self._close_session(next(iter(self._sessions.values())), "evicted")
        try:
            session = Session(self, self._next_id, addr)
        except OSError as exc:
            self.log.write(
                "session_failed", peer=format_address(addr), error=exc.strerror or str(exc)
            )
            return None
        assert self._epoll is not None
        fd = session.upstream.fileno()
        self._epoll.register(fd, select.EPOLLIN)
        self._by_fd[fd] = session
        self._next_id += 1
        self._sessions[addr] = session
        self.log.write("session_open", session=session.id, peer=session.peer_text)
        return session

    def _close_session(self, session: Session, how: str) -> None:
        if session.closed:
            return
        session.closed = True
        fd = session.upstream.fileno()
        if self._by_fd.pop(fd, None) is session and self._epoll is not None:
            self._epoll.unregister(fd)
        if self._sessions.get(session.peer) is session:
            del self._sessions[session.peer]
        info = session.info()
        unsent = {s: lane.pending for s, lane in session.lanes.items()}
        for s, lane in session.lanes.items():
            lane.close()
            session.drop_held(s)
        # No trio.lowlevel.notify_closing: nothing waits on the socket now (the epoll set
        # watches it; a lane waiting for room was just cancelled, which ends its wait at
        # once), and it cost 70 us a socket, a third of the time to stop 10,000.
        session.upstream.close()
        self.log.write(
            "session_close",
            session=session.id,
            peer=session.peer_text,
            how=how,
            age_s=info.age_s,
            counts=info.counts,
            unsent=unsent,
            held=info.held,
        )

    def _close_all(self) -> None:
        for session in list(self._sessions.values()):
            self._close_session(session, "closed")
        self._give_memory_back()

    def _give_memory_back(self) -> None:
        """Return freed payloads' memory to the system once a MiB or more was freed."""
        if self._freed >= _TRIM_AFTER:
            self._freed = 0
            if _malloc_trim is not None:
                _malloc_trim(0)

    async def _expire_loop(self) -> None:
        # Looked at four times per idle_timeout (at most once a second): a session expires
        # between idle_timeout and 1.25 x idle_timeout after its last datagram.
        interval = min(self.idle_timeout / 4, 1.0)
        while True:
            await trio.sleep(interval)
            deadline = time.monotonic() - self.idle_timeout
            expired = []
            for session in self._sessions.values():  # the longest idle first
                if session.last_active >= deadline:
                    break
                if not any(lane.pending for lane in session.lanes.values()):
                    expired.append(session)
            for session in expired:
                self._close_session(session, "expired")
            # What lanes sent and sessions dropped since the last look.
            self._give_memory_back()

    # -- faults --

    async def apply_request(self, req: FaultRequest) -> object:
        """Apply a request its table has checked (:data:`faultnet.udp.modes.UDP`):
        the method named as its mode, called with every argument the row declares
        (defaults filled in). Returns what the method does."""
        # Every row is a method of that name taking those keywords
        # (tests/faultnet/udp/test_udp_server.py checks each).
        operation: Callable[..., Awaitable[object]] = getattr(self, req.mode.name)
        return await operation(**req.arguments)

    def _log_fault(self, event: str, mode: str, stream: str, **fields: Any) -> None:
        """The one record of a fault applied or removed on this proxy (``fault_applied``
        or ``fault_removed``, as the TCP proxy's, marked ``protocol: udp``)."""
        self.log.write(event, protocol="udp", mode=mode, stream=stream, **fields)

    def _set_gate(self, mode: str, gate: str, stream: str) -> int:
        streams = _streams(stream)
        for s in streams:
            self._gates[s] = gate
        self._log_fault("fault_applied", mode, stream, sessions=len(self._sessions))
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
                session.counts[s].blackholed += session.drop_held(s)
        self._give_memory_back()
        return self._set_gate("blackhole", BLACKHOLED, stream)

    async def thaw(self, stream: str = "both") -> int:
        """Undo freeze and blackhole on *stream*: datagrams a freeze held are passed on,
        in order, through the impairments in force. Returns how many were released."""
        streams = _streams(stream)
        for s in streams:
            self._gates[s] = OPEN
        released = sum(session.release(s) for session in self._sessions.values() for s in streams)
        # What went out at once is freed now; what waits for socket room, once sent.
        self._give_memory_back()
        self._log_fault("fault_removed", "thaw", stream, released=released)
        return released

    async def impair(self, stream: str = "both", **attributes: Any) -> dict[str, Any]:
        """Set impairment attributes (see :class:`~faultnet.udp.impairments.Impairment`)
        on *stream*, keeping the others; return the new impairment of the first stream.
        Raises ValueError for an unknown attribute or a bad value (nothing changed)."""
        streams = _streams(stream)
        new = {s: self._impairments[s].with_(**attributes) for s in streams}
        self._impairments.update(new)
        self._log_fault("fault_applied", "impair", stream, attributes=attributes, seed=self.seed)
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

    async def dns(
        self,
        action: str,
        qname: str = "*",
        qtype: str = "any",
        percent: float = 100.0,
        count: int = 0,
        delay_ms: float = 0.0,
        address: str = "",
        stream: str = "both",
    ) -> dict[str, Any]:
        """Fault the DNS queries matching *qname* (a glob) and *qtype*: *action* (see
        :mod:`faultnet.protocols.dns`) on *percent* of them, the first *count* (0: all).
        Rules add up, the first that matches a query judges it; :meth:`clear` ends them.
        Each faulted query is one ``dns_fault`` record. A delayed query keeps its
        session's order, as latency does: what the same client socket sends after it
        waits behind it (a stub resolver's fresh socket per query is not held up).
        Returns the rule.
        :class:`DnsRuleError` (a ValueError) for a bad value (nothing changed)."""
        if stream != "both":
            raise DnsRuleError(
                f"dns acts on queries and their answers: stream must be both, not {stream!r}"
            )
        try:
            rule = DnsRule(action, qname, qtype, percent, count, delay_ms, address)
        except ValueError as exc:
            raise DnsRuleError(str(exc)) from None
        self._dns.add(rule)
        self._log_fault("fault_applied", "dns", stream, attributes=rule.to_json(), seed=self.seed)
        return rule.to_json()

    async def clear(self, stream: str = "both") -> None:
        """Remove every impairment on *stream* (freeze and blackhole stay: see thaw), and
        the DNS rules when *stream* is both or upstream (where queries travel)."""
        for s in _streams(stream):
            self._impairments[s] = Impairment()
        if "upstream" in _streams(stream):
            self._dns.clear()
        self._log_fault("fault_removed", "clear", stream)

    # -- observation --

    def sessions(self) -> list[SessionInfo]:
        return [s.info() for s in list(self._sessions.values())]

    def session_state(self) -> str:
        """Every session's fault state label: the gates are the proxy's, so one label
        holds for all of them (``open``, ``frozen``, ``blackholed``, or
        ``frozen-upstream`` where one stream alone is gated)."""
        gates = self._gates
        if gates["upstream"] == gates["downstream"]:
            return gates["upstream"]
        closed = [s for s in STREAMS if gates[s] != OPEN]
        return f"{gates[closed[0]]}-{closed[0]}"

    def connection_counts(self) -> dict[str, int]:
        """How many sessions are in each fault state (as :meth:`Proxy.connection_counts`),
        read without reading a session: they all share :meth:`session_state`."""
        return {self.session_state(): len(self._sessions)} if self._sessions else {}

    #: The server lists a UDP proxy's sessions where a TCP proxy's connections go.
    connections = sessions

    @property
    def state(self) -> dict[str, Any]:
        return {
            "protocol": "udp",
            "gates": dict(self._gates),
            "impairments": {s: imp.to_json() for s, imp in self._impairments.items()},
            "dns": [rule.to_json() for rule in self._dns.rules],
            "sessions": len(self._sessions),
            #: datagrams read per direction, every session's (closed ones too)
            "received": dict(self._seq),
            "evicted": self.evicted,
            "buffered_bytes": self._buffered,
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
