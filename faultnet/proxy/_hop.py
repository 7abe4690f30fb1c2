"""The internal hop: loss of both directions (``loss(both_ways=True)``).

A filter on one of the proxy's sockets sees only what arrives there, so one-way loss
drops the peers' segments and never the proxy's own: each leg loses one way, and a
transfer recovers much faster than through a route that loses its ACKs too (the
fidelity table). A connection under two-way loss therefore moves its bytes through a
loopback TCP connection of its own, whose two ends are both the proxy's::

    client <-> client socket | A ===lossy=== B | upstream socket <-> server

Upstream bytes are written into A and read from B, downstream bytes written into B and
read from A; both ends carry the random-drop filter (:func:`faultnet.bpf.drop_fraction`),
so the hop's own TCP loses data and ACKs alike, in both directions, and retransmits and
backs off as on a lossy route, while the upstream socket carries no loss filter and the
server sees the route's delays, not its drops. One hop carries both streams, as a route
does (ACKs ride on the other way's data). The client's own connection is not spared:
the client-facing socket loses the client's bare segments (its keepalive probes, its
ACKs), so its keepalive and TCP_USER_TIMEOUT can give up
(which directions, and how that matches the kernel's drop:
faultnet/proxy/_faultstate.py).

Theory of operation
-------------------

The data plane moves the hop's bytes, not trio: the connection becomes two plane links,
**front** (client, A) and **back** (B, upstream socket), joined here as one
:class:`HopLink` that keeps the plane's :class:`~faultnet.planes.Link` interface for the
connection. A connection boarding the hop live has its link *rerouted*
(:meth:`~faultnet.planes.Link.reroute`): its second socket becomes A, what it held still
goes out in order, and the upstream socket goes to a new back link. Measured (the
bench's hop line, ``--quick``, native plane, at 0.001 % loss): when a trio task moved
the hop's bytes, 688,828 user instructions per round trip (callgrind; the bare proxy
863), RTT added 12.7x the bare proxy's, bulk 0.25x; as two links of the plane, 1,725
instructions (2.0x bare: two relays), RTT added 1.43x, bulk 0.82x.

* **Toxics** run on the front link's lanes, client side of the hop: the hop is the
  innermost layer (nearest the server), last of the upstream chain, first of the
  downstream one, as before.
* **Faults** act on both links: a freeze closes a stream's gate on both (nothing reaches
  either peer; what the hop holds stays in it, bounded by its socket buffers), thaw opens
  both, and sever or reset ends both. A connection once on the hop stays on it: ``thaw``
  takes the filters off and the hop goes on, lossless.
* **Closes.** A half-close crosses the hop as a FIN, each way on its own. The connection
  is DONE when both links are (every FIN has crossed); a reset of either (a peer's RST,
  or the hop's own TCP giving up under heavy loss) or a failure ends the other link too
  and is the connection's. Bytes in the hop's sockets are in flight
  (:meth:`HopLink.holding`): a proxy closed under them resets both peers.

A connection that boards while its upstream connect is under way (or before its link
exists: ``include_new``) has read nothing yet, so it is set up as the two links at once,
the back one finishing the connect (:func:`add_hop_links`). The front link then forwards
what the client sends into the hop at once, where the connect would otherwise have
held it in the client's socket.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections.abc import Iterable, Sequence

from faultnet import bpf, planes
from faultnet.sockopts import (
    FilterDrops,
    detach_filter,
    set_linger_reset,
    tcp_retransmits,
    unread_bytes,
)

__all__ = ["Hop", "HopLink", "add_hop_links", "board"]

#: The loopback address the hop listens on (its two ends and nothing else).
_LOOPBACK = "127.0.0.1"


def _pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair (A, B), made synchronously: on loopback the
    handshake completes inside ``connect`` (microseconds; bounded at 1 s)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((_LOOPBACK, 0))
        listener.listen(8)
        for _ in range(3):
            a = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                a.settimeout(1.0)
                a.connect(listener.getsockname())
                listener.settimeout(1.0)
                b, addr = listener.accept()
            except OSError:
                a.close()
                raise
            if addr == a.getsockname():
                for s in (a, b):
                    s.setblocking(False)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return a, b
            # Someone else's connect got in first (a port scan, another process): not ours.
            b.close()
            a.close()
    raise OSError("the hop's listener was taken by other connects three times")


def _unsent(sock: socket.socket) -> int:
    """Bytes *sock* holds that its peer has not acknowledged (``SIOCOUTQ``); 0 once it
    is gone."""
    try:
        got = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", got)[0])


class Hop:
    """One connection's hop: ends A (the client's side) and B (the server's)."""

    def __init__(self) -> None:
        self.a, self.b = _pair()
        self.program: bpf.Program | None = None
        self._drops = (FilterDrops(), FilterDrops())
        self._final: tuple[int, int] | None = None
        self.closed = False

    @property
    def ports(self) -> list[int]:
        return [self.a.getsockname()[1], self.b.getsockname()[1]]

    def refilter(self, program: bpf.Program | None) -> None:
        """Put *program* on both ends (None: take the filters off)."""
        if self.closed or program == self.program:
            return
        for sock, drops in zip((self.a, self.b), self._drops, strict=True):
            if program is None:
                detach_filter(sock)
                drops.detached(sock)
            else:
                drops.attached(sock)
                bpf.attach(sock, program)
        self.program = program

    def counts(self) -> tuple[int, int]:
        """(segments the hop's filters dropped, the hop's own retransmits), both ends."""
        if self._final is not None:
            return self._final
        try:
            dropped = sum(d.count(s) for d, s in zip(self._drops, (self.a, self.b), strict=True))
            return dropped, tcp_retransmits(self.a) + tcp_retransmits(self.b)
        except OSError:
            return 0, 0

    def holding(self, stream: str) -> bool:
        """Whether *stream*'s bytes are inside the hop: sent into its end and not yet
        acknowledged, or arrived at the other end and not yet read."""
        into, out = (self.a, self.b) if stream == "upstream" else (self.b, self.a)
        return _unsent(into) > 0 or unread_bytes(out) > 0

    def close(self) -> None:
        """Close both ends (an RST: nothing of the hop lingers), once; the plane has
        forgotten them before (:meth:`HopLink.end`)."""
        if self.closed:
            return
        self._final = self.counts()
        self.closed = True
        for sock in (self.a, self.b):
            set_linger_reset(sock)
            sock.close()


class HopLink:
    """A connection's two plane links through its hop, as one
    :class:`~faultnet.planes.Link` (see the module's theory of operation)."""

    #: The client's side of the hop (client, A): set right after construction.
    front: planes.Link

    def __init__(self, hop: Hop, on_event: planes.OnEvent) -> None:
        self.back: planes.Link | None = None
        self.hop = hop
        self.on_event = on_event
        #: Bytes written to the server before the link was rerouted into the hop.
        self._up_before = 0
        #: The links whose DONE came (the connection's comes with the second).
        self._done: set[int] = set()
        #: The link whose RESET, ERROR or UPSTREAM_FAILED ended the connection.
        self._why: planes.Link | None = None

    def _links(self) -> tuple[planes.Link, ...]:
        return (self.front,) if self.back is None else (self.front, self.back)

    def _event(self, which: planes.Link, kind: str, stream: str | None) -> None:
        """An event of either link, in the trio thread: the connection's when it is."""
        if kind in (planes.CHUNKS, planes.DRAINED, planes.CLOSE):
            # the toxic path and its compiled stages: the front link's only (CLOSE: the
            # link is live, the connection ends it)
            self.on_event(kind, stream)
        elif kind == planes.DONE:
            self._done.add(id(which))
            if len(self._done) == len(self._links()):
                self.on_event(kind, stream)
        elif self._why is None:
            self._why = which
            for link in self._links():
                link.end()
            self.on_event(kind, stream)

    def _front_event(self, kind: str, stream: str | None) -> None:
        self._event(self.front, kind, stream)

    def _back_event(self, kind: str, stream: str | None) -> None:
        assert self.back is not None
        self._event(self.back, kind, stream)

    # -- planes.Link --

    @property
    def connecting(self) -> bool:
        return self.back is not None and self.back.connecting

    @property
    def ended(self) -> bool:
        return all(link.ended for link in self._links())

    @property
    def errno(self) -> int:
        return self._why.errno if self._why is not None else 0

    @property
    def error(self) -> Exception | None:
        return self._why.error if self._why is not None else None

    def freeze(self, streams: Iterable[str]) -> None:
        streams = list(streams)
        for link in self._links():
            link.freeze(streams)

    def thaw(self, streams: Iterable[str]) -> None:
        streams = list(streams)
        for link in reversed(self._links()):  # the server's side first: room for the front
            link.thaw(streams)

    def end(self) -> bool:
        ended = [link.end() for link in self._links()]
        return any(ended)

    def counts(self) -> tuple[int, int]:
        """Bytes written to the server (the back link's) and to the client (the front's)."""
        up = self.back.counts()[0] if self.back is not None else 0
        return self._up_before + up, self.front.counts()[1]

    def eof_forwarded(self, stream: str) -> bool:
        last = self.back if stream == "upstream" else self.front
        return last is not None and last.eof_forwarded(stream)

    def holding(self, stream: str) -> bool:
        return any(link.holding(stream) for link in self._links()) or self.hop.holding(stream)

    # The toxic path and compiled stages: the front link's lanes (client side of the hop).

    def to_trio(self, stream: str) -> None:
        self.front.to_trio(stream)

    def to_plane(self, stream: str) -> bool:
        return self.front.to_plane(stream)

    def on_toxic_path(self, stream: str) -> bool:
        return self.front.on_toxic_path(stream)

    def set_stages(
        self,
        stream: str,
        stages: Sequence[planes.Stage],
        words: Sequence[int | None] = (),
    ) -> bool:
        return self.front.set_stages(stream, stages, words)

    def stage_words(self, stream: str) -> list[int | None]:
        return self.front.stage_words(stream)

    def take(self, stream: str) -> list[bytes]:
        return self.front.take(stream)

    def take_timed(self, stream: str) -> list[tuple[bytes, float]]:
        return self.front.take_timed(stream)

    def offer(self, stream: str, data: bytes | memoryview) -> bool:
        return self.front.offer(stream, data)

    def offer_eof(self, stream: str) -> bool:
        return self.front.offer_eof(stream)

    def reroute(self, sock: socket.socket) -> int | None:
        return None  # on the hop for good: nothing reroutes it again


def board(
    plane: planes.Plane, link: planes.Link, server: socket.socket, hop: Hop, frozen: Iterable[str]
) -> HopLink | None:
    """Put *link*, live (connected), through *hop*: it is rerouted into A, its events go
    through the joined link, and the upstream socket joins a new back link from B. None
    (nothing changed) if the link has ended or is still connecting (then
    :func:`add_hop_links`, once it has been ended)."""
    written = link.reroute(hop.a)
    if written is None:
        return None
    joined = HopLink(hop, link.on_event)
    joined.front = link
    joined._up_before = written
    link.on_event = joined._front_event
    joined.back = plane.add(hop.b, server, joined._back_event, frozen=frozen)
    return joined


def add_hop_links(
    plane: planes.Plane,
    client: socket.socket,
    server: socket.socket,
    hop: Hop,
    on_event: planes.OnEvent,
    frozen: Iterable[str],
    to_trio: Iterable[str],
    connect_timeout: float,
) -> HopLink:
    """A connection's links through *hop* from the start, the back one taking over the
    upstream connect (see the module's docstring)."""
    frozen = list(frozen)
    joined = HopLink(hop, on_event)
    joined.front = plane.add(client, hop.a, joined._front_event, frozen, to_trio)
    joined.back = plane.add(
        hop.b, server, joined._back_event, frozen, connect_timeout=connect_timeout
    )
    return joined
