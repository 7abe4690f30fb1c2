"""The TCP fault proxy: its listener, its connections, and the fault operations.

Every fault operation validates its arguments once, against the mode table
(:func:`faultnet.modes.request`), computes the new fault state of what it acts on
(:mod:`faultnet.proxy._faultstate`) and makes it so; then it writes one record.
"""

from __future__ import annotations

import bisect
import collections
import errno
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Unpack

import trio

from faultnet import bpf, planes
from faultnet.addresses import format_address, peer_matches
from faultnet.eventlog import JsonlWriter
from faultnet.modes import FaultRequest, ModeArguments, request
from faultnet.proxy import _sharedplane
from faultnet.proxy._connection import Connection, ConnectionInfo
from faultnet.proxy._errors import listen_error
from faultnet.proxy._faultstate import (
    ALL,
    STREAMS,
    Condition,
    FaultState,
    ListenerFaults,
    NewConnectionFaults,
)
from faultnet.proxy._reserve import DescriptorReserve
from faultnet.proxy._toxicbatch import ToxicBatch
from faultnet.proxybase import ProxyBase
from faultnet.sockopts import (
    bound_unsent,
    detach_filter,
    set_linger_reset,
    set_nodelay,
)
from faultnet.toxics.base import Toxic

__all__ = ["SEVER_LINGER_S", "Proxy", "open_proxy"]

Address = tuple[str, int]

#: How often held FINs/RSTs are looked for on frozen connections (TCP_INFO polls).
_HELD_CLOSE_POLL_S = 0.1
_HELD_POLL_BATCH = 256
#: Connections accepted per wake-up of the accept loop before other tasks get a turn.
_ACCEPT_BATCH = 64
#: Bytes a lingering severed socket reads (and discards) at a time.
_LINGER_READ = 256 * 1024
#: How long a blackhole waits for the client's ACKs of what was in flight (its delayed
#: ACK: 40 ms to 200 ms on Linux), and how often it looks.
_DRAIN_BOUND_S = 0.5
_DRAIN_POLL_S = 0.002

#: How long a severed socket stays open after its FIN, reading and discarding, until the
#: peer's own FIN. A socket closed with its FIN still queued behind unsent bytes (a client
#: that reads slowly) is destroyed by the kernel, RST and all, as soon as one more segment
#: from the peer arrives (a late write, a retransmission of what a blackhole dropped):
#: the client then reads ECONNRESET, not EOF (issue 10 item 2, 15 of 15 tries).
SEVER_LINGER_S = 10.0


_discarded: bytearray | None = None


def _discard_buffer() -> bytearray:
    """Where lingering sockets' reads go, shared by every proxy of the process (what is
    read is thrown away) and made at the first linger. A buffer per proxy, made with the
    proxy, was 256 KiB of each proxy's RSS: 250 MiB of a server with 1,000 (issue 36)."""
    global _discarded
    if _discarded is None:
        _discarded = bytearray(_LINGER_READ)
    return _discarded


def _clean_fin(sock: socket.socket) -> None:
    """Send FIN, then drain what is unread so that close() does not turn it into an RST."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    try:
        for _ in range(64):  # bounded: at most 16 MiB discarded
            if not sock.recv(_LINGER_READ):
                break
    except OSError:
        pass


class _ConnectionTable(dict[int, Connection]):
    """The proxy's connections by id (in accept order: ids increase), and how many are
    in each fault state, kept rather than recounted.

    A connection is counted under its fault state's label when it is listed
    (``table[id] = conn``), moved when the proxy has applied a transition to it
    (:meth:`relabel`), and uncounted when it leaves (``pop``: what
    :meth:`Connection._finish` calls). The label each one is counted under is kept
    beside it, so a connection that leaves in the middle of a transition (its hop could
    not be made) is uncounted from where it was counted. So a fault answer reads the
    counts at a cost that does not grow with the connections: recounting them, one
    ``ConnectionInfo`` each, was ~75 % of a freeze answer with 9,000 connections
    (issue 36). Only ``table[id] = conn`` and ``pop`` may add and remove."""

    def __init__(self) -> None:
        super().__init__()
        self._counted: dict[int, str] = {}
        self.labels: collections.Counter[str] = collections.Counter()

    def __setitem__(self, conn_id: int, conn: Connection) -> None:
        assert conn_id not in self, conn_id  # listed once: ids are never reused
        super().__setitem__(conn_id, conn)
        self._count(conn_id, conn.faults.label)

    def pop(self, conn_id: int, default: Any = None) -> Any:
        label = self._counted.pop(conn_id, None)
        if label is not None:
            self.labels[label] -= 1
        return super().pop(conn_id, default)

    def relabel(self, conn: Connection) -> None:
        """Count *conn* under its fault state's label now (after a transition)."""
        new = conn.faults.label
        old = self._counted.get(conn.id)
        if old is not None and old != new:
            self._counted[conn.id] = new
            labels = self.labels
            labels[old] -= 1
            labels[new] += 1

    def _count(self, conn_id: int, label: str) -> None:
        self._counted[conn_id] = label
        self.labels[label] += 1


