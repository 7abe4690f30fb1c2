"""One proxied connection: its two sockets, its fault state, and the plane that moves
its bytes.

A :class:`Connection` holds the truth about its faults (a
:class:`~faultnet.proxy._faultstate.FaultState`) and makes the plane and the sockets
match it after every transition (:meth:`Connection.enter`): gates closed on the plane
first (total on return), then each socket's filter, then gates opened. It drives the
plane only through :mod:`faultnet.planes`' interface and never asks which plane it is.

Its life: accepted (listed, its state taken from the faults on new connections), the
upstream connect started and both sockets handed to the plane (:meth:`start`), then the
plane's events end it (both EOFs forwarded, a peer reset, a failed connect), or a fault
or the proxy does (:meth:`end`). Toxics run in a task of its own, only when it has any:
each stream's path through them is a :class:`~faultnet.proxy._toxiclink.ToxicLink`.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import trio

from faultnet import bpf, planes
from faultnet.addresses import format_address
from faultnet.eventlog import JsonlWriter
from faultnet.proxy._faultstate import LABELS, FaultState
from faultnet.proxy._hop import Hop, add_hop_links, board
from faultnet.proxy._toxicbatch import ToxicBatch
from faultnet.proxy._toxiclink import ToxicLink
from faultnet.seeds import derive_seed
from faultnet.sockopts import (
    FilterDrops,
    bound_unsent,
    detach_filter,
    flush_ack,
    set_linger_reset,
    set_nodelay,
    tcp_retransmits,
    tcp_state,
    tcp_unacked,
    unread_bytes,
)
from faultnet.toxics.base import STREAMS, Toxic
from faultnet.toxics.chain import Sink, ToxicChain, ToxicStage, chain_of
from faultnet.toxics.draws import picks

__all__ = ["CONNECTION_STATES", "Connection", "ConnectionInfo", "Host"]

_DROP_ALL, _PURE_ACKS = bpf.drop_all(), bpf.pure_acks_only()


def _decided_rng(seed_parts: tuple[object, ...]) -> random.Random:
    """A toxic's rng on a connection, its first number skipped: the numbers a seed gives
    a toxic are those it gave when that number decided the toxicity (now
    :func:`~faultnet.toxics.draws.picks` decides)."""
    rng = random.Random(derive_seed(*seed_parts))
    rng.random()
    return rng


class _DecidedRng:
    """What makes a toxic's rng on a connection where it applies, at
    the stage's first use of it (:func:`_decided_rng`). One object where a
    ``functools.partial`` and its tuple were two: a toxic added to 9,000 connections
    leaves that many fewer objects for the collector, whose full passes over a server
    with 9,000 connections cost ~100-200 ms of CPU here (issue 36)."""

    __slots__ = ("conn_id", "name", "seed")

    def __init__(self, seed: int, conn_id: int, name: str) -> None:
        self.seed, self.conn_id, self.name = seed, conn_id, name

    def __call__(self) -> random.Random:
        return _decided_rng((self.seed, self.conn_id, self.name))


def stage_is_idle(stage: ToxicStage) -> bool:
    """Whether *stage* needs no task until its stream has bytes: a byte toxic (not a
    both-stream one, whose own writes need its streams' sinks running) whose
    ``Toxic.run`` is the base's, which does nothing."""
    return stage.peer is None and type(stage.toxic).run is Toxic.run


def _unacked(sock: socket.socket) -> int:
    """Segments the peer has not acknowledged (0 for a socket that is gone)."""
    try:
        return tcp_unacked(sock) if sock.fileno() >= 0 else 0
    except OSError:
        return 0


#: Every ``state`` a listed connection can be in: its life's, and its fault state's labels.
CONNECTION_STATES = (
    "open",
    "connecting",
    "half-closed",
    *(label for label in dict.fromkeys(LABELS.values()) if label != "open"),
    "closing",
)


class Host(Protocol):
    """What a connection asks of the proxy that accepted it (:class:`faultnet.Proxy`)."""

    log: JsonlWriter
    toxics: list[Toxic]
    seed: int
    upstream: tuple[str, int]
    connect_timeout: float
    #: (family, sockaddr) of an upstream given as an IP address, None for a host name.
    _upstream_target: tuple[int, tuple[Any, ...]] | None
    _connections: dict[int, Connection]
    #: Where the proxy's own tasks run (None once it is stopping).
    _nursery: trio.Nursery | None

    async def _contained(
        self, conn: Connection, fn: Callable[..., Awaitable[None]], *args: Any
    ) -> None:
        """Run *fn*; a failure ends only *conn*."""

    def _close_after_fin(self, sock: socket.socket) -> None:
        """Close *sock* with a clean FIN, in a task of the proxy's own."""


#: The ways of ending a connection that send an RST each way (the others send a FIN):
#: a reset (a fault, a peer's RST, a failure) and a proxy closed under bytes in flight.
RESETS = frozenset({"reset", "closed_in_flight"})

#: tcpi_state of a socket whose peer's FIN (CLOSE_WAIT) or RST (CLOSE) has arrived.
_HELD_KINDS = {8: "fin", 7: "rst"}


@dataclass(frozen=True)
class ConnectionInfo:
    id: int
    peer: str
    upstream: str
    bytes_upstream: int
    bytes_downstream: int
    #: One of :data:`CONNECTION_STATES`: open, connecting, half-closed, closing, or the
    #: fault state's label (frozen, frozen-upstream, blackholed, ...).
    state: str
    age_s: float
    #: Segments faultnet's filters (``loss``, blackhole) dropped on their way into the
    #: proxy's client-side socket: each data segment among them the client
    #: retransmitted (under two-way loss: the client's bare segments, probes and ACKs). The kernel's counter, read only while a filter is on: its drops
    #: for want of receive buffer are not counted outside those windows.
    dropped_upstream: int = 0
    #: The same on the proxy's upstream socket: segments the server had to retransmit.
    dropped_downstream: int = 0
    #: Segments the proxy's own two sockets retransmitted (``tcpi_total_retrans``), e.g.
    #: after a loss filter dropped the peer's ACKs.
    retransmits: int = 0
    #: The ``loss`` in force here, percent per stream (absent when none).
    loss: dict[str, float] | None = None
    #: The streams whose ``loss`` is both ways (``both_ways``: on the hop), or None.
    loss_both_ways: list[str] | None = None
    #: The connection's bytes cross its internal hop (since a two-way loss; it stays,
    #: lossless, after thaw).
    on_hop: bool = False
    #: Segments the hop's filters dropped (both ends: each way's data and ACKs).
    hop_dropped: int = 0
    #: Segments the hop's two ends retransmitted (``tcpi_total_retrans``).
    hop_retransmits: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Connection:
    """One client connection and its upstream connection. Created by the proxy."""

    def __init__(
        self,
        proxy: Host,
        conn_id: int,
        client: socket.socket,
        peer: str,
        faults: FaultState,
        inherited: bpf.Program | None = None,
    ) -> None:
        """*inherited*: the listener's filter when *client* was accepted. An accepted
        socket inherits its listener's filter (a partition's or syn_loss's, whose rules
        would go on dropping this connection's segments), so the first refilter replaces
        it with what this connection's own state asks for."""
        self.proxy = proxy
        self.id = conn_id
        self.client = client
        self.peer = peer
        try:
            self.peer_addr: tuple[str, int] = client.getpeername()[:2]
        except OSError:  # already reset by the client: no peer selector will match it
            self.peer_addr = ("", 0)
        self.server: socket.socket | None = None
        #: This connection in the plane (None until the upstream connect is started).
        self.link: planes.Link | None = None
        #: The faults in force; changed only by :meth:`enter` (or :meth:`enter_gated`).
        self.faults = FaultState()
        #: The filter on each socket now (what :meth:`_refilter` last attached).
        self._filters: dict[str, bpf.Program | None] = {
            "client": inherited,
            "server": None,
            "hop": None,
        }
        #: How it is being ended (severed, reset, closed ...), once a fault or the proxy
        #: has started ending it.
        self.closing: str | None = None
        self.started = time.monotonic()
        self._final_drops: tuple[int, int, int] | None = None
        # What this holds per connection is what the collector walks at each full pass:
        # 31 tracked objects an idle connection, at 9,000 a pass every one or two toxic
        # adds (issue 36). So what most connections never use is made at first use:
        # these, the toxic links' events and chains (_toxiclink), the host's scope.
        #: What each socket's filters dropped (not the kernel's receive-buffer drops),
        #: per side, from the first filter that side's socket has had.
        self._filter_drops: dict[str, FilterDrops] = {}
        #: The connection has ended and been logged (:meth:`_finish`); the event, made
        #: when the toxics' host waits for that, is set then.
        self._ended = False
        self._done: trio.Event | None = None
        self._held_logged: tuple[str, ...] = ()
        # -- toxics --
        #: Toxic name -> its stage on this connection, or None where toxicity said no.
        self.stages: dict[str, ToxicStage | None] = {}
        #: Each stream's path through its toxics (chain, task, wake-ups): see _toxiclink.
        self.toxic_links = {s: ToxicLink(s, self) for s in STREAMS}
        #: The internal hop (two-way loss), once the connection is on it.
        self.hop: Hop | None = None
        #: The plane :meth:`start` was given (the hop's links go into it).
        self._plane: planes.Plane | None = None
        #: :meth:`start` has run: a hop can be set up (not before: see :meth:`_refilter`).
        self._started = False
        #: The toxics' host's scope (made by :meth:`_host`, or by :meth:`end` first).
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._hosted = False
        self.enter(faults)

    def log_event(self, event: str, **fields: Any) -> None:
        self.proxy.log.write(event, conn=self.id, **fields)

    # -- faults --

    def enter(self, faults: FaultState) -> None:
        """Make *faults* the state in force: total when it returns. Gates that close are
        closed on the plane before any filter changes; gates that open are opened last,
        once the filters no longer drop what they will forward."""
        before, self.faults = self.faults, faults
        closing = faults.closed() - before.closed()
        opening = before.closed() - faults.closed()
        if closing and self.link is not None:
            self.link.freeze(sorted(closing))  # total on return: see faultnet.planes
        self._refilter()
        if opening and self.link is not None:
            self.link.thaw(sorted(opening))
            self.woken(opening)

    def enter_gated(
        self,
        faults: FaultState,
        gated: frozenset[str] | None,
        gates: dict[frozenset[str], list[Connection]],
    ) -> bool:
        """Make *faults* the state in force if all it changes is gates that close, or
        all it changes is gates that open: *gated*, those streams (None if the step
        does both), and no socket's filter changes (a freeze of an open connection, its
        thaw). Those gates are left for the caller to close or open, this connection
        listed in *gates* under *gated* (one plane call for many:
        :meth:`faultnet.planes.Plane.freeze`, :meth:`~faultnet.planes.Plane.thaw`; total
        once that returns; after a thaw the caller wakes the opened streams'
        :meth:`woken`). True if so; else nothing changed (use :meth:`enter`)."""
        if gated is None or self.link is None or self._filters != faults.filters():
            return False
        self.faults = faults
        gates[gated].append(self)
        return True

    def woken(self, streams: frozenset[str]) -> None:
        """*streams*' gates have opened (a batched thaw): their toxic paths look again."""
        for s in streams:
            self.toxic_links[s].wake()

    def apply(
        self, mode: str, streams: tuple[str, ...], fraction: float = 0.0, both_ways: bool = False
    ) -> None:
        """Apply the transition *mode* to *streams* (see faultnet.proxy._faultstate)."""
        self.enter(self.faults.apply(mode, streams, fraction, both_ways))

    def _refilter(self) -> None:
        """Put on each socket the filter the fault state asks for (once the upstream
        socket exists: :meth:`_connect` calls again).

        A blackhole's drop-all, put on at once, would drop the client's ACKs of
        segments still in flight and the proxy's kernel would retransmit them to the
        client (5 segments in 6 s, measured: a live peer to its keepalive). So while the
        client has not acknowledged everything, it gets :func:`bpf.pure_acks_only`
        first (:attr:`draining`), and drop-all once :meth:`drained`; an ACK the proxy
        owes the client is sent now rather than on its delayed-ACK timer.

        The ``hop`` filter goes on the ends of the internal hop, which is set up (and the
        connection's bytes put through it) the first time it is asked for, once the
        connection has started (:meth:`start` calls again)."""
        wanted = self.faults.filters()
        if self._filters == wanted:
            # Each socket already has what the state asks for: the loop below would do
            # nothing (a hop's filter is recorded only once the hop exists). Most
            # transitions of a fault over many connections (freeze, thaw) are this case.
            return
        for side, program in wanted.items():
            if side == "hop":
                self._refilter_hop(program)
                continue
            sock = self.client if side == "client" else self.server
            if sock is None or sock.fileno() < 0 or program == self._filters[side]:
                continue
            if side == "client" and program == _DROP_ALL:
                flush_ack(sock)
                if self._filters[side] != _PURE_ACKS and _unacked(sock):
                    program = _PURE_ACKS
            if program is None:
                detach_filter(sock)
                self._drops_of(side).detached(sock)
            else:
                self._drops_of(side).attached(sock)
                bpf.attach(sock, program)
            self._filters[side] = program

    def _drops_of(self, side: str) -> FilterDrops:
        drops = self._filter_drops.get(side)
        if drops is None:
            drops = self._filter_drops[side] = FilterDrops()
        return drops

    def _refilter_hop(self, program: bpf.Program | None) -> None:
        if program is not None and self.hop is None and self._started:
            self._board_hop()
        if self.hop is not None:
            self.hop.refilter(program)
            self._filters["hop"] = program

    def _board_hop(self) -> None:
        """Put the connection's bytes through a hop of its own from now on (for good):
        its link becomes two links of the plane, joined (:mod:`faultnet.proxy._hop`);
        toxics stay on the client's side of the hop. Bytes the plane already holds go
        out first. Failing to make the hop (out of descriptors) resets this connection
        only."""
        if not self.live or self._ended:
            return
        try:
            hop = Hop()
        except OSError as exc:
            self.log_event("hop_failed", error=repr(exc))
            self.end("reset")
            return
        self.hop = hop
        self.log_event("hop_opened", ports=hop.ports)
        if self.link is not None:  # else _connect adds the hop's links
            self._link_hop(self.link, hop)

    def _link_hop(self, link: planes.Link, hop: Hop) -> None:
        """Reroute the live *link* through *hop*; a link still connecting has read
        nothing, so it is replaced by the hop's two links, which finish the connect."""
        assert self._plane is not None and self.server is not None
        frozen = sorted(self.faults.closed())
        joined = board(self._plane, link, self.server, hop, frozen)
        if joined is None:
            if link.ended:
                return  # ended meanwhile: its event, still to come, ends the connection
            link.end()
            joined = add_hop_links(
                self._plane,
                self.client,
                self.server,
                hop,
                self._on_plane_event,
                frozen,
                [s for s in STREAMS if self.wants_copy(s)],
                self.proxy.connect_timeout,
            )
        self.link = joined
        for toxic_link in self.toxic_links.values():
            toxic_link.plane = joined

    @property
    def draining(self) -> bool:
        """Blackholed, but still letting the client's bare ACKs in (see _refilter)."""
        return self._filters["client"] == _PURE_ACKS

    def drained(self, give_up: bool = False) -> bool:
        """While :attr:`draining`: put the drop-all filter on once the client has
        acknowledged everything (or at once with *give_up*). True when not draining."""
        if self.draining and (give_up or not _unacked(self.client)):
            self._refilter()
        return not self.draining

    def held_closes(self) -> None:
        """Log a FIN or RST that arrived on a frozen stream (held, not forwarded)."""
        for stream in self.faults.closed():
            sock = self.client if stream == "upstream" else self.server
            if stream in self._held_logged or sock is None or sock.fileno() < 0:
                continue
            try:
                kind = _HELD_KINDS.get(tcp_state(sock))
            except OSError:
                continue
            if kind is not None:
                self._held_logged += (stream,)
                self.log_event(f"held_{kind}", stream=stream)

    def drops(self) -> tuple[int, int, int]:
        """(dropped into the client-side socket, into the upstream socket, the proxy's own
        retransmits), read from the kernel; once the sockets are closed, as they were
        just before."""
        if self._final_drops is not None:
            return self._final_drops
        counts = []
        for side, sock in (("client", self.client), ("server", self.server)):
            try:
                if sock is None:  # not connected yet
                    raise OSError("no socket")
                drops = self._filter_drops.get(side)  # none: no filter has been on it
                dropped = 0 if drops is None else drops.count(sock)
                counts.append((dropped, tcp_retransmits(sock)))
            except OSError:  # closed
                counts.append((0, 0))
        return counts[0][0], counts[1][0], counts[0][1] + counts[1][1]

    def counts(self) -> tuple[int, int]:
        """Bytes forwarded (upstream, downstream)."""
        return self.link.counts() if self.link is not None else (0, 0)

    @property
    def live(self) -> bool:
        """Not being ended, and not ended by the plane (though trio may not know yet)."""
        return self.closing is None and (self.link is None or not self.link.ended)

    async def sever(self) -> None:
        """Clean FIN both ways, even with unread bytes; ends the connection."""
        self.end("severed")

    async def reset(self) -> None:
        """RST both ways; ends the connection."""
        self.end("reset")

    def in_flight(self) -> bool:
        """Whether the proxy holds bytes of this connection it has not passed on: unread
        in either of its sockets, held by the plane, or in a toxic chain."""
        if any(unread_bytes(s) for s in (self.client, self.server) if s is not None):
            return True
        link = self.link
        if link is None or link.ended:
            return False
        return any(link.holding(s) or self.toxic_links[s].holding for s in STREAMS)

    def leave(self) -> None:
        """The proxy is going away: end the connection with a clean FIN each way if it
        is quiet, with an RST each way if anything is in flight (:meth:`in_flight`).

        A FIN tells a peer the other side finished sending, so a FIN after a cut-short
        stream hands the server a truncated upload as a whole one (256,000 of 2,097,152
        bytes, then a clean EOF: issue 35 item 6). A middlebox that dies resets; what
        it was carrying is lost either way."""
        self.end("closed_in_flight" if self.in_flight() else "closed")

    def end(self, how: str) -> None:
        """End the connection: FIN both ways (after the peer reads what is queued), or
        an RST for *how* in :data:`RESETS`. Once; later calls do nothing."""
        if self.closing is not None:
            return
        self.closing = how
        if self._scope is None:  # the host has not run: it finds its scope cancelled
            self._scope = trio.CancelScope()
        self._scope.cancel()
        self._final_drops = self.drops()
        if self.link is not None:
            self.link.end()  # the plane forgets the sockets before they are closed
        for sock in (self.client, self.server):
            if sock is None or sock.fileno() < 0:
                continue
            # Let the FIN or RST through, and the peer's answer: no blackhole or loss
            # filter outlives the connection it was for.
            detach_filter(sock)
            if how in RESETS:
                set_linger_reset(sock)
                sock.close()
            else:
                self.proxy._close_after_fin(sock)
        self._finish(how)

    def info(self) -> ConnectionInfo:
        bytes_up, bytes_down = self.counts()
        if self.closing:
            state = "closing"
        elif self.faults.label != "open":
            state = self.faults.label
        elif self.link is None or self.link.connecting:
            state = "connecting"
        elif any(self.link.eof_forwarded(s) for s in STREAMS):
            state = "half-closed"
        else:
            state = "open"
        dropped_up, dropped_down, retransmits = self.drops()
        hop_dropped, hop_retransmits = self.hop.counts() if self.hop is not None else (0, 0)
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
            loss=self.faults.loss_percent(),
            loss_both_ways=self.faults.loss_both_ways(),
            on_hop=self.hop is not None,
            hop_dropped=hop_dropped,
            hop_retransmits=hop_retransmits,
        )

    # -- toxics --

    def wants_copy(self, stream: str) -> bool:
        """True once any toxic (or the hop) applies to *stream* here (the plane hands it
        to trio)."""
        return bool(self.toxic_links[stream].chain.stages)

    def build_chain(self, stream: str) -> ToxicChain:
        """The toxics that apply to *stream* here, in the order they were added (both-
        stream toxics as layers: see :func:`faultnet.toxics.chain.chain_of`; the toxic
        link's ChainSource). The hop is not in it: the plane relays it, past the chain."""
        return chain_of((self.stages.get(t.name) for t in self.proxy.toxics), stream)

    def chain(self, stream: str) -> ToxicChain:
        """*stream*'s chain as of now (built when the toxics change, not per call)."""
        return self.toxic_links[stream].chain

    def sink(self, stream: str) -> Sink | None:
        """What writes *stream*'s bytes now, for a both-stream toxic's own writes."""
        toxic_link = self.toxic_links[stream]
        return toxic_link if toxic_link.running else None

    @property
    def seed(self) -> int:
        return self.proxy.seed

    def attach_toxic(self, toxic: Toxic, batch: ToxicBatch | None = None) -> None:
        """Decide *toxic* for this connection and put its stage on the path; with
        *batch* (the toxic added to every connection at once), a stage the plane can
        run compiled on an idle stream is left for the batch to hand the plane."""
        if toxic.name in self.stages:  # already decided for this connection: kept
            return
        # Decided once per connection and kept, by the toxics' one generator (the same
        # seed picks the same connections whichever path runs them); the stage's rng is
        # made at its first use (seeding one costs ~11 us: issue 36). Toxicity 1 always
        # applies: no seed is derived for it.
        if toxic.toxicity < 1.0 and not picks(
            derive_seed(self.proxy.seed, self.id, toxic.name), toxic.toxicity
        ):
            self.stages[toxic.name] = None
            return
        rng = _DecidedRng(self.proxy.seed, self.id, toxic.name)
        stage = ToxicStage(toxic, self.id, toxic.stream, rng, self, self)
        if toxic.both_streams:
            stage.pair()
        self.stages[toxic.name] = stage
        if batch is None or not batch.take(self.toxic_links[stage.stream], stage):
            self._put_on_path(stage)

    def _put_on_path(self, stage: ToxicStage) -> None:
        """*stage* is in this connection's chains from now on: its streams go to trio.

        A byte toxic without a task of its own (``Toxic.run``: latency, bandwidth ...)
        starts no task here: its stream's chain task starts at the stream's first
        chunk for trio (CHUNKS: :meth:`_plane_event`). So adding it to 9,000 idle
        connections spawns nothing: two trio tasks each (the host, the chain's) were
        most of the add (issue 36 item 3)."""
        for s in stage.streams:
            self.toxic_links[s].rebuild()
        # From now on the stream's bytes go to trio; its chain runs in the host task
        # (unless the plane's pipeline took the stage in: the rebuild's retune).
        if self.link is not None:
            for s in stage.streams:
                if self.toxic_links[s].compiled is None:
                    self.link.to_trio(s)
            if not stage_is_idle(stage):
                self._ensure_host()
            else:
                for s in stage.streams:
                    self._settle_idle(s)
        if self._nursery is not None and not stage_is_idle(stage):
            self.toxic_links[stage.stream].start_stage(self._nursery, stage)
            if self.link is not None:
                for s in stage.streams:
                    self.toxic_links[s].start(self._nursery)

    def _settle_idle(self, stream: str) -> None:
        """*stream* just took a toxic that starts no task: the plane runs its chain
        compiled where it can (:meth:`ToxicLink.to_stage`: now, not at the first chunk,
        which it would then delay); else chunks already waiting for trio (a compiled
        stage's queue handed back) start the chain's task now, as no CHUNKS event will."""
        toxic_link = self.toxic_links[stream]
        if toxic_link.running or toxic_link.to_stage():
            return
        if self.link is not None and self.link.holding(stream):
            if self._nursery is not None:
                toxic_link.start(self._nursery)
            else:
                self._ensure_host()

    def toxic_updated(self, name: str, batch: ToxicBatch | None = None) -> None:
        """*name*'s attributes changed: a stage the plane runs compiled is told; with
        *batch* (the update of every connection at once), one the batch can retake is
        left for it to tell the plane."""
        stage = self.stages.get(name)
        if stage is not None:
            if batch is not None and batch.retake(self.toxic_links[stage.stream], stage):
                return
            for s in stage.streams:
                self.toxic_links[s].retune()

    def detach_toxic(self, name: str, batch: ToxicBatch | None = None) -> None:
        """Take toxic *name* off this connection; with *batch* (the toxic removed from
        every connection at once), a stage the plane ran compiled as its stream's whole
        chain is left for the batch to take off the lane."""
        stage = self.stages.pop(name, None)
        if (
            stage is not None
            and batch is not None
            and batch.take_off(self.toxic_links[stage.stream], stage)
        ):
            return
        if stage is not None:
            self.toxic_links[stage.stream].stop_stage(name)
            for s in stage.streams:
                toxic_link = self.toxic_links[s]
                toxic_link.rebuild()
                # No chain task ever started (nothing was read for trio): the stream goes
                # back to the plane here, as that task would have sent it. False while a
                # chunk waits: its CHUNKS starts the task, which hands the stream back.
                if not toxic_link.running and not toxic_link.chain.stages:
                    if self.link is not None and self.link.on_toxic_path(s):
                        self.link.to_plane(s)

    def _ensure_host(self) -> None:
        """Start the task whose nursery runs this connection's toxics (once)."""
        if not self._hosted and not self._ended:
            self._hosted = True
            self._spawn(self._host)

    async def _host(self) -> None:
        if self._scope is None:
            self._scope = trio.CancelScope()
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for stage in self.stages.values():
                    if stage is not None:
                        self.toxic_links[stage.stream].start_stage(nursery, stage)
                # Every lane on the toxic path, not only those a toxic applies to now:
                # one added and removed before this task ran left its lane sending
                # bytes to trio that nobody took (a churning client hung, in the suite).
                for s in STREAMS:
                    if self.link is not None and self.link.on_toxic_path(s):
                        self.toxic_links[s].start(nursery)
                if not self._ended:
                    self._done = trio.Event()
                    await self._done.wait()
                nursery.cancel_scope.cancel()
        self._nursery = None

    # -- life --

    def start(self, plane: planes.Plane) -> None:
        """Right after the accept, in the trio thread: decide the toxics, start the
        upstream connect and hand both sockets to *plane*, which forwards once the
        connect completes. No task is started (but the host of any toxic's tasks); the
        plane's events end the connection."""
        for t in self.proxy.toxics:
            self.attach_toxic(t)
        self._plane = plane
        self._started = True
        self._refilter()  # a hop it starts with (two-way loss with include_new)
        if self.closing is not None:
            return
        target = self.proxy._upstream_target
        if target is None:  # a host name: resolve it first, in a task
            self._spawn(self._resolve_then_connect, plane)
        else:
            self._connect(plane, *target)

    async def _resolve_then_connect(self, plane: planes.Plane) -> None:
        # Not in self._scope: that is the toxics' host's (a scope is entered once). A
        # connection ended meanwhile is seen by _connect, or here.
        host, port = self.proxy.upstream
        try:
            with trio.fail_after(self.proxy.connect_timeout):
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
        self._connect(plane, family, sockaddr)

    def _connect(self, plane: planes.Plane, family: int, sockaddr: tuple[Any, ...]) -> None:
        if self.closing is not None:
            return  # ended (and finished) while the name was resolved
        try:
            self.server = server = socket.socket(family, socket.SOCK_STREAM)
            server.setblocking(False)
            set_nodelay(server)  # as the client socket: see sockopts
            bound_unsent(server)  # what a freeze lets through is bounded: see sockopts
            err = server.connect_ex(sockaddr)
        except OSError as exc:
            err = exc.errno or errno.EBADF
        if err not in (0, errno.EINPROGRESS):
            return self._upstream_failed(err)
        self._refilter()  # the upstream socket's filter (loss applied while connecting)
        # No checkpoint from reading the state to add(): a fault cannot fall between.
        frozen = sorted(self.faults.closed())
        to_trio = [s for s in STREAMS if self.wants_copy(s)]
        timeout = self.proxy.connect_timeout
        if self.hop is not None:  # two-way loss from the start: see faultnet.proxy._hop
            link: planes.Link = add_hop_links(
                plane, self.client, server, self.hop, self._on_plane_event, frozen, to_trio, timeout
            )
        else:
            link = plane.add(self.client, server, self._on_plane_event, frozen, to_trio, timeout)
        self.link = link
        for toxic_link in self.toxic_links.values():
            toxic_link.plane = link
        if any(self.wants_copy(s) for s in STREAMS):
            self._ensure_host()

    def _upstream_failed(self, err: int) -> None:
        if err == errno.ETIMEDOUT:
            reason = f"no answer from upstream within {self.proxy.connect_timeout} s"
        else:
            reason = str(OSError(err, os.strerror(err)))
        self._log_upstream_failed(reason)
        self._finish("upstream_failed")

    def _log_upstream_failed(self, reason: str) -> None:
        self.log_event(
            "upstream_failed", upstream=format_address(self.proxy.upstream), reason=reason
        )

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

    def _on_plane_event(self, kind: str, stream: str | None) -> None:
        # In the trio thread, delivered in batches by the plane.
        try:
            self._plane_event(kind, stream)
        except Exception as exc:  # contained to this connection, as a task's would be
            self.log_event("conn_error", error=repr(exc))
            self.end("reset")

    def _plane_event(self, kind: str, stream: str | None) -> None:
        if self._ended:
            return  # ended meanwhile (a fault, or the proxy closing): nothing to act on
        link = self.link
        assert link is not None
        if kind == planes.DONE:
            self._finish("clean")
        elif kind == planes.UPSTREAM_FAILED:
            self._upstream_failed(link.errno)
        elif kind == planes.ERROR:
            self.log_event("conn_error", error=repr(link.error))
            self.end("reset")
        elif kind == planes.CLOSE:
            self.end("severed")  # a compiled stage's ctx.close(): limit_data's limit
        elif kind == planes.RESET:
            self.log_event("peer_reset", stream=stream, errno=errno.errorcode.get(link.errno, "?"))
            self.end("reset")
        elif stream is not None:  # CHUNKS or DRAINED
            toxic_link = self.toxic_links[stream]
            if toxic_link.running:
                toxic_link.wake()
            elif kind == planes.CHUNKS:
                # The stream's first chunk for trio since its toxics were added (they
                # start no task: see _put_on_path): its chain's task starts now, in the
                # host, which starts it itself when it first runs.
                if self._nursery is not None:
                    toxic_link.start(self._nursery)
                else:
                    self._ensure_host()

    def _finish(self, how: str) -> None:
        """Close what is still open, forget the connection and log ``conn_close``; once
        (later calls do nothing). *how* unless a fault already said how it ends."""
        if self._ended:
            return
        how = self.closing or how
        if self._final_drops is None:
            self._final_drops = self.drops()
        if self.link is not None:
            self.link.end()
        for sock in (self.client, self.server):
            if sock is not None and sock.fileno() >= 0:
                if how in RESETS:
                    set_linger_reset(sock)
                sock.close()
        if self.hop is not None:
            self.hop.close()  # what it still held is lost with the connection, as on a route
        self._ended = True
        if self._done is not None:
            self._done.set()
        info = self.info()
        self.proxy._connections.pop(self.id, None)
        hop = {"hop_dropped": info.hop_dropped, "hop_retransmits": info.hop_retransmits}
        self.log_event(
            "conn_close",
            how=how,
            bytes_upstream=info.bytes_upstream,
            bytes_downstream=info.bytes_downstream,
            age_s=info.age_s,
            dropped_upstream=info.dropped_upstream,
            dropped_downstream=info.dropped_downstream,
            retransmits=info.retransmits,
            **(hop if info.on_hop else {}),
        )
