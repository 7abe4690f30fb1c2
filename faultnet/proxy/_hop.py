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
ACKs) as a route loses round trips, so its keepalive and TCP_USER_TIMEOUT can give up
(which directions, and how that matches the kernel's drop:
faultnet/proxy/_faultstate.py).

In the toxic chains (:mod:`faultnet.toxics.chain`) the hop is the innermost layer
(:data:`HOP_LAYER`, nearest the server): the last link of the upstream chain, the first
of the downstream one. Its ``on_chunk`` writes into its end (one writer at a time per
end); its ``run`` reads the other ends and injects what arrives into the chain past the
hop, so the plane's gates still decide what reaches either peer: freeze, blackhole and
sever act on a connection on the hop as on any other, and what the hop holds is above
the gate (bounded by the hop's socket buffers and one chunk per direction).

A connection once on the hop stays on it: ``thaw`` takes the filters off and the hop goes
on, lossless. A half-close crosses the hop as a FIN (``shutdown``), each way on its own;
a reset from either peer is the plane's to pass on (it ends the connection, hop and
all). If the hop itself fails (its TCP gave up under heavy loss) the connection is reset.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, cast

import trio

from faultnet import bpf
from faultnet.sockopts import FilterDrops, detach_filter, set_linger_reset, tcp_retransmits
from faultnet.toxics.base import Toxic, ToxicContext
from faultnet.toxics.chain import ToxicStage

__all__ = ["HOP", "HOP_LAYER", "Hop", "HopToxic"]

#: Below every toxic's layer: the hop is nearest the server (TLS towards it is 2).
HOP_LAYER = 3
#: What one read from a hop end takes: what one chunk in flight may hold.
_CHUNK = 65536
#: A write at least this long (a plane's full read, more than a loopback segment) is
#: likely followed by more: see :meth:`Hop.write`.
_FULL = 65536
_TCP_NOTSENT_LOWAT, _UNBOUNDED = 25, 0x7FFFFFFF
#: How long a corked end waits for the next write before it sends its tail.
_FLUSH_S = 0.001
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