def _links(conns: list[Connection]) -> list[planes.Link]:
    """The plane's links of *conns* (each listed by ``enter_gated``: it has one)."""
    return [c.link for c in conns if c.link is not None]


class Proxy(ProxyBase):
    """A TCP proxy from ``listen`` to ``upstream`` with fault modes and toxics.

    Run it with ``await nursery.start(proxy.serve)`` or ``async with open_proxy(...)``.
    ``address`` is the bound address (port 0 becomes the real port). Thousands of
    connections at once are fine; the soft descriptor limit is raised to the hard one,
    and a reserve beneath it is kept free for the API: a client past it is reset at once
    (:mod:`faultnet.proxy._reserve`).

    ``dataplane`` names what moves the bytes (:mod:`faultnet.planes`: a plane in
    :data:`faultnet.planes.PLANES`); the default is ``$FAULTNET_DATAPLANE``, else the
    fastest plane available here. Fault semantics are the same on every plane.
    ``splice=True`` (default on Linux) lets the plane move bursts through kernel pipes
    without copying them into the process.
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
        super().__init__(upstream, listen, name=name, event_log=event_log, seed=seed)
        self.connect_timeout = connect_timeout
        #: (family, sockaddr) to connect to when the upstream host is an IP address
        #: (None: a name, resolved for each connection).
        self._upstream_target = _ip_target(*self.upstream)
        self.backlog = backlog
        self.toxics: list[Toxic] = []
        #: Connections past the descriptor limit's reserve are reset at once.
        self._fd_reserve = DescriptorReserve(self.fd_limit, self.log)
        #: An accept() error episode is under way (logged once, at its start).
        self._accept_failing = False
        self._splice = splice and hasattr(os, "splice")
        # Checked now, though the plane is made by serve(): a wrong name is the caller's.
        self.dataplane = planes.check_plane(dataplane or planes.default_plane())
        self._plane: planes.Plane | None = None
        self._listener: socket.socket | None = None
        #: The connections and their kept counts; ``_connections`` is the same table as
        #: the plain dict a Connection knows it as (its Host protocol).
        self._table = _ConnectionTable()
        self._connections: dict[int, Connection] = self._table
        self._next_id = 1
        self._nursery: trio.Nursery | None = None
        self._accept_scope: trio.CancelScope | None = None
        #: The faults new connections start with, and the listener's.
        self._new = NewConnectionFaults()
        self._listener_faults = ListenerFaults()
        self._closed = trio.Event()
        self._poll_scope: trio.CancelScope | None = None

    # -- running --

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and proxy until :meth:`aclose` or cancellation. Reports the address.

        Raises :class:`ProxyError` before reporting if the address cannot be bound."""
        if self._listener is None:
            await self._bind()
        assert self.address is not None
        self.log_listening(dataplane=self.dataplane)
        # The run's plane of this kind, shared with every other proxy that chose it.
        self._plane = _sharedplane.acquire(self.dataplane, splice=self._splice)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._start_accepting()
                task_status.started(self.address)
                await self._closed.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            # What is still listed: accepted after aclose() looked, or serve() itself was
            # cancelled. End it here: nothing may outlive the proxy (a socket left open
            # until the garbage collector found it, seen in the suite). These are this
            # proxy's links, the only ones its stop ends; the plane goes on for the
            # other proxies that share it, and stops with the last of them.
            for conn in list(self._connections.values()):
                conn.leave()
            _sharedplane.release(self._plane)
            self._plane = None
            if self._listener is not None:
                trio.lowlevel.notify_closing(self._listener)
                self._listener.close()
                self._listener = None
            self.log.write("stopped")

    async def aclose(self) -> None:
        """Stop listening and end every connection: a clean FIN each way where all it
        was given has been passed on, an RST each way where bytes were still in flight
        (never a FIN after a cut-short stream: :meth:`Connection.leave`)."""
        for conn in list(self._connections.values()):
            conn.leave()
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
                        # EMFILE/ENFILE/ENOBUFS: out of descriptors or memory (the
                        # reserve makes it rare: something else took them). Log once
                        # per episode, back off briefly, keep serving.
                        if not self._accept_failing:
                            self._accept_failing = True
                            self.log.write("accept_error", error=exc.strerror or str(exc))
                        await trio.sleep(0.05)
                        break
                    self._accept_failing = False
                    self._admit(client, addr)

    def _admit_queued(self) -> None:
        """Accept and admit every connection waiting in the listener's accept queue.

        A fault on the open connections acts on what the clients have: a client's
        ``connect()`` returns once the kernel has the connection in the queue, before
        the accept loop's next turn, so without this a connect and a fault at once left
        the connection out (the fidelity run's lossy downloads: 3 of 20 through no loss
        at all). Not while accepting is paused: the queue is then the point."""
        if self._accept_scope is None or self._listener is None:
            return
        while True:
            try:
                client, addr = self._listener.accept()
            except OSError:  # EAGAIN: the queue is empty (an accept error: the loop logs it)
                return
            self._admit(client, addr)

    def _admit(self, client: socket.socket, addr: tuple[Any, ...]) -> None:
        """A connection just accepted: list it, log it and start it on the plane."""
        assert self._plane is not None
        if not self._fd_reserve.admits(client):
            return  # reset at once: carrying it would take the reserve's descriptors
        client.setblocking(False)
        set_nodelay(client)  # a toxic's split writes must not meet delayed ACK: see sockopts
        bound_unsent(client)  # what a freeze lets through is bounded: see sockopts
        try:
            peer_addr = client.getpeername()[:2]
        except OSError:  # already reset by the client: no peer selector matches it
            peer_addr = ("", 0)
        conn = Connection(
            self,
            self._next_id,
            client,
            format_address(addr),
            self._new.for_peer(peer_addr),
            inherited=self._listener_faults.program(self._new),
        )
        self._next_id += 1
        self._connections[conn.id] = conn
        self.log.write("conn_open", conn=conn.id, peer=conn.peer)
        try:
            conn.start(self._plane)
        except Exception as exc:
            self.log.write("conn_error", conn=conn.id, error=repr(exc))
            conn.end("reset")

    async def _contained(
        self, conn: Connection, fn: Callable[..., Awaitable[None]], *args: Any
    ) -> None:
        # One connection's failure is logged and contained: it never takes the proxy down.
        try:
            await fn(*args)
        except Exception as exc:
            self.log.write("conn_error", conn=conn.id, error=repr(exc))
            conn.end("reset")

    # -- faults --

    async def apply(self, name: str, **arguments: Unpack[ModeArguments]) -> int | None:
        """Apply the mode (or undo) *name* from :data:`faultnet.modes.MODES` with the
        arguments its row says it takes (stream, include_new, only, percent, peer,
        both_ways: one not given is the row's default); return how many connections it
        acted on (None for the listener modes).
        :class:`~faultnet.modes.ModeArgumentError` (a ValueError) for an unknown mode, an
        argument it does not take or a bad value, *peer* included.

        The same as calling the method of that name: total on return too."""
        return await self.apply_request(request(name, **arguments))

    async def apply_request(self, req: FaultRequest) -> int | None:
        """Apply a request :func:`faultnet.modes.request` has validated (the one check);
        what it does around its operation is what its row says."""
        row = req.mode
        if row.rebinds_listener and self._listener_faults.refusing:
            # The one operation that waits: listening again (ProxyError if the port was
            # taken meanwhile, and then nothing has changed).
            await self._bind()
        if row.counts_connections:
            self._admit_queued()
        result = _OPERATIONS[row.name](self, req)
        if row.drains:
            await self._drain()
        return result if row.counts_connections else None

    async def _drain(self) -> None:
        """Wait (at most :data:`_DRAIN_BOUND_S`) until no blackholed connection is
        still letting its client's ACKs in (the client has acknowledged all it was
        sent: its delayed ACK, 40-200 ms on Linux), then force drop-all on any left."""
        pending = [c for c in self._connections.values() if not c.drained()]
        deadline = trio.current_time() + _DRAIN_BOUND_S
        while pending and trio.current_time() < deadline:
            await trio.sleep(_DRAIN_POLL_S)
            pending = [c for c in pending if not c.drained()]
        for c in pending:
            c.drained(give_up=True)

    def _live(self, only: Iterable[int] | None = None, peer: Any = None) -> list[Connection]:
        """Open connections: all, or those whose ids are in *only* and/or whose client
        matches the selector *peer* (a parsed ``HOST[:PORT]``)."""
        # A link the plane has ended (both EOFs forwarded, or a reset) is not live,
        # though trio has not yet been told: faults count it out at once.
        if self._plane is not None:
            self._plane.settle()
        conns = [c for c in self._connections.values() if c.live]
        if only is not None:
            wanted = set(only)
            conns = [c for c in conns if c.id in wanted]
        if peer is not None:
            conns = [c for c in conns if peer_matches(peer, c.peer_addr)]
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
        many. ``include_new`` also freezes connections accepted later, until thaw.

        Total on return: not one more byte crosses. FIN and RST are held too.
        """
        return await self._counted(
            "freeze", stream=stream, include_new=include_new, only=only, peer=peer
        )

    async def blackhole(
        self,
        *,
        include_new: bool = False,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Freeze both ways and drop every packet from the client (no ACKs either), so the
        client's TCP sees a dead route: keepalive and TCP_USER_TIMEOUT fire. Each stream
        is thawed on its own (``thaw(stream)``); the drop filter stays while either
        stream is still blackholed.

        From the return on, the client is sent nothing: before it, the client's bare
        ACKs are let in until it has acknowledged every segment the proxy's kernel had
        sent it (its delayed ACK: up to 0.5 s waited), so nothing is left to retransmit
        to it. What remains: bytes the proxy's kernel had queued but not sent (a window
        the client had closed) keep zero-window probes going to the client, and the
        wait gives up after 0.5 s, leaving what is still in flight to be retransmitted."""
        return await self._counted("blackhole", include_new=include_new, only=only, peer=peer)

    async def loss(
        self,
        percent: float,
        stream: str = "both",
        *,
        both_ways: bool = False,
        include_new: bool = False,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Real segment loss on every open connection (or those in *only* / from
        *peer*; ``include_new`` also on connections accepted later, until thaw): TCP
        itself sees the loss and retransmits; bytes still arrive intact and in order.
        Live: replaces any loss already set there. Undone by :meth:`thaw`. Returns how
        many connections.

        Which way it loses. By default (one way) only segments arriving at the proxy,
        never the proxy's own: each segment arriving on *stream* is dropped with
        probability *percent* / 100 by a socket filter. ``downstream`` drops what the
        server sends (its data, and its ACKs of upstream bytes); ``upstream`` what the
        client sends; ``both`` both, so each stream's data and its receiver's ACKs are
        lost, each on a different leg, and the proxy's data to the client (on a
        download) is never lost. Held against the kernel's own random drop (the
        fidelity table), ``downstream`` matches a route losing the server's segments,
        while a route losing both ways recovers far more slowly than one-way ``both``
        (a lost ACK of a retransmission costs the route an RTO, the proxy's legs never).

        With ``both_ways=True`` (stream both only) the loss is a lossy route's: the
        connection's bytes cross an internal loopback hop whose two ends both drop
        *percent* of what arrives (faultnet/proxy/_hop.py), so segments travelling
        either way are lost, data and ACKs, and the hop's TCP retransmits and backs off
        as a real route's would; the client-facing and upstream sockets lose nothing.
        Judged against the kernel's two-way random drop (the fidelity table). Its
        costs: a connection once on the hop stays on it (thaw takes its loss off, the
        hop stays, lossless), and its bytes go through trio (the toxic path), slower
        than the plane alone.

        The kernel draws the random (it cannot be seeded): what actually happened is in
        :meth:`connections` (``dropped_upstream``/``dropped_downstream``,
        ``retransmits``; on the hop ``hop_dropped``, ``hop_retransmits``) and in each
        connection's ``conn_close`` record."""
        return await self._counted(
            "loss",
            percent=percent,
            stream=stream,
            both_ways=both_ways,
            include_new=include_new,
            only=only,
            peer=peer,
        )

    async def thaw(
        self,
        stream: str = "both",
        *,
        only: Iterable[int] | None = None,
        peer: str | None = None,
    ) -> int:
        """Undo freeze, blackhole, loss and partition on *stream* (or both): held bytes
        are delivered in order, then any held FIN or RST. Also thaws those streams of
        ``include_new`` (unless *only* or *peer*) and of every partition (of *peer*'s,
        with *peer*); a partition whose streams are all thawed has ended. Thawing one
        stream and then the other ends exactly where thawing both at once does. A
        connection that two-way loss put on its internal hop stays on it, the hop's
        filters off (while one stream still has a two-way loss, the hop keeps it)."""
        return await self._counted("thaw", stream=stream, only=only, peer=peer)

    async def sever(self, *, only: Iterable[int] | None = None, peer: str | None = None) -> int:
        """Close every open connection (or those in *only* / from *peer*) with a clean
        FIN both ways (EOF at both peers)."""
        return await self._counted("sever", only=only, peer=peer)

    async def reset(self, *, only: Iterable[int] | None = None, peer: str | None = None) -> int:
        """Close every open connection (or those in *only* / from *peer*) with an RST
        both ways (ECONNRESET at both peers).

        This is the peer aborting, as ``ss -K`` on the server's socket (or a process
        that dies with SO_LINGER 0): the RST is sent at once, so a client parked in
        ``recv`` sees ECONNRESET within ms. It is not a firewall's reject (nft ``reject
        with tcp reset``), which answers only a segment the client sends: there a
        client parked in ``recv`` sees nothing at all (the fidelity table)."""
        return await self._counted("reset", only=only, peer=peer)

    async def partition(self, *, peer: str | None = None) -> int:
        """A route that died outright, for the client *peer* (``HOST`` or ``HOST:PORT``)
        or for every client: its open connections are blackholed and its new connects
        hang (their SYNs dropped by the listener's filter), while other clients keep
        working. Undone by :meth:`thaw` (with the same *peer*, or none). Returns how many
        open connections it blackholed."""
        return await self._counted("partition", peer=peer)

    async def drop_syn(self) -> None:
        """New connects hang: every SYN to the listener is dropped (a drop-all socket
        filter on it; unprivileged). Clients retry their SYN with backoff and connect on
        the first retry after :meth:`restore`; unrestored, a connect times out after
        about 134 s. Open connections are untouched."""
        await self._call("drop_syn")

    async def syn_loss(self, percent: float) -> None:
        """Lossy handshakes: each SYN to the listener is dropped with probability
        *percent* / 100, so that fraction of new connects succeeds only on the kernel's
        SYN retry, about 1 s later, or on a later one when the retry is dropped too (when:
        :func:`faultnet.controls.syn_retry_schedule`, from the running kernel's settings;
        1, 2, 3, 4, 5, 7 s ... here): the slow, flaky connect real clients meet. Undone
        by :meth:`restore`."""
        await self._call("syn_loss", percent=percent)

    async def refuse(self) -> None:
        """New connects are refused at once (ECONNREFUSED): the listener is closed.
        :meth:`restore` listens again on the same port. Open connections are untouched.

        A client whose handshake the kernel had completed but the proxy not yet
        accepted (the accept queue) cannot be refused any more: its connection is reset
        (the kernel would do the same on close), so it reads ECONNRESET on its first
        read or write. Each such connection is accepted here, reset and logged as
        ``queued_reset`` with its peer, and counted in the ``fault_applied`` record."""
        await self._call("refuse")

    async def restore(self) -> None:
        """Undo drop_syn, syn_loss and refuse (a partition stays: see :meth:`thaw`).
        Raises ProxyError if the port was taken meanwhile."""
        await self._call("restore")

    async def _counted(self, name: str, **arguments: object) -> int:
        """Apply mode *name* of those that count (its row's ``result_key``): how many
        open connections it acted on."""
        acted = await self.apply_request(request(name, **arguments))
        # Never None: such a row's operation returns a count (test_modes applies each).
        assert acted is not None, name
        return acted

    async def _call(self, name: str, **arguments: object) -> None:
        """Apply mode *name* of the listener's (no count)."""
        await self.apply_request(request(name, **arguments))

    # The operations, one per mode, each given a validated request. Synchronous: no
    # checkpoint inside, so each is atomic with respect to the other trio tasks.

    def _gate(self, req: FaultRequest) -> tuple[list[Connection], dict[str, int]]:
        """Close the gates of mode *req* on the connections it names; return them and
        the bytes that had crossed each stream when the gates closed."""
        conns = self._live(req.only, req.peer)
        gates, up, down = self._step_gates(conns, req.mode.name, req.streams, opening=False)
        for closing, gated in gates.items():
            assert self._plane is not None  # a listed link is in the plane
            u, d = self._plane.freeze(_links(gated), closing)
            up += u
            down += d
        return conns, dict(zip(STREAMS, (up, down), strict=True))

    def _step_gates(
        self, conns: list[Connection], mode: str, streams: tuple[str, ...], *, opening: bool
    ) -> tuple[dict[frozenset[str], list[Connection]], int, int]:
        """Step each of *conns* by *mode*. One whose step only closes gates (only opens
        them, with *opening*) is left for one plane call per set of streams (returned:
        those streams -> those connections); each other one makes its own transition
        (returned: the bytes those had crossed, upstream and downstream).

        Per connection, its own transition and counts were ~4.6 us of CPU for a freeze
        (3,000 idle connections: 14 ms; issue 36's 9,000: 77 ms through the API against
        60), its own thaw ~20 us of wall (a mutex and GIL hand-off each). Each state's
        next one, and the gates it closes or opens, is worked out once per distinct
        state, keyed by the state object (states are shared: FaultState.apply is
        cached), its entry holding it alive so the id is not reused: FaultState's hash is
        a Python call, ~700 instructions a connection."""
        up = down = 0
        plan: dict[int, tuple[FaultState, FaultState, frozenset[str] | None]] = {}
        gates: collections.defaultdict[frozenset[str], list[Connection]] = collections.defaultdict(
            list
        )
        for c in conns:
            before = c.faults
            step = plan.get(id(before))
            if step is None or step[0] is not before:
                after = before.apply(mode, streams)
                closes = after.closed() - before.closed()
                opens = before.closed() - after.closed()
                gated, other = (opens, closes) if opening else (closes, opens)
                step = plan[id(before)] = (before, after, None if other else gated)
            if c.enter_gated(step[1], step[2], gates):
                self._table.relabel(c)
                continue
            self._transition(c, mode, streams)
            if not opening:
                u, d = c.counts()  # (upstream, downstream): STREAMS' order
                up += u
                down += d
        return gates, up, down

    def _transition(
        self,
        c: Connection,
        mode: str,
        streams: tuple[str, ...],
        fraction: float = 0.0,
        both_ways: bool = False,
    ) -> None:
        """Apply the transition *mode* to *c*, and count it under its new label: the
        one way a connection's fault state changes once it is listed (but for a freeze
        that only closes gates, which :meth:`_gate` batches)."""
        c.apply(mode, streams, fraction, both_ways)
        self._table.relabel(c)

    def _stop(self, req: FaultRequest) -> int:
        """freeze and blackhole on the connections, and include_new."""
        conns, crossed = self._gate(req)
        if req.include_new:
            self._new.apply(req.mode.name, req.streams)
        self._start_held_poll()
        self.log.write(
            "fault_applied",
            mode=req.mode.name,
            stream=req.stream,
            include_new=req.include_new,
            connections=[c.id for c in conns],
            bytes=crossed,
        )
        return len(conns)

    def _partition(self, req: FaultRequest) -> int:
        """A blackhole of the peer's (or every) open connection, and its new SYNs dropped."""
        conns, _ = self._gate(req)
        self._new.partition(req.peer or ALL)
        self._refilter_listener()
        self._start_held_poll()
        self.log.write(
            "fault_applied",
            mode=req.mode.name,
            peer=req.peer_text,
            connections=[c.id for c in conns],
        )
        return len(conns)

    def _loss(self, req: FaultRequest) -> int:
        assert req.percent is not None  # the row's default where none was given
        conns = self._live(req.only, req.peer)
        fraction = req.percent / 100.0
        for c in conns:
            self._transition(c, "loss", req.streams, fraction, req.both_ways)
        if req.include_new:
            self._new.apply("loss", req.streams, fraction, req.both_ways)
        self.log.write(
            "fault_applied",
            mode="loss",
            percent=req.percent,
            stream=req.stream,
            both_ways=req.both_ways,
            include_new=req.include_new,
            peer=req.peer_text,
            connections=[c.id for c in conns],
        )
        return len(conns)

    def _thaw(self, req: FaultRequest) -> int:
        conns = self._live(req.only, req.peer)
        gates, _, _ = self._step_gates(conns, "thaw", req.streams, opening=True)
        for opened, gated in gates.items():
            assert self._plane is not None  # a listed link is in the plane
            if opened:  # else a thaw of open connections: no gate to open
                self._plane.thaw(_links(gated), opened)
            for c in gated:
                c.woken(opened)
        if req.only is None:
            before = self._new.syn_dropped_peers()
            self._new.thaw(req.streams, req.peer)
            if self._new.syn_dropped_peers() != before:
                self._refilter_listener()
        self.log.write(
            "fault_removed",
            mode="thaw",
            stream=req.stream,
            peer=req.peer_text,
            connections=[c.id for c in conns],
        )
        return len(conns)

    def _end_all(self, req: FaultRequest, how: str) -> int:
        """End the connections *req* names: *how* is "severed" (FIN) or "reset" (RST)."""
        conns = self._live(req.only, req.peer)
        for c in conns:
            c.end(how)
        self.log.write(
            "fault_applied", mode=how, peer=req.peer_text, connections=[c.id for c in conns]
        )
        return len(conns)

    def _drop_syn(self, req: FaultRequest) -> None:
        self._listener_faults.syn_dropped = True
        self._refilter_listener()
        self.log.write("fault_applied", mode="drop_syn")

    def _syn_loss(self, req: FaultRequest) -> None:
        assert req.percent is not None  # the row's default where none was given
        self._listener_faults.syn_loss = req.percent / 100.0
        self._refilter_listener()
        self.log.write("fault_applied", mode="syn_loss", percent=req.percent)

    def _refuse(self, req: FaultRequest) -> None:
        if self._listener_faults.refusing:
            return
        self._listener_faults.refusing = True
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

    def _restore(self, req: FaultRequest) -> None:
        # A refusing listener was bound again by apply_request before this.
        refusing = self._listener_faults.refusing
        self._listener_faults = ListenerFaults()
        self._refilter_listener()  # what partitions still drop stays
        if refusing:
            self.resume_accepting()
        self.log.write("fault_removed", mode="restore")

    def _refilter_listener(self) -> None:
        """Put on the listener the filter its faults and the partitions ask for."""
        if self._listener is None:
            return
        program = self._listener_faults.program(self._new)
        if program is None:
            detach_filter(self._listener)
        else:
            bpf.attach(self._listener, program)

    # -- toxics --

    def add_toxic(self, toxic: Toxic) -> None:
        """Apply *toxic* at once to live connections (those its toxicity picks) and to
        new ones. Names are unique across both streams (ValueError otherwise).

        Atomic: when it returns the toxic is listed, in force on every live connection
        and logged; when it raises, none of that happened. A connection that is ending
        takes part without starting anything."""
        if any(t.name == toxic.name for t in self.toxics):
            raise ValueError(f"toxic already exists: {toxic.name}")
        if toxic.stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, not {toxic.stream!r}")
        self.toxics.append(toxic)
        try:
            # One pass, one hand-off to the plane (see _toxicbatch).
            batch = ToxicBatch(toxic, self._plane)
            for c in self._live():
                c.attach_toxic(toxic, batch)
            batch.hand_off(self._plane, adding=True)
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
            # A compiled stage reads its attributes from here: one pass, one hand-off
            # for those the plane runs as a stream's whole chain (see _toxicbatch).
            batch = ToxicBatch(toxic, self._plane)
            for c in list(self._connections.values()):
                c.toxic_updated(name, batch)
            batch.hand_off(self._plane, adding=True)
        if toxicity is not None:
            toxic.toxicity = toxicity
        self.log.write(
            "toxic_updated", toxic=name, toxicity=toxic.toxicity, attributes=toxic.attributes()
        )
        return toxic

    def remove_toxic(self, name: str) -> Toxic:
        toxic = self.get_toxic(name)
        self.toxics.remove(toxic)
        batch = ToxicBatch(toxic, self._plane)  # one pass, one hand-off (see _toxicbatch)
        for c in self._connections.values():
            c.detach_toxic(name, batch)
        batch.hand_off(self._plane, adding=False)
        self.log.write("toxic_removed", toxic=name)
        return toxic

    def get_toxic(self, name: str) -> Toxic:
        for t in self.toxics:
            if t.name == name:
                return t
        raise KeyError(name)

    # -- observation --

    def connections(self, *, after: int = 0, limit: int | None = None) -> list[ConnectionInfo]:
        """The listed connections in accept order (ids increase), each read now: all, or
        a page of at most *limit* whose ids come after *after* (ask again with the last
        id for the next page). Only the page's connections are read."""
        conns = list(self._connections.values())
        start = bisect.bisect_right(conns, after, key=lambda c: c.id) if after else 0
        stop = len(conns) if limit is None else start + limit
        return [c.info() for c in conns[start:stop]]

    def connection_counts(self) -> dict[str, int]:
        """How many listed connections are in each fault state (label: count; ``open``:
        no fault), at a cost that does not grow with them (see :class:`_ConnectionTable`).
        Whether an unfaulted one is still connecting or half-closed is the plane's to
        know: :meth:`connections` reads it per connection."""
        return {label: n for label, n in self._table.labels.items() if n}

    def missing_connections(self, ids: Iterable[int]) -> list[int]:
        """Those of *ids* that name no live connection (not listed, or being ended)."""
        table = self._table
        return [i for i in ids if i not in table or table[i].closing is not None]

    @property
    def state(self) -> dict[str, Any]:
        """The faults on new connections and on the listener (read from their state)."""
        everyone, peers = self._new.syn_dropped_peers()
        default = self._new.default
        return {
            "refusing": self._listener_faults.refusing,
            "syn_dropped": self._listener_faults.syn_dropped,
            "frozen_new": default.conditions(Condition.FROZEN),
            "blackhole_new": default.blackholed(),
            "loss_new": default.loss_percent(),
            "loss_new_both_ways": default.loss_both_ways(),
            "syn_loss": self._listener_faults.syn_loss * 100,
            "partitioned": ["*"] * everyone
            + sorted(h if p is None else format_address((h, p)) for h, p in peers),
        }

    # -- sockets of the proxy's own --

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
                        if not sock.recv_into(_discard_buffer()):
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
                    sweep = [c for c in self._live() if c.faults.closed()]
                    if not sweep and not self._new.default.closed():
                        break
                batch, sweep = sweep[:_HELD_POLL_BATCH], sweep[_HELD_POLL_BATCH:]
                for c in batch:
                    if not c.closing:
                        c.held_closes()
                await trio.sleep(_HELD_CLOSE_POLL_S)
        self._poll_scope = None


#: Mode -> the operation that carries it out (every row of faultnet.modes.MODES; a test
#: checks they agree).
_OPERATIONS: dict[str, Callable[[Proxy, FaultRequest], int | None]] = {
    "freeze": Proxy._stop,
    "blackhole": Proxy._stop,
    "partition": Proxy._partition,
    "loss": Proxy._loss,
    "thaw": Proxy._thaw,
    "sever": lambda proxy, req: proxy._end_all(req, "severed"),
    "reset": lambda proxy, req: proxy._end_all(req, "reset"),
    "drop_syn": Proxy._drop_syn,
    "syn_loss": Proxy._syn_loss,
    "refuse": Proxy._refuse,
    "restore": Proxy._restore,
}


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
