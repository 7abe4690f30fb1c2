"""The fault state of connections, per stream: everything that decides what a fault mode
does to a connection, and what undoes it, lives in this file.

Rule (h11's, for its state machine): nothing outside this module decides what a mode
means. The proxy core asks it for the next state and for what that state wants (which
gates are closed, which filter each socket carries, the label the listing shows) and
makes the plane and the sockets match; nothing re-derives any of it.

Theory of operation
-------------------

A stream (``upstream``: client to server; ``downstream``) is in one
:class:`Condition` and has a loss fraction. A mode is a transition, applied to each
stream it names independently (:data:`TRANSITIONS`); ``thaw`` is one too, back to
:data:`CLEAR`. Because no transition looks at another stream, any sequence of
per-stream calls ends where the equivalent single call ends: ``thaw("upstream")`` then
``thaw("downstream")`` is ``thaw("both")``, whatever put the faults there.

What a state wants is read off it:

* a stream's gate is closed while its condition is FROZEN or BLACKHOLED;
* the client-side socket drops every segment while *any* stream is BLACKHOLED (the
  blackhole's filter sits there: it is what makes the client's kernel see a dead route),
  else it loses the upstream's one-way fraction; the upstream socket loses the
  downstream's;
* a stream's loss *both ways* (``both_ways``) is on the connection's internal hop
  (``hop``, faultnet/proxy/_hop.py), whose two ends each drop that fraction of what
  arrives, so the streams' segments travelling either way are lost, ACKs included. One
  hop carries both streams, so it loses the larger two-way fraction of the two while
  either stream has one (``loss(both_ways=True)`` sets both at once);
* and two-way loss reaches the client's own connection too (its liveness): the
  client-side socket drops each *bare* segment the client sends (a keepalive or window
  probe, a bare ACK: no payload, no SYN, FIN or RST) with :func:`client_leg_loss`. The
  client's data and closes cross whole (the hop loses them, once), and the proxy's
  kernel's own segments toward the client cannot be dropped without CAP_NET_ADMIN, so a
  probe's lost answer is drawn as a lost probe: the same to the client, whose kernel
  sees no answer either way. A filter cannot tell a probe from a bare ACK, and the two
  want different shares: a probe is answered on the client's leg, so a route losing p
  each way loses its round trip with 1 - (1 - p)^2; an ACK's loss is already the hop's
  (the hop's own ACKs cross it lossy), so each one the leg drops is lost a second time,
  and the proxy's client socket then times out retransmitting what the client already
  has (at 36 %: 1,270-1,406 such retransmits per 192 downloads, 130-150 more RTOs than
  the kernel's route). So the share is between the two (see :func:`client_leg_loss`
  for what each choice measured). Not modelled: a client's own data retransmissions
  timing out (its data is never lost on its leg, only on the hop). One-way upstream
  loss, where it is in force too, keeps its own filter (which loses the client's probes
  at its p);
* the label is one row of :data:`LABELS`.

New connections start from :class:`NewConnectionFaults`: the ``include_new`` state of
freeze/blackhole, joined with every partition whose selector matches the client. A
partition also drops that client's SYNs at the listener while any of its streams is in
force, so thawing its two streams one at a time ends it too.

This module does no I/O: it is tested by tables (tests/faultnet/proxy/).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from faultnet import bpf
from faultnet.addresses import peer_matches

__all__ = [
    "CLEAR",
    "LABELS",
    "TRANSITIONS",
    "Condition",
    "FaultState",
    "ListenerFaults",
    "NewConnectionFaults",
    "StreamFault",
    "client_leg_loss",
]

STREAMS = ("upstream", "downstream")


class Condition(enum.IntEnum):
    """What stops a stream, weakest first (a stronger one is not undone by a weaker)."""

    OPEN = 0
    #: Gate closed: nothing forwarded, a FIN or RST held until thaw.
    FROZEN = 1
    #: Gate closed, and the client's segments dropped (a dead route).
    BLACKHOLED = 2


@dataclass(frozen=True)
class StreamFault:
    """The fault in force on one stream."""

    condition: Condition = Condition.OPEN
    #: Fraction of segments arriving at the proxy for this stream that are dropped (one
    #: way), or with ``both_ways`` of the segments crossing the hop either way.
    loss: float = 0.0
    both_ways: bool = False

    @property
    def closed(self) -> bool:
        return self.condition is not Condition.OPEN

    def join(self, other: StreamFault) -> StreamFault:
        """Both in force at once (a new connection under two selectors): the larger
        loss, as it is (one way or both)."""
        lossy = max(self, other, key=lambda f: (f.loss, f.both_ways))
        return StreamFault(max(self.condition, other.condition), lossy.loss, lossy.both_ways)


CLEAR = StreamFault()


def _freeze(f: StreamFault, fraction: float, both_ways: bool) -> StreamFault:
    return replace(f, condition=max(f.condition, Condition.FROZEN))


def _blackhole(f: StreamFault, fraction: float, both_ways: bool) -> StreamFault:
    return replace(f, condition=Condition.BLACKHOLED)


def _loss(f: StreamFault, fraction: float, both_ways: bool) -> StreamFault:
    return replace(f, loss=fraction, both_ways=both_ways and fraction > 0)


def _thaw(f: StreamFault, fraction: float, both_ways: bool) -> StreamFault:
    return CLEAR


#: Mode -> its transition of one stream (``fraction`` and ``both_ways`` are loss's; the
#: others ignore them).
#: Sever and reset end the connection and are not states; the listener modes are
#: :class:`ListenerFaults`'.
TRANSITIONS = {
    "freeze": _freeze,
    "blackhole": _blackhole,
    "partition": _blackhole,
    "loss": _loss,
    "thaw": _thaw,
}

_O, _F, _B = Condition.OPEN, Condition.FROZEN, Condition.BLACKHOLED
#: (upstream's condition, downstream's) -> the listing's ``state`` ("open" is refined by
#: the connection's life: connecting, half-closed).
LABELS: Mapping[tuple[Condition, Condition], str] = {
    (_O, _O): "open",
    (_F, _F): "frozen",
    (_F, _O): "frozen-upstream",
    (_O, _F): "frozen-downstream",
    (_B, _B): "blackholed",
    (_B, _F): "blackholed",
    (_F, _B): "blackholed",
    (_B, _O): "blackholed-upstream",
    (_O, _B): "blackholed-downstream",
}


@dataclass(frozen=True)
class FaultState:
    """The faults in force on one connection (or on the connections to come): one
    :class:`StreamFault` per stream. Immutable: a transition returns a new state."""

    upstream: StreamFault = CLEAR
    downstream: StreamFault = CLEAR

    def __getitem__(self, stream: str) -> StreamFault:
        return self.upstream if stream == "upstream" else self.downstream

    # Hashed once per state: every transition looks its state up in _transition's
    # cache, and the dataclass's own hash, two StreamFaults deep, was recomputed each
    # time (measured with the refilter's shortcut under callgrind: a connection's
    # freeze or thaw went from 28,300 instructions to 20,400).
    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.upstream, self.downstream))

    def apply(
        self, mode: str, streams: Iterable[str], fraction: float = 0.0, both_ways: bool = False
    ) -> FaultState:
        """The state after *mode* on *streams* (a subset of both)."""
        return _transition(self, mode, tuple(streams), fraction, both_ways)

    def join(self, other: FaultState) -> FaultState:
        return FaultState(*(self[s].join(other[s]) for s in STREAMS))

    @property
    def clear(self) -> bool:
        return self == _NO_FAULT

    def closed(self) -> frozenset[str]:
        """The streams whose gate is closed."""
        return self._closed

    # What a state wants is computed once per distinct state: a fault on 5,000
    # connections makes 5,000 transitions between the same few states (measured: a
    # 2,000-connection freeze spent most of its Python in these reads, recomputed).
    @functools.cached_property
    def _closed(self) -> frozenset[str]:
        return frozenset(s for s in STREAMS if self[s].closed)

    def blackholed(self) -> bool:
        return _B in (self.upstream.condition, self.downstream.condition)

    def filters(self) -> Mapping[str, bpf.Program | None]:
        """The filter each socket carries: ``client`` (what the client sends arrives
        there), ``server`` (the upstream socket) and ``hop`` (each end of the internal
        hop, where two-way loss is). Read-only (shared)."""
        return self._filters

    @functools.cached_property
    def _filters(self) -> Mapping[str, bpf.Program | None]:
        up, down = (self[s].loss if not self[s].both_ways else 0.0 for s in STREAMS)
        client = _loss_program(up) or _bare_program(client_leg_loss(self.hop_loss()))
        if self.blackholed():
            client = bpf.drop_all()
        return MappingProxyType(
            {
                "client": client,
                "server": _loss_program(down),
                "hop": _loss_program(self.hop_loss()),
            }
        )

    def hop_loss(self) -> float:
        """The fraction the internal hop loses each way: the larger two-way loss (0: none)."""
        return max((self[s].loss for s in STREAMS if self[s].both_ways), default=0.0)

    @property
    def label(self) -> str:
        return LABELS[self.upstream.condition, self.downstream.condition]

    def loss_percent(self) -> dict[str, float] | None:
        """The loss in force, percent per stream (None when none)."""
        return {s: self[s].loss * 100 for s in STREAMS if self[s].loss} or None

    def loss_both_ways(self) -> list[str] | None:
        """The streams whose loss is both ways (on the hop), sorted (None when none)."""
        return sorted(s for s in STREAMS if self[s].both_ways) or None

    def conditions(self, condition: Condition) -> list[str]:
        """The streams in *condition*, sorted by name."""
        return sorted(s for s in STREAMS if self[s].condition is condition)


_NO_FAULT = FaultState()


@functools.lru_cache(maxsize=1024)
def _transition(
    state: FaultState, mode: str, streams: tuple[str, ...], fraction: float, both_ways: bool
) -> FaultState:
    # Memoised: the same few states recur on every connection, and returning the same
    # object lets its cached reads (closed, filters) serve them all.
    step = TRANSITIONS[mode]
    return FaultState(
        *(step(state[s], fraction, both_ways) if s in streams else state[s] for s in STREAMS)
    )


#: A partition's selector: (host, port or None), or ALL for every client.
Selector = tuple[str, int | None]
ALL: Selector = ("*", None)


@dataclass
class NewConnectionFaults:
    """The faults connections accepted from now on start with."""

    #: ``include_new`` of freeze, blackhole and loss.
    default: FaultState = _NO_FAULT
    #: Partition selector -> its state; a selector is dropped once its state is clear.
    partitions: dict[Selector, FaultState] = field(default_factory=dict)

    def apply(
        self, mode: str, streams: Iterable[str], fraction: float = 0.0, both_ways: bool = False
    ) -> None:
        """freeze, blackhole or loss with include_new."""
        self.default = self.default.apply(mode, streams, fraction, both_ways)

    def partition(self, selector: Selector) -> None:
        state = self.partitions.get(selector, _NO_FAULT)
        self.partitions[selector] = state.apply("partition", STREAMS)

    def thaw(self, streams: Iterable[str], selector: Selector | None = None) -> None:
        """Thaw *streams* of every partition and of the include_new state, or (with
        *selector*) of that partition only."""
        streams = tuple(streams)
        if selector is None:
            self.default = self.default.apply("thaw", streams)
        for key in [selector] if selector is not None else list(self.partitions):
            if key in self.partitions:
                state = self.partitions[key].apply("thaw", streams)
                if state.clear:
                    del self.partitions[key]
                else:
                    self.partitions[key] = state

    def for_peer(self, addr: tuple[str, int]) -> FaultState:
        """What a connection from *addr* starts with."""
        state = self.default
        for selector, faults in self.partitions.items():
            if selector == ALL or peer_matches(selector, addr):
                state = state.join(faults)
        return state

    def syn_dropped_peers(self) -> tuple[bool, list[Selector]]:
        """(every client's SYNs dropped, the selectors whose SYNs are dropped)."""
        return ALL in self.partitions, [s for s in self.partitions if s != ALL]


def _loss_program(fraction: float) -> bpf.Program | None:
    return bpf.drop_fraction(fraction) if fraction > 0 else None


def _bare_program(fraction: float) -> bpf.Program | None:
    return bpf.drop_bare_fraction(fraction) if fraction > 0 else None


def client_leg_loss(hop_loss: float) -> float:
    """The share of the client's bare segments the client-side socket drops under a
    two-way loss of *hop_loss* (p) each way: halfway between a probe's round trip on
    such a route, 1 - (1 - p)^2 (the probe or its answer lost), and an ACK's one way,
    p, which the hop already applies: p (3 - p) / 2, 28 % at 20 %.

    Measured at 20 % both ways, the fidelity rows against nft's drop (interleaved runs,
    each arm's total over the runs; "backed off" of 192 downloads a run, "died" of 64
    keepalive connections): the round trip's 36 % backed off 407 of 960 downloads
    against the kernel's 352 (+5.7 points; once 111 against 72 in a loaded suite run),
    its connections died as the kernel's (105 against 108 of 192); p (20 %) backed off
    272 of 768 against 305 (-4.3) but died 130 against 195 of 320 (-20 points); this
    one, 28 %, backed off 379 of 960 against 403 (-2.5) and died 159 against 183 of 320
    (-7.5), both within a run's binomial spread (three of those runs each beside
    stress-ng on both CPUs: 79/91, 80/81, 74/78 downloads; 38/41, 30/39 deaths)."""
    return hop_loss * (3.0 - hop_loss) / 2.0


@dataclass
class ListenerFaults:
    """The faults on the listener: what drop_syn, syn_loss and refuse put there (all
    undone by restore); partitions add their SYN drops (:meth:`program`)."""

    syn_dropped: bool = False
    #: Fraction of SYNs dropped.
    syn_loss: float = 0.0
    #: The listener is closed.
    refusing: bool = False

    def program(self, new: NewConnectionFaults) -> bpf.Program | None:
        """The listener's filter (None: none)."""
        everyone, peers = new.syn_dropped_peers()
        return bpf.listener_program(
            drop_everything=self.syn_dropped or everyone, syn_loss=self.syn_loss, peers=peers
        )
