"""The fault proxy: a trio TCP proxy whose links can be frozen, blackholed, severed and
reset, whose listener can drop SYNs or refuse, and whose bytes can pass through toxics.

Semantics every fault method shares:

* It is **total when it returns**. ``freeze`` closes each affected direction's gate (see
  :mod:`faultnet.pump`), so no byte crosses after it; ``sever`` and ``reset`` have sent
  their FIN or RST by then; ``refuse`` has closed the listener and ``drop_syn`` has
  attached its filter.
* ``freeze``, ``blackhole``, ``sever`` and ``reset`` act on the connections open at the
  call (a laptop that changed networks: old sockets dead, new ones fine).
  ``include_new=True`` extends ``freeze``/``blackhole`` to connections accepted later,
  until ``thaw``. ``drop_syn`` and ``refuse`` last until ``restore``; ``drop_syn`` with
  ``freeze(include_new=True)`` models a route that died outright.
* Half-close is kept: a FIN one way is forwarded as a FIN (``shutdown(SHUT_WR)``) and the
  other direction keeps flowing. While a direction is frozen its FIN or RST is held (not
  even read) and passed on after the held bytes, in order, on thaw.

Every connection and every fault is one record in the JSONL event log.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

import trio

from faultnet import bpf, planes
from faultnet.addresses import format_address, parse_peer, peer_matches
from faultnet.eventlog import JsonlWriter
from faultnet.modes import STREAM_CHOICES, mode
from faultnet.planes import thread as dataplane
from faultnet.pump import (
    CHUNK,
    Direction,
    Gate,
    PipePool,
    StreamClosed,
    StreamReset,
)
from faultnet.seeds import derive_seed
from faultnet.sockopts import (
    detach_filter,
    raise_fd_limit,
    set_linger_reset,
    socket_drops,
    tcp_retransmits,
    tcp_state,
)
from faultnet.toxics.base import STREAMS, Toxic
from faultnet.toxics.chain import ChainLink, ToxicChain

__all__ = ["AddressInUse", "ConnectionInfo", "Proxy", "ProxyError", "open_proxy"]

Address = tuple[str, int]

#: How often held FINs/RSTs are looked for on frozen connections (TCP_INFO polls).
_HELD_CLOSE_POLL_S = 0.1
_HELD_POLL_BATCH = 256
#: Connections accepted per wake-up of the accept loop before other tasks get a turn.
_ACCEPT_BATCH = 64


class ProxyError(Exception):
    """A proxy could not do what was asked (e.g. it cannot listen on its address)."""


class AddressInUse(ProxyError):
    """The listen address is taken (EADDRINUSE): an environment error, not a mistake in
    the request (the server answers it with Toxiproxy's 500)."""


def listen_error(where: Address, exc: OSError) -> ProxyError:
    """What a proxy (TCP or UDP) raises when it cannot bind its listen address *where*:
    :class:`AddressInUse` for EADDRINUSE, else :class:`ProxyError` with the OS's reason."""
    text = format_address(where)
    if exc.errno == errno.EADDRINUSE:
        return AddressInUse(f"listen address {text} is already in use")
    return ProxyError(f"cannot listen on {text}: {exc.strerror}")


@dataclass(frozen=True)
class ConnectionInfo:
    id: int
    peer: str
    upstream: str
    bytes_upstream: int
    bytes_downstream: int
    #: open, half-closed, frozen, frozen-upstream, frozen-downstream, blackholed, closing
    state: str
    age_s: float
    #: Segments dropped on their way into the proxy's client-side socket (the ``loss``
    #: and blackhole filters): each data segment among them the client retransmitted.
    dropped_upstream: int = 0
    #: The same on the proxy's upstream socket: segments the server had to retransmit.
    dropped_downstream: int = 0
    #: Segments the proxy's own two sockets retransmitted (``tcpi_total_retrans``), e.g.
    #: after a loss filter dropped the peer's ACKs.
    retransmits: int = 0
    #: The ``loss`` in force here, percent per stream (absent when none).
    loss: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _streams(stream: str) -> tuple[str, ...]:
    if stream not in STREAM_CHOICES:
        raise ValueError(f"stream must be one of {', '.join(STREAM_CHOICES)}, not {stream!r}")
    return STREAMS if stream == "both" else (stream,)


class Connection:
    """One client connection and its upstream connection. Created by :class:`Proxy`."""

    def __init__(self, proxy: Proxy, conn_id: int, client: socket.socket, peer: str) -> None:
        self.proxy = proxy
        self.id = conn_id
        self.client = client
        self.peer = peer
        try:
            self.peer_addr: tuple[str, int] = client.getpeername()[:2]
        except OSError:  # already reset by the client: no peer selector will match it
            self.peer_addr = ("", 0)
        #: Fraction of segments the loss filter drops, per stream (0: none).
        self.loss = dict.fromkeys(STREAMS, 0.0)
        self._final_drops: tuple[int, int, int] | None = None
        self.server: socket.socket | None = None
        self.directions: dict[str, Direction] | dict[str, dataplane.Lane] = {}
        #: This connection in the thread data plane (None on the trio pumps).
        self.link: planes.Link | None = None
        self._toxic_lanes: dict[str, dataplane.ToxicLane] = {}
        self._wakes: dict[str, trio.Event] = {s: trio.Event() for s in STREAMS}
        #: Set when the connection has ended and been logged (:meth:`_finish`).
        self._done = trio.Event()
        #: On the thread data plane, no task runs per connection: the plane's events
        #: (and the faults) end it. Only toxics' tasks need a nursery, in a task of
        #: their own (:meth:`_ensure_host`).
        self.in_plane = proxy._plane is not None
        self._hosted = False
        # Gates exist from the accept, before the upstream connect completes, so a fault
        # called in between catches this connection too.
        self.gates = {s: Gate() for s in STREAMS}
        self.blackholed = False
        self.closing: str | None = None  # how it is being ended: severed, reset, ...
        self.started = time.monotonic()
        # Toxic name -> its link on this connection, or None where toxicity said no.
        self.links: dict[str, ChainLink | None] = {}
        self._scope = trio.CancelScope()
        self._toxic_scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._held_logged: set[str] = set()
        #: Set (and replaced) whenever a toxic is attached or detached here.
        self.chain_changed = trio.Event()
        if proxy._frozen_new:
            self.freeze(proxy._frozen_new)
        if proxy._blackhole_new or proxy._partitions(self.peer_addr):
            self.blackhole()

    # -- toxics --

    def wants_copy(self, stream: str) -> bool:
        """True once any toxic applies to *stream* here (the splice path cannot see bytes)."""
        return any(link is not None and link.stream == stream for link in self.links.values())

    def chain(self, stream: str) -> ToxicChain:
        """The toxics that apply to *stream* here, in the order they were added."""
        return ToxicChain(
            [
                link
                for t in self.proxy.toxics
                if (link := self.links.get(t.name)) is not None and link.stream == stream
            ]
        )

    def log_event(self, event: str, **fields: Any) -> None:
        self.proxy.log.write(event, conn=self.id, **fields)

    def attach_toxic(self, toxic: Toxic) -> None:
        if toxic.name in self.links:  # already decided for this connection: kept
            return
        # Decided once per connection and kept; toxicity 0 never applies
        # (random() < 0 is never true), 1 always does.
        rng = random.Random(derive_seed(self.proxy.seed, self.id, toxic.name))
        if not rng.random() < toxic.toxicity:
            self.links[toxic.name] = None
            return
        link = ChainLink(toxic, self.id, toxic.stream, rng, self.sever, self.reset)
        self.links[toxic.name] = link
        self._signal_chain_changed()
        # A splice pump parked on an idle socket moves to the copy path when its next
        # bytes arrive, before it touches them (see Direction._splice). In the thread
        # plane the stream's bytes go to trio from now on; its chain runs in the host.
        if self.link is not None:
            self.link.to_trio(toxic.stream)
            self._ensure_host()
        if self._nursery is not None:
            self._start_toxic(link)
            if self.link is not None:
                self._start_toxic_lane(toxic.stream)

    def _start_toxic(self, link: ChainLink) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        try:
            self._nursery.start_soon(self._run_toxic, link.toxic, link, scope)
        except RuntimeError:
            # "Nursery is closed to new arrivals": both pumps have ended and the
            # connection is being torn down (still listed for a moment). No byte will
            # cross it again, so there is nothing for the toxic to act on.
            return
        self._toxic_scopes[link.toxic.name] = scope

    async def _run_toxic(self, toxic: Toxic, link: ChainLink, scope: trio.CancelScope) -> None:
        with scope:
            await toxic.run(link)

    def _signal_chain_changed(self) -> None:
        self.chain_changed.set()
        self.chain_changed = trio.Event()

    def detach_toxic(self, name: str) -> None:
        if self.links.pop(name, None) is not None:
            self._signal_chain_changed()
        scope = self._toxic_scopes.pop(name, None)
        if scope is not None:
            scope.cancel()

    # -- faults --

    def freeze(self, streams: Iterable[str]) -> None:
        streams = tuple(streams)
        for s in streams:
            self.gates[s].close()
        if self.link is not None:
            self.link.freeze(streams)  # total on return: see faultnet.planes.thread

    def thaw(self, streams: Iterable[str]) -> None:
        streams = tuple(streams)
        if self.blackholed and set(streams) == set(STREAMS):
            self.blackholed = False
        for s in streams:
            self.loss[s] = 0.0
        self.refilter()
        for s in streams:
            self.gates[s].open()
        if self.link is not None:
            self.link.thaw(streams)
            for s in streams:
                self._wake(s)

    def blackhole(self) -> None:
        self.freeze(STREAMS)
        self.blackholed = True
        self.refilter()

    def set_loss(self, streams: Iterable[str], fraction: float) -> None:
        for s in streams:
            self.loss[s] = fraction
        self.refilter()

    def refilter(self) -> None:
        """Put on each socket the filter its state asks for: the client-side socket drops
        everything when blackholed, else the upstream stream's loss; the upstream socket
        the downstream stream's loss (once it is connected: :meth:`run` calls again)."""
        wanted = {
            "client": bpf.drop_all() if self.blackholed else _loss_program(self.loss["upstream"]),
            "server": _loss_program(self.loss["downstream"]),
        }
        for side, sock in (("client", self.client), ("server", self.server)):
            if sock is None or sock.fileno() < 0:
                continue
            program = wanted[side]
            if program is None:
                detach_filter(sock)
            else:
                bpf.attach(sock, program)

    def drops(self) -> tuple[int, int, int]:
        """(dropped into the client-side socket, into the upstream socket, the proxy's own
        retransmits), read from the kernel; once the sockets are closed, as they were
        just before."""
        if self._final_drops is not None:
            return self._final_drops
        counts = []
        for sock in (self.client, self.server):
            try:
                counts.append((socket_drops(sock), tcp_retransmits(sock)))
            except (OSError, AttributeError):  # closed, or not connected yet (None)
                counts.append((0, 0))
        return counts[0][0], counts[1][0], counts[0][1] + counts[1][1]

    def _snapshot_drops(self) -> None:
        if self._final_drops is None:
            self._final_drops = self.drops()

    async def sever(self) -> None:
        """Clean FIN both ways, even with unread bytes; ends the connection."""
        self._end("severed")

    async def reset(self) -> None:
        """RST both ways; ends the connection."""
        self._end("reset")

    def _end(self, how: str) -> None:
        if self.closing is not None:
            return
        self.closing = how
        self._scope.cancel()
        self._snapshot_drops()
        if self.link is not None:
            self.link.end()  # the thread forgets the sockets before they are closed
        for sock in (self.client, self.server):
            if sock is None or sock.fileno() < 0:
                continue
            # Let the FIN or RST through, and the peer's answer: no blackhole or loss
            # filter outlives the connection it was for.
            detach_filter(sock)
            if not self.in_plane:  # a pump may be waiting on it
                trio.lowlevel.notify_closing(sock)
            if how == "reset":
                set_linger_reset(sock)
                sock.close()
            else:
                self.proxy._close_after_fin(sock)
        if self.in_plane:
            self._finish(how)  # no task of this connection's is left to do it

    def held_closes(self) -> None:
        """Log a FIN or RST that arrived on a frozen direction (held, not forwarded)."""
        for stream, d in self.directions.items():
            if self.gates[stream].is_open or stream in self._held_logged or d.src.fileno() < 0:
                continue
            try:
                state = tcp_state(d.src)
            except OSError:
                continue
            kind = {8: "fin", 7: "rst"}.get(state)
            if kind is not None:
                self._held_logged.add(stream)
                self.proxy.log.write(f"held_{kind}", conn=self.id, stream=stream)

    def info(self) -> ConnectionInfo:
        up, down = self.directions.get("upstream"), self.directions.get("downstream")
        if self.link is not None:
            bytes_up, bytes_down = self.link.counts()
        else:
            bytes_up, bytes_down = (up.bytes if up else 0), (down.bytes if down else 0)
        up_open, down_open = self.gates["upstream"].is_open, self.gates["downstream"].is_open
        if self.closing:
            state = "closing"
        elif self.blackholed:
            state = "blackholed"
        elif not up_open and not down_open:
            state = "frozen"
        elif not up_open:
            state = "frozen-upstream"
        elif not down_open:
            state = "frozen-downstream"
        elif not self.directions or (self.link is not None and self.link.connecting):
            state = "connecting"
        elif (up and up.eof_forwarded) or (down and down.eof_forwarded):
            state = "half-closed"
        else:
            state = "open"
        dropped_up, dropped_down, retransmits = self.drops()
        return ConnectionInfo(
            id=self.id,
            peer=self.peer,
            upstream=format_address(self.proxy.upstream),
            bytes_upstream=bytes_up,
            bytes_downstream=bytes_down,
            state=state,
            age_s=round(time.monotonic() - self.started, 3),
            dropped_upstream=dropped_up,
            dropped_downstream=dropped_down,
            retransmits=retransmits,
            loss={s: f * 100 for s, f in self.loss.items() if f} or None,
        )

    # -- lifecycle --

    async def run(self) -> None:
        """On the trio pumps: connect upstream, pump both ways until both EOFs have
        crossed (or a fault or a reset ends the connection: it cancels this scope)."""
        proxy = self.proxy
        how = "clean"
        try:
            with self._scope:
                try:
                    self.server = await proxy._connect_upstream()
                except OSError as exc:
                    how = "upstream_failed"
                    self._log_upstream_failed(str(exc) or type(exc).__name__)
                    return
                if self.loss["downstream"]:
                    self.refilter()  # loss applied while the upstream connect was pending
                self.directions = {
                    s: Direction(self, s, src, dst, self.gates[s], proxy._recv_buf)
                    for s, src, dst in (
                        ("upstream", self.client, self.server),
                        ("downstream", self.server, self.client),
                    )
                }
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for t in proxy.toxics:
                        self.attach_toxic(t)
                    for link in self.links.values():  # decided while connecting
                        if link is not None and link.toxic.name not in self._toxic_scopes:
                            self._start_toxic(link)
                    for d in self.directions.values():
                        nursery.start_soon(self._pump, d)
                self._nursery = None
        finally:
            self._finish(how)

    def _finish(self, how: str) -> None:
        """Close what is still open, forget the connection and log ``conn_close``; once
        (later calls do nothing). *how* unless a fault already said how it ends."""
        if self._done.is_set():
            return
        how = self.closing or how
        self._snapshot_drops()
        if self.link is not None:
            self.link.end()
        for sock in (self.client, self.server):
            if sock is not None and sock.fileno() >= 0:
                if how == "reset":
                    set_linger_reset(sock)
                if not self.in_plane:
                    trio.lowlevel.notify_closing(sock)
                sock.close()
        self._done.set()
        info = self.info()
        self.proxy._connections.pop(self.id, None)
        self.proxy.log.write(
            "conn_close",
            conn=self.id,
            how=how,
            bytes_upstream=info.bytes_upstream,
            bytes_downstream=info.bytes_downstream,
            age_s=info.age_s,
            dropped_upstream=info.dropped_upstream,
            dropped_downstream=info.dropped_downstream,
            retransmits=info.retransmits,
        )

    def _log_upstream_failed(self, reason: str) -> None:
        self.proxy.log.write(
            "upstream_failed",
            conn=self.id,
            upstream=format_address(self.proxy.upstream),
            reason=reason,
        )

    # -- the thread data plane --

    def start_in_plane(self, plane: planes.Plane) -> None:
        """On the thread data plane, right after the accept, in the trio thread: decide
        the toxics, start the upstream connect and hand both sockets to *plane*, which
        forwards once the connect completes. No task is started (but the host of any
        toxic's tasks); the plane's events end the connection."""
        for t in self.proxy.toxics:
            self.attach_toxic(t)
        target = self.proxy._upstream_target
        if target is None:  # a host name: resolve it first, in a task
            self._spawn(self._resolve_then_connect, plane)
        else:
            self._connect_in_plane(plane, *target)

    async def _resolve_then_connect(self, plane: planes.Plane) -> None:
        # Not in self._scope: that is the toxics' host's (a scope is entered once). A
        # connection ended meanwhile is seen by _connect_in_plane, or here.
        host, port = self.proxy.upstream
        try:
            with trio.fail_after(self.proxy.connect_timeout):
                # The family trio's connect on the other plane would pick.
                found = await trio.socket.getaddrinfo(
                    host, port, socket.AF_INET, socket.SOCK_STREAM
                )
        except trio.TooSlowError:
            if self.closing is None:
                self._upstream_failed(errno.ETIMEDOUT)
            return
        except OSError as exc:
            if self.closing is None:
                self._log_upstream_failed(str(exc) or type(exc).__name__)
                self._finish("upstream_failed")
            return
        family, _, _, _, sockaddr = found[0]
        self._connect_in_plane(plane, family, sockaddr)

    def _connect_in_plane(
        self, plane: planes.Plane, family: int, sockaddr: tuple[Any, ...]
    ) -> None:
        if self.closing is not None:
            return  # ended (and finished) while the name was resolved
        try:
            self.server = server = socket.socket(family, socket.SOCK_STREAM)
            server.setblocking(False)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = server.connect_ex(sockaddr)
        except OSError as exc:
            err = exc.errno or errno.EBADF
        if err not in (0, errno.EINPROGRESS):
            return self._upstream_failed(err)
        if self.loss["downstream"]:
            self.refilter()
        # No checkpoint from reading the gates to add(): a freeze cannot fall between.
        self.link = plane.add(
            self.client,
            server,
            self._on_plane_event,
            frozen=[s for s in STREAMS if not self.gates[s].is_open],
            to_trio=[s for s in STREAMS if self.wants_copy(s)],
            connect_timeout=self.proxy.connect_timeout,
        )
        self.directions = self.link.lanes
        if any(self.wants_copy(s) for s in STREAMS):
            self._ensure_host()

    def _upstream_failed(self, err: int) -> None:
        if err == errno.ETIMEDOUT:
            reason = f"no answer from upstream within {self.proxy.connect_timeout} s"
        else:
            reason = str(OSError(err, os.strerror(err)))
        self._log_upstream_failed(reason)
        self._finish("upstream_failed")

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run *fn* in a task of the proxy's, a failure contained to this connection."""
        nursery = self.proxy._nursery
        if nursery is not None:
            try:
                nursery.start_soon(self.proxy._contained, self, fn, *args)
                return
            except RuntimeError:  # "closed to new arrivals": the proxy is stopping
                pass
        self._finish("closed")  # no task can run for it: nothing is left to do

    def _ensure_host(self) -> None:
        """Start the task whose nursery runs this connection's toxics (once)."""
        if not self._hosted and not self._done.is_set():
            self._hosted = True
            self._spawn(self._host)

    async def _host(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for link in self.links.values():
                    if link is not None and link.toxic.name not in self._toxic_scopes:
                        self._start_toxic(link)
                # Every lane on the toxic path, not only those a toxic applies to now:
                # one added and removed before this task ran left its lane sending
                # bytes to trio that nobody took (a churning client hung, in the suite).
                for s in STREAMS:
                    if self.link is not None and self.link.on_toxic_path(s):
                        self._start_toxic_lane(s)
                await self._done.wait()
                nursery.cancel_scope.cancel()
        self._nursery = None

    def _start_toxic_lane(self, stream: str) -> None:
        assert self.link is not None and self._nursery is not None
        if stream in self._toxic_lanes:
            return
        self.link.to_trio(stream)
        lane = dataplane.ToxicLane(self.link, stream, self, self._wake_event)
        self._toxic_lanes[stream] = lane
        self._nursery.start_soon(lane.run)

    def _wake_event(self, stream: str) -> trio.Event:
        return self._wakes[stream]

    def _wake(self, stream: str) -> None:
        self._wakes[stream].set()
        self._wakes[stream] = trio.Event()

    def _on_plane_event(self, kind: str, stream: str | None) -> None:
        # In the trio thread, delivered in batches by the plane.
        try:
            self._plane_event(kind, stream)
        except Exception as exc:  # contained to this connection, as a task's would be
            self.proxy.log.write("conn_error", conn=self.id, error=repr(exc))
            self._end("reset")

    def _plane_event(self, kind: str, stream: str | None) -> None:
        if self._done.is_set():
            return  # ended meanwhile (a fault, or the proxy closing): nothing to act on
        if kind == planes.DONE:
            self._finish("clean")
        elif kind == planes.UPSTREAM_FAILED:
            assert self.link is not None
            self._upstream_failed(self.link.errno)
        elif kind == planes.ERROR:
            assert self.link is not None
            self.proxy.log.write("conn_error", conn=self.id, error=repr(self.link.error))
            self._end("reset")
        elif kind == planes.RESET:
            assert self.link is not None
            self.proxy.log.write(
                "peer_reset",
                conn=self.id,
                stream=stream,
                errno=errno.errorcode.get(self.link.errno, "?"),
            )
            self._end("reset")
        elif stream is not None:  # CHUNKS or DRAINED
            self._wake(stream)

    async def _pump(self, d: Direction) -> None:
        # except*: the copy path runs a reader task, so its errors come in a group.
        try:
            await d.run(self.proxy._splice, self.proxy._pipes)
        except* StreamReset as group:
            # One side reset (or failed): pass it on as an RST to the other side.
            cause = group.exceptions[0].__cause__
            self.proxy.log.write(
                "peer_reset",
                conn=self.id,
                stream=d.stream,
                errno=errno.errorcode.get(getattr(cause, "errno", 0) or 0, "?"),
            )
            self._end("reset")
        except* StreamClosed:
            pass


def _loss_program(fraction: float) -> bpf.Program | None:
    return bpf.drop_fraction(fraction) if fraction > 0 else None


#: How long a severed socket stays open after its FIN, reading and discarding, until the
#: peer's own FIN. A socket closed with its FIN still queued behind unsent bytes (a client
#: that reads slowly) is destroyed by the kernel, RST and all, as soon as one more segment
#: from the peer arrives (a late write, a retransmission of what a blackhole dropped):
#: the client then reads ECONNRESET, not EOF (issue 10 item 2, 15 of 15 tries).
SEVER_LINGER_S = 10.0


def _clean_fin(sock: socket.socket) -> None:
    """Send FIN, then drain what is unread so that close() does not turn it into an RST."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    try:
        for _ in range(64):  # bounded: at most 16 MiB discarded
            if not sock.recv(256 * 1024):
                break
    except OSError:
        pass


class Proxy:
    """A TCP proxy from ``listen`` to ``upstream`` with fault modes and toxics.

    Run it with ``await nursery.start(proxy.serve)`` or ``async with open_proxy(...)``.
    ``address`` is the bound address (port 0 becomes the real port). Thousands of
    connections at once are fine; the soft descriptor limit is raised to the hard one.

    ``splice=True`` (default on Linux) forwards connections no toxic applies to through
    kernel pipes, without copying bytes into Python; a connection moves to the copy path
    the first time a toxic applies to it and stays there.

    ``dataplane`` picks what moves the bytes: ``"thread"`` (one OS thread with its own
    epoll for every connection, :mod:`faultnet.planes.thread`: no trio task per connection
    and no trio task switch per message) or ``"trio"`` (a pump task per direction and a
    task per connection, :mod:`faultnet.pump`). The default is ``$FAULTNET_DATAPLANE``,
    else ``"thread"``. Fault semantics are the same; the test suite runs the proxy's
    tests on both.
    """

    def __init__(
        self,
        upstream: Address,
        listen: Address = ("127.0.0.1", 0),
        *,
        name: str = "proxy",
        event_log: str | None | JsonlWriter = None,
        seed: int | None = None,
        connect_timeout: float = 5.0,
        backlog: int = 4096,
        splice: bool = True,
        dataplane: str | None = None,
    ) -> None:
        self.name = name
        self.upstream = (upstream[0], int(upstream[1]))
        self.listen = (listen[0], int(listen[1]))
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.connect_timeout = connect_timeout
        #: (family, sockaddr) to connect to when the upstream host is an IP address
        #: (None: a name, resolved for each connection as trio's connect does).
        self._upstream_target = _ip_target(*self.upstream)
        self.backlog = backlog
        self.log = (
            event_log if isinstance(event_log, JsonlWriter) else JsonlWriter(event_log, proxy=name)
        )
        self.toxics: list[Toxic] = []
        self.address: Address | None = None
        self.fd_limit = raise_fd_limit()
        self._splice = splice and hasattr(os, "splice")
        self._pipes = PipePool()
        self.dataplane = dataplane or planes.default_plane()
        if self.dataplane not in ("trio", *planes.available_planes()):
            raise ValueError(
                f"dataplane must be one of trio, {', '.join(planes.available_planes())},"
                f" not {self.dataplane!r}"
            )
        self._plane: planes.Plane | None = None
        # The copy path's read buffer (a memoryview: slicing it copies nothing).
        self._recv_buf = memoryview(bytearray(CHUNK))
        self._listener: socket.socket | None = None
        self._connections: dict[int, Connection] = {}
        self._next_id = 1
        self._nursery: trio.Nursery | None = None
        self._accept_scope: trio.CancelScope | None = None
        self._frozen_new: tuple[str, ...] = ()
        self._blackhole_new = False
        self._syn_dropped = False
        self._syn_loss = 0.0
        self._partitioned: set[tuple[str, int | None]] = set()
        self._partition_all = False
        self._refusing = False
        self._closed = trio.Event()
        self._poll_scope: trio.CancelScope | None = None

    @property
    def event_log_path(self) -> str | None:
        return str(self.log.path) if self.log.path is not None else None

    # -- running --

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and proxy until :meth:`aclose` or cancellation. Reports the address.

        Raises :class:`ProxyError` before reporting if the address cannot be bound."""
        if self._listener is None:
            await self._bind()
        assert self.address is not None
        self.log.write(
            "listening",
            listen=format_address(self.address),
            upstream=format_address(self.upstream),
            seed=self.seed,
        )
        if self.dataplane != "trio":
            self._plane = planes.make_plane(self.dataplane, splice=self._splice)
            self._plane.start(trio.lowlevel.current_trio_token())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._start_accepting()
                task_status.started(self.address)
                await self._closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            # What is still listed has no task to cancel (thread plane): accepted after
            # aclose() looked, or serve() itself was cancelled. End it here, before the
            # plane stops: nothing may outlive the proxy (a socket left open until the
            # garbage collector found it, seen in the suite).
            for conn in list(self._connections.values()):
                conn._end("closed")
            if self._plane is not None:
                self._plane.stop()
                self._plane = None
            if self._listener is not None:
                trio.lowlevel.notify_closing(self._listener)
                self._listener.close()
                self._listener = None
            self._pipes.close()
            self.log.write("stopped")

    async def aclose(self) -> None:
        """Stop listening and close every connection (clean FIN, not a fault)."""
        for conn in list(self._connections.values()):
            conn._end("closed")
        self._closed.set()

    async def _bind(self) -> None:
        family = socket.AF_INET6 if ":" in self.listen[0] else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await sock.bind(self.address or self.listen)
        except OSError as exc:
            sock.close()
            raise listen_error(self.address or self.listen, exc) from None
        sock.listen(self.backlog)
        self._listener = socket.socket(fileno=sock.detach())
        self._listener.setblocking(False)
        self._refilter_listener()
        self.address = self._listener.getsockname()[:2]

    def _start_accepting(self) -> None:
        assert self._nursery is not None and self._listener is not None
        self._accept_scope = trio.CancelScope()
        self._nursery.start_soon(self._accept_loop, self._listener, self._accept_scope)

    def pause_accepting(self) -> None:
        """Stop calling ``accept()`` while the listener stays open, until
        :meth:`resume_accepting`.

        Not a fault mode: it is the classic mistake a fault mode must not be confused
        with. The kernel still completes handshakes into the backlog, so clients connect
        and then hear nothing (not a dropped SYN: see :meth:`drop_syn`). The control test
        uses it as a breakage that :func:`~faultnet.controls.assert_syn_dropped` must
        catch. Acts at once; a no-op when not accepting."""
        if self._accept_scope is not None:
            self._accept_scope.cancel()
            self._accept_scope = None

    def resume_accepting(self) -> None:
        """Undo :meth:`pause_accepting` (a no-op while refusing or not serving)."""
        if self._accept_scope is None and self._listener is not None and self._nursery is not None:
            self._start_accepting()

    async def _accept_loop(self, listener: socket.socket, scope: trio.CancelScope) -> None:
        # The listener is passed in, not read from self: refuse() may close it and
        # restore() bind a new one before this task first runs. Accepts come in batches
        # (one wake-up, up to _ACCEPT_BATCH accept() calls): trio's accept() costs a
        # scheduler pass each.
        with scope:
            while listener.fileno() >= 0:  # < 0: closed by refuse() before we ran
                await trio.lowlevel.wait_readable(listener)
                for _ in range(_ACCEPT_BATCH):
                    try:
                        client, addr = listener.accept()
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if listener.fileno() < 0 or exc.errno == errno.EBADF:
                            return  # closed under us by refuse(): its scope is cancelled
                        # EMFILE/ENFILE/ENOBUFS: out of descriptors or memory. Log, back
                        # off briefly, keep serving: one connection's trouble is not the
                        # proxy's.
                        self.log.write("accept_error", error=exc.strerror or str(exc))
                        await trio.sleep(0.05)
                        break
                    self._admit(client, addr)

    def _admit(self, client: socket.socket, addr: tuple[Any, ...]) -> None:
        """A connection just accepted: list it, log it and start it on the data plane."""
        assert self._nursery is not None
        client.setblocking(False)
        conn = Connection(self, self._next_id, client, format_address(addr))
        self._next_id += 1
        self._connections[conn.id] = conn
        self.log.write("conn_open", conn=conn.id, peer=conn.peer)
        if self._plane is None:
            self._nursery.start_soon(self._contained, conn, conn.run)
            return
        try:
            conn.start_in_plane(self._plane)
        except Exception as exc:
            self.log.write("conn_error", conn=conn.id, error=repr(exc))
            conn._end("reset")

    async def _contained(
        self, conn: Connection, fn: Callable[..., Awaitable[None]], *args: Any
    ) -> None:
        # One connection's failure is logged and contained: it never takes the proxy down.
        try:
            await fn(*args)
        except Exception as exc:
            self.log.write("conn_error", conn=conn.id, error=repr(exc))
            conn._end("reset")

    async def _connect_upstream(self) -> socket.socket:
        host, port = self.upstream
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        tsock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            with trio.fail_after(self.connect_timeout):
                await tsock.connect((host, port))
        except trio.TooSlowError:
            tsock.close()
            raise OSError(
                errno.ETIMEDOUT, f"no answer from upstream within {self.connect_timeout} s"
            ) from None
        except BaseException:
            tsock.close()
            raise
        tsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = socket.socket(fileno=tsock.detach())
        sock.setblocking(False)
        return sock

    # -- faults --

    async def apply(
        self,
        name: str,
        *,
        stream: str = "both",
        include_new: bool = False,
        only: Iterable[int] | None = None,
        percent: float | None = None,
        peer: str | None = None,
    ) -> int | None:
        """Apply the mode (or undo) *name* from :data:`faultnet.modes.MODES` with the
        arguments its row says it takes (a percent it is not given is the row's default);
        return how many connections it acted on (None
        for the listener modes). :class:`~faultnet.modes.ModeArgumentError` (a
        ValueError) for an unknown mode or an argument it does not take;
        :class:`~faultnet.addresses.AddressError` (a ValueError) for a bad *peer*.

        The same method as calling it by name, so it is total on return too."""
        m = mode(name)
        m.check(stream=stream, include_new=include_new, only=only, percent=percent, peer=peer)
        kwargs: dict[str, Any] = {}
        if m.takes_stream:
            kwargs["stream"] = stream
        if m.takes_include_new:
            kwargs["include_new"] = include_new
        if m.per_connection:
            kwargs["only"] = only
        if m.takes_percent:
            kwargs["percent"] = m.default_percent if percent is None else percent
        if m.takes_peer:
            kwargs["peer"] = peer
        result: int | None = await getattr(self, m.name)(**kwargs)
        return result if m.counts_connections else None

    # -- faults on live connections --

    def _live(self, only: Iterable[int] | None = None, peer: str | None = None) -> list[Connection]:
        """Open connections: all, or those whose ids are in *only* and/or whose client
        is *peer* (``HOST`` or ``HOST:PORT``; ValueError if it is not one)."""
        # A link the thread data plane has ended (both EOFs forwarded, or a reset) is not
        # live, though trio has not yet been told: faults count it out at once.
        if self._plane is not None:
            self._plane.settle()
        conns = [
            c
            for c in self._connections.values()
            if not c.closing and (c.link is None or not c.link.ended)
        ]
        if only is not None:
            wanted = set(only)
            conns = [c for c in conns if c.id in wanted]
        if peer is not None:
            selector = parse_peer(peer)
            conns = [c for c in conns if peer_matches(selector, c.peer_addr)]
        return conns

    async def freeze(
        self,
        stream: str = "both",
        *,
        include_new: bool = False,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Stop forwarding on every open connection (one stream or both), or on the
        connections whose ids are in *only* and/or whose client is *peer*; return how
        many.

        Total on return: not one more byte crosses. FIN and RST are held too.
        """
        return self._stop("freeze", _streams(stream), include_new, only, peer)

    async def blackhole(
        self,
        *,
        include_new: bool = False,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Freeze both ways and drop every packet from the client (no ACKs either), so the
        client's TCP sees a dead route: keepalive and TCP_USER_TIMEOUT fire."""
        return self._stop("blackhole", STREAMS, include_new, only, peer)

    def _stop(
        self,
        mode: str,
        streams: tuple[str, ...],
        include_new: bool,
        only: Iterable[int] | None,
        peer: str | None,
    ) -> int:
        conns = self._live(only, peer)
        crossed = dict.fromkeys(STREAMS, 0)  # what had crossed when the gates closed
        for c in conns:
            c.blackhole() if mode == "blackhole" else c.freeze(streams)
            for s, d in c.directions.items():
                crossed[s] += d.bytes
        if include_new and mode == "blackhole":
            self._blackhole_new = True
        elif include_new:
            self._frozen_new = tuple(sorted(set(self._frozen_new) | set(streams)))
        self._start_held_poll()
        self.log.write(
            "fault_applied",
            mode=mode,
            stream="both" if streams == STREAMS else streams[0],
            include_new=include_new,
            connections=[c.id for c in conns],
            bytes=crossed,
        )
        return len(conns)

    async def loss(
        self,
        percent: float,
        stream: str = "both",
        *,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Real segment loss on every open connection (or those in *only* / from
        *peer*): each segment arriving at the proxy on *stream* is dropped with
        probability *percent* / 100 by a socket filter, so the client's (``upstream``) or
        the server's (``downstream``) own TCP sees the loss and retransmits; bytes still
        arrive intact and in order. Live: replaces any loss already set there. Undone by
        :meth:`thaw`. Returns how many connections.

        The kernel draws the random (it cannot be seeded): what actually happened is in
        :meth:`connections` (``dropped_upstream``/``dropped_downstream``,
        ``retransmits``) and in each connection's ``conn_close`` record."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be between 0 and 100, not {percent}")
        streams = _streams(stream)
        conns = self._live(only, peer)
        for c in conns:
            c.set_loss(streams, percent / 100.0)
        self.log.write(
            "fault_applied",
            mode="loss",
            percent=percent,
            stream=stream,
            peer=peer,
            connections=[c.id for c in conns],
        )
        return len(conns)

    async def thaw(
        self,
        stream: str = "both",
        *,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Undo freeze, blackhole, loss and partition: held bytes are delivered in order,
        then any held FIN or RST. Also ends ``include_new`` for the thawed streams
        (unless *only* or *peer*), and a partition (of *peer*, or every one)."""
        streams = _streams(stream)
        conns = self._live(only, peer)
        for c in conns:
            c.thaw(streams)
        if only is None and peer is None:
            self._frozen_new = tuple(s for s in self._frozen_new if s not in streams)
            if stream == "both":
                self._blackhole_new = False
        if only is None and stream == "both" and (self._partitioned or self._partition_all):
            if peer is None:
                self._partitioned.clear()
                self._partition_all = False
            else:
                self._partitioned.discard(parse_peer(peer))
            self._refilter_listener()
        self.log.write(
            "fault_removed",
            mode="thaw",
            stream=stream,
            peer=peer,
            connections=[c.id for c in conns],
        )
        return len(conns)

    async def sever(self, *, only: Iterable[int] | None = None, peer: str | None = None) -> int:
        """Close every open connection (or those in *only* / from *peer*) with a clean
        FIN both ways (EOF at both peers)."""
        return self._end_all("severed", only, peer)

    async def reset(self, *, only: Iterable[int] | None = None, peer: str | None = None) -> int:
        """Close every open connection (or those in *only* / from *peer*) with an RST
        both ways (ECONNRESET at both peers)."""
        return self._end_all("reset", only, peer)

    def _end_all(self, how: str, only: Iterable[int] | None = None, peer: str | None = None) -> int:
        conns = self._live(only, peer)
        for c in conns:
            c._end(how)
        self.log.write("fault_applied", mode=how, peer=peer, connections=[c.id for c in conns])
        return len(conns)

    async def partition(self, *, peer: str | None = None) -> int:
        """A route that died outright, for the client *peer* (``HOST`` or ``HOST:PORT``)
        or for every client: its open connections are blackholed and its new connects
        hang (their SYNs dropped by the listener's filter), while other clients keep
        working. Undone by :meth:`thaw` (with the same *peer*, or none). Returns how many
        open connections it blackholed."""
        selector = parse_peer(peer) if peer is not None else None
        conns = self._live(peer=peer)
        for c in conns:
            c.blackhole()
        if selector is None:
            self._partition_all = True
        else:
            self._partitioned.add(selector)
        self._refilter_listener()
        self._start_held_poll()
        self.log.write(
            "fault_applied", mode="partition", peer=peer, connections=[c.id for c in conns]
        )
        return len(conns)

    # -- faults on new connections --

    async def drop_syn(self) -> None:
        """New connects hang: every SYN to the listener is dropped (a drop-all socket
        filter on it; unprivileged). Clients retry their SYN with backoff and connect on
        the first retry after :meth:`restore`; unrestored, a connect times out after
        about 134 s. Open connections are untouched."""
        self._syn_dropped = True
        self._refilter_listener()
        self.log.write("fault_applied", mode="drop_syn")

    async def syn_loss(self, percent: float) -> None:
        """Lossy handshakes: each SYN to the listener is dropped with probability
        *percent* / 100, so that fraction of new connects succeeds only on the kernel's
        SYN retry, about 1 s later (3 s, 7 s ... when the retry is dropped too): the
        slow, flaky connect real clients meet. Undone by :meth:`restore`."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be between 0 and 100, not {percent}")
        self._syn_loss = percent / 100.0
        self._refilter_listener()
        self.log.write("fault_applied", mode="syn_loss", percent=percent)

    def _refilter_listener(self) -> None:
        """Put on the listener the filter drop_syn, syn_loss and partition ask for."""
        if self._listener is None:
            return
        program = bpf.listener_program(
            drop_everything=self._syn_dropped or self._partition_all,
            syn_loss=self._syn_loss,
            peers=self._partitioned,
        )
        if program is None:
            detach_filter(self._listener)
        else:
            bpf.attach(self._listener, program)

    async def refuse(self) -> None:
        """New connects are refused at once (ECONNREFUSED): the listener is closed.
        :meth:`restore` listens again on the same port. Open connections are untouched.

        A client whose handshake the kernel had completed but the proxy not yet
        accepted (the accept queue) cannot be refused any more: its connection is reset
        (the kernel would do the same on close), so it reads ECONNRESET on its first
        read or write. Each such connection is accepted here, reset and logged as
        ``queued_reset`` with its peer, and counted in the ``fault_applied`` record."""
        if self._refusing:
            return
        self._refusing = True
        # Cancel the task parked in accept() before closing the socket under it.
        self.pause_accepting()
        queued: list[str] = []
        if self._listener is not None:
            trio.lowlevel.notify_closing(self._listener)
            listener, self._listener = self._listener, None
            try:
                while True:
                    try:
                        conn, addr = listener.accept()
                    except OSError:  # EAGAIN: the queue is empty
                        break
                    queued.append(format_address(addr))
                    set_linger_reset(conn)
                    conn.close()
                    self.log.write("queued_reset", peer=queued[-1])
            finally:
                listener.close()
        self.log.write("fault_applied", mode="refuse", queued_reset=len(queued))

    async def restore(self) -> None:
        """Undo drop_syn, syn_loss and refuse (a partition stays: see :meth:`thaw`).
        Raises ProxyError if the port was taken meanwhile."""
        self._syn_dropped = False
        self._syn_loss = 0.0
        if self._refusing:
            await self._bind()
            self._refusing = False
            self.resume_accepting()
        else:
            self._refilter_listener()
        self.log.write("fault_removed", mode="restore")

    # -- toxics --

    def add_toxic(self, toxic: Toxic) -> None:
        """Apply *toxic* at once to live connections (those its toxicity picks) and to
        new ones. Names are unique across both streams (ValueError otherwise).

        Atomic: when it returns the toxic is listed, in force on every live connection
        and logged; when it raises, none of that happened. A connection that is ending
        (its pumps done) takes part without starting anything."""
        if any(t.name == toxic.name for t in self.toxics):
            raise ValueError(f"toxic already exists: {toxic.name}")
        _streams(toxic.stream)
        self.toxics.append(toxic)
        try:
            for c in self._live():
                c.attach_toxic(toxic)
        except BaseException:
            # All or nothing: a toxic that is not on every live connection is on none.
            self.toxics.remove(toxic)
            for c in self._connections.values():
                c.detach_toxic(toxic.name)
            raise
        self.log.write(
            "toxic_added",
            toxic=toxic.name,
            type=toxic.type,
            stream=toxic.stream,
            toxicity=toxic.toxicity,
            attributes=toxic.attributes(),
        )

    def update_toxic(
        self, name: str, attributes: dict[str, Any] | None = None, toxicity: float | None = None
    ) -> Toxic:
        """Merge *attributes* into the toxic (read at the next chunk). A new toxicity
        applies to connections opened from now on; existing ones keep their decision."""
        toxic = self.get_toxic(name)
        if attributes:
            toxic.update(attributes)
        if toxicity is not None:
            toxic.toxicity = toxicity
        self.log.write(
            "toxic_updated", toxic=name, toxicity=toxic.toxicity, attributes=toxic.attributes()
        )
        return toxic

    def remove_toxic(self, name: str) -> Toxic:
        toxic = self.get_toxic(name)
        self.toxics.remove(toxic)
        for c in self._connections.values():
            c.detach_toxic(name)
        self.log.write("toxic_removed", toxic=name)
        return toxic

    def get_toxic(self, name: str) -> Toxic:
        for t in self.toxics:
            if t.name == name:
                return t
        raise KeyError(name)

    # -- observation --

    def connections(self) -> list[ConnectionInfo]:
        return [c.info() for c in list(self._connections.values())]

    @property
    def state(self) -> dict[str, Any]:
        return {
            "refusing": self._refusing,
            "syn_dropped": self._syn_dropped,
            "frozen_new": list(self._frozen_new),
            "blackhole_new": self._blackhole_new,
            "syn_loss": self._syn_loss * 100,
            "partitioned": ["*"] * self._partition_all
            + sorted(h if p is None else format_address((h, p)) for h, p in self._partitioned),
        }

    def _partitions(self, addr: tuple[str, int]) -> bool:
        """Whether a client at *addr* is cut off by a partition."""
        return self._partition_all or any(peer_matches(p, addr) for p in self._partitioned)

    def _close_after_fin(self, sock: socket.socket) -> None:
        """Send FIN on *sock* (a clean close), then close it once the peer's FIN has
        come or :data:`SEVER_LINGER_S` has passed, reading and discarding until then, so
        the peer reads every queued byte and then EOF, never an RST."""
        if self._nursery is None:
            _clean_fin(sock)
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        # The connection's socket object is closed (so its owner sees it gone); the
        # descriptor lives on in a task of the proxy's own.
        lingering = socket.socket(fileno=sock.detach())
        lingering.setblocking(False)
        try:
            self._nursery.start_soon(self._linger, lingering)
        except RuntimeError:  # the proxy is stopping: no task can start
            _clean_fin(lingering)
            lingering.close()

    async def _linger(self, sock: socket.socket) -> None:
        try:
            with trio.move_on_after(SEVER_LINGER_S):
                while True:
                    try:
                        if not sock.recv_into(self._recv_buf):
                            return  # the peer's FIN: both ways closed, nothing unread
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(sock)
                    except OSError:
                        return
        finally:
            trio.lowlevel.notify_closing(sock)
            sock.close()

    def _start_held_poll(self) -> None:
        if self._poll_scope is None and self._nursery is not None:
            self._poll_scope = trio.CancelScope()
            self._nursery.start_soon(self._held_poll, self._poll_scope)

    async def _held_poll(self, scope: trio.CancelScope) -> None:
        # FIN/RST behind held bytes cannot be seen without reading them, so ask the kernel
        # for each frozen socket's TCP state instead; only while something is frozen, and
        # at most _HELD_POLL_BATCH connections a tick (polling all 5,000 frozen
        # connections every 100 ms cost 21-30% of a core).
        with scope:
            sweep: list[Connection] = []
            while True:
                if not sweep:
                    sweep = [
                        c for c in self._live() if any(not g.is_open for g in c.gates.values())
                    ]
                    if not sweep and not self._frozen_new:
                        break
                batch, sweep = sweep[:_HELD_POLL_BATCH], sweep[_HELD_POLL_BATCH:]
                for c in batch:
                    if not c.closing:
                        c.held_closes()
                await trio.sleep(_HELD_CLOSE_POLL_S)
        self._poll_scope = None


def _ip_target(host: str, port: int) -> tuple[int, tuple[Any, ...]] | None:
    """(family, sockaddr) for an IP address *host*; None for a host name."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return (
        (socket.AF_INET6, (host, port, 0, 0)) if ip.version == 6 else (socket.AF_INET, (host, port))
    )


@asynccontextmanager
async def open_proxy(
    upstream: Address, listen: Address = ("127.0.0.1", 0), **kwargs: Any
) -> AsyncIterator[Proxy]:
    """Run a :class:`Proxy` for the duration of the block; closed on exit."""
    proxy = Proxy(upstream, listen, **kwargs)
    await proxy._bind()  # outside the nursery: a bind error arrives unwrapped
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        try:
            yield proxy
        finally:
            await proxy.aclose()