class Hop:
    """One connection's hop: ends A (the client's side) and B (the server's)."""

    def __init__(self) -> None:
        self.a, self.b = _pair()
        self.program: bpf.Program | None = None
        self._drops = (FilterDrops(), FilterDrops())
        self._final: tuple[int, int] | None = None
        self.closed = False
        # Wrapped for trio when the hop's task first runs.
        self._streams: tuple[trio.SocketStream, trio.SocketStream] | None = None
        self._locks = {"upstream": trio.Lock(), "downstream": trio.Lock()}
        self._eof_sent = {"upstream": False, "downstream": False}
        self._corked = {"upstream": False, "downstream": False}
        self._written = {"upstream": 0, "downstream": 0}
        self._flush = {"upstream": trio.Event(), "downstream": trio.Event()}

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

    def close(self) -> None:
        """Close both ends (an RST: nothing of the hop lingers); tasks waiting on them
        are woken with ClosedResourceError. Once."""
        if self.closed:
            return
        self._final = self.counts()
        self.closed = True
        for sock in (self.a, self.b):
            trio.lowlevel.notify_closing(sock)
            set_linger_reset(sock)
            sock.close()

    # -- moving bytes (trio) --

    def _stream_pair(self) -> tuple[trio.SocketStream, trio.SocketStream]:
        if self.closed:
            raise ConnectionResetError("the hop is closed")
        if self._streams is None:
            self._streams = (
                trio.SocketStream(trio.socket.from_stdlib_socket(self.a)),
                trio.SocketStream(trio.socket.from_stdlib_socket(self.b)),
            )
            # trio's SocketStream bounds what a socket holds unsent to 16 KiB, less than
            # one loopback segment: the sender then has nothing new to send while it
            # recovers a loss, and every loss costs an RTO (8 MiB at 20 %: median 3.03 s
            # against the kernel's route 1.07 s, 30 runs each). A route's sender has its
            # whole send buffer; the hop is above the gate, so a freeze holds it all.
            for sock in (self.a, self.b):
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT, _UNBOUNDED)
        return self._streams

    def _into(self, stream: str) -> trio.SocketStream:
        a, b = self._stream_pair()
        return a if stream == "upstream" else b

    async def write(self, stream: str, data: bytes) -> None:
        """Send *stream*'s bytes into the hop (ConnectionResetError once it is closed).

        A burst crosses the hop in full segments, as it left its sender: a full read
        (:data:`_FULL`, likely followed by more) is written corked (``TCP_CORK``), so
        its tail shorter than a segment waits for the next write; a shorter write (the
        burst's end) uncorks, and so does a moment (:data:`_FLUSH_S`) with no write.
        Without it every 64 KiB read left as a 65,483-byte segment and a 53-byte one
        (64 data segments for a 2 MiB download, where the server's own socket sent
        43-47), and each extra segment is one more that the loss can hit."""
        sock = self._into(stream).socket
        full = len(data) >= _FULL
        view = memoryview(data)
        async with self._locks[stream]:
            try:
                if full != self._corked[stream]:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, int(full))
                    self._corked[stream] = full
                while view:
                    n = await sock.send(view)
                    view = view[n:]
            except (trio.ClosedResourceError, OSError) as exc:
                raise ConnectionResetError("the hop is closed") from exc
            self._written[stream] += 1
            if full:
                self._flush[stream].set()

    async def _uncork(self, stream: str) -> None:
        """Uncork *stream*'s end once no write has come for :data:`_FLUSH_S` (a burst
        that ended on a full read), so no tail waits for the kernel's 200 ms."""
        while True:
            await self._flush[stream].wait()
            self._flush[stream] = trio.Event()
            while True:
                seen = self._written[stream]
                await trio.sleep(_FLUSH_S)
                if seen == self._written[stream]:
                    break
            async with self._locks[stream]:
                if self._corked[stream] and not self.closed:
                    self._into(stream).socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
                    self._corked[stream] = False

    async def write_eof(self, stream: str) -> None:
        """*stream*'s FIN into the hop (once; a re-offered EOF does nothing)."""
        async with self._locks[stream]:
            if self._eof_sent[stream]:
                return
            self._eof_sent[stream] = True
            try:
                await self._into(stream).send_eof()  # a FIN pushes what a cork held
            except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
                raise ConnectionResetError("the hop is closed") from exc

    async def run(self, links: dict[str, ToxicStage], on_failure: Callable[[str], None]) -> None:
        """Read each end and inject what arrives past the hop, until both EOFs have
        crossed or the hop is closed; *on_failure* (why) if the hop's TCP failed."""
        if self.closed:
            return  # the connection ended before this task ran
        a, b = self._stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._out, b, links["upstream"], on_failure)
            nursery.start_soon(self._out, a, links["downstream"], on_failure)
            for stream in links:
                nursery.start_soon(self._uncork, stream)

    async def _out(
        self, src: trio.SocketStream, link: ToxicStage, on_failure: Callable[[str], None]
    ) -> None:
        try:
            while True:
                data = await src.receive_some(_CHUNK)
                if not data:
                    break
                await link.inject(data)
            await _inject_eof(link)
        except trio.ClosedResourceError:
            return  # closed by the connection's end
        except trio.BrokenResourceError as exc:
            if not self.closed:
                on_failure(repr(exc.__cause__ or exc))
        except ConnectionError:
            return  # the stream no longer forwards: the connection is ending


async def _inject_eof(stage: ToxicStage) -> None:
    """Offer the EOF past the hop; again whenever the chain changes while a toxic after
    it holds the EOF (as the toxic link does: faultnet/proxy/_toxiclink.py)."""
    host = cast(Any, stage.host)
    while True:
        toxic_link = host.toxic_links[stage.stream]
        changed: trio.Event = toxic_link.changed
        await stage.inject_eof()
        sink = host.sink(stage.stream)
        if sink is None or sink.eof_offered or sink.plane is None or sink.plane.ended:
            return
        await changed.wait()


class HopToxic(Toxic):
    """The hop's place in a connection's chains (not a registered toxic, never listed):
    its links' shared ``state["hop"]`` is the connection's :class:`Hop`."""

    type = "loss_hop"
    both_streams = True
    layer = HOP_LAYER

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        await _hop(ctx).write(ctx.stream, data)

    async def on_eof(self, ctx: ToxicContext) -> None:
        await _hop(ctx).write_eof(ctx.stream)

    async def run(self, ctx: ToxicContext) -> None:
        link = cast(ToxicStage, ctx)
        up, down = link.on("upstream"), link.on("downstream")
        assert up is not None and down is not None
        await _hop(ctx).run({"upstream": up, "downstream": down}, ctx.state["on_failure"])


def _hop(ctx: ToxicContext) -> Hop:
    hop: Hop = ctx.state["hop"]
    return hop


#: The one instance every connection's hop links share (per connection: their state).
HOP = HopToxic("loss-hop", stream="both")
