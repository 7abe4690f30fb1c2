"""The chain of toxics on one stream of one connection::

    reader > ChainLink > ChainLink > ... > sink (the socket write, or the FIN)

:class:`ToxicChain` runs a chunk (or the end of the stream) through the links in order;
each link is one toxic applied to one connection and stream, and is the
:class:`~faultnet.toxics.base.ToxicContext` that toxic sees: its ``forward`` hands the
bytes to the next link, the last one to the sink. The sink is whatever moves bytes for
the stream (:class:`faultnet.proxy._toxicpath.ToxicLane`); this module knows only its two
methods.

**Both-stream toxics** (``Toxic.both_streams``: a protocol's toxics, which read requests
on one stream and answer or alter them on the other) get one link per stream, a pair
sharing ``state`` (:meth:`ChainLink.pair`, :attr:`ChainLink.peer`). They sit in the
chains as layers of an onion (:func:`chain_of`): byte toxics nearest the client, then the
layers from the outermost in (upstream) and from the innermost out (downstream), so what
a layer injects passes through every layer outside it, and a layer's requests and
answers cross the layers inside it in the same order. Such a link may also write on its
own stream when the chain is not running it (:meth:`ChainLink.inject`): it asks its
connection (:class:`LinkHost`) for the stream's current chain and sink.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import trio

from faultnet.toxics.base import Toxic

__all__ = ["ChainLink", "LinkHost", "Sink", "ToxicChain", "chain_of"]


class Sink(Protocol):
    """Where the last link's bytes and end of stream go."""

    async def send_all(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...


class LinkHost(Protocol):
    """What a link of a both-stream toxic asks of its connection (beyond close/reset)."""

    #: The proxy's seed (logged at its start), for draws that must not depend on which
    #: connection a request came on.
    seed: int

    def chain(self, stream: str) -> ToxicChain:
        """The chain of *stream* as of now."""
        ...

    def sink(self, stream: str) -> Sink | None:
        """What writes *stream*'s bytes (None before the connection forwards, or after)."""
        ...

    def log_event(self, event: str, **fields: Any) -> None:
        """Record *event* in the event log, with the connection's id."""
        ...


class ChainLink:
    """One toxic applied to one connection and stream: its context for the toxic.

    *close* and *reset* end the whole connection (a FIN or an RST both ways). *host* is
    the connection, for links of both-stream toxics (:meth:`inject`, :meth:`log_event`).
    """

    def __init__(
        self,
        toxic: Toxic,
        conn_id: int,
        stream: str,
        rng: random.Random,
        close: Callable[[], Awaitable[None]],
        reset: Callable[[], Awaitable[None]],
        host: LinkHost | None = None,
    ) -> None:
        self.toxic = toxic
        self.conn_id = conn_id
        self.stream = stream
        self.rng = rng
        self.state: dict[str, Any] = {}
        self._close = close
        self._reset = reset
        self.host = host
        #: The other stream's link of a both-stream toxic (None for a byte toxic).
        self.peer: ChainLink | None = None
        # Where this link stands while the chain runs it: (chain, index, sink).
        self._where: tuple[ToxicChain, int, Sink] | None = None

    # -- both-stream toxics --

    def pair(self) -> ChainLink:
        """Make (once) and return the link of the other stream, sharing ``state``, rng,
        close, reset and host: the two halves of a both-stream toxic on a connection."""
        if self.peer is None:
            other = "downstream" if self.stream == "upstream" else "upstream"
            peer = ChainLink(
                self.toxic, self.conn_id, other, self.rng, self._close, self._reset, self.host
            )
            peer.state = self.state
            peer.peer = self
            self.peer = peer
        return self.peer

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams this toxic's links sit on, for this connection."""
        return (self.stream,) if self.peer is None else (self.stream, self.peer.stream)

    def on(self, stream: str) -> ChainLink | None:
        """This toxic's link on *stream* (this one or its peer), or None."""
        if self.stream == stream:
            return self
        if self.peer is not None and self.peer.stream == stream:
            return self.peer
        return None

    async def inject(self, data: bytes, t_read: float | None = None) -> None:
        """Send *data* on, from this link's place in its stream's chain, from any task
        (not only while the chain runs this link): an answer the toxic makes itself.
        The caller orders its own writes (the chain does not). ConnectionResetError if
        the stream no longer forwards."""
        chain, i, sink = self._located()
        t = trio.current_time() if t_read is None else t_read
        await chain.send(data, t, sink, i + 1)

    async def inject_eof(self) -> None:
        """The end of this stream, from this link's place on (see :meth:`inject`)."""
        chain, i, sink = self._located()
        await chain.send_eof(sink, i + 1)

    def _located(self) -> tuple[ToxicChain, int, Sink]:
        host = self.host
        sink = host.sink(self.stream) if host is not None else None
        if host is None or sink is None:
            raise ConnectionResetError("the stream does not forward")
        chain = host.chain(self.stream)
        for i, link in enumerate(chain.links):
            if link is self:
                return chain, i, sink
        raise ConnectionResetError("the toxic was removed from this connection")

    def log_event(self, event: str, **fields: Any) -> None:
        """Record *event* (with the connection's id) in the event log, if there is one."""
        if self.host is not None:
            self.host.log_event(event, toxic=self.toxic.name, **fields)

    @property
    def seed(self) -> int:
        """The proxy's seed (0 without a host)."""
        return self.host.seed if self.host is not None else 0

    # The ToxicContext protocol.
    async def forward(self, data: bytes, t_read: float) -> None:
        assert self._where is not None
        chain, i, sink = self._where
        await chain.send(data, t_read, sink, i + 1)

    async def forward_eof(self) -> None:
        assert self._where is not None
        chain, i, sink = self._where
        await chain.send_eof(sink, i + 1)

    async def close(self) -> None:
        await self._close()

    async def reset(self) -> None:
        await self._reset()


def chain_of(links: Iterable[ChainLink | None], stream: str) -> ToxicChain:
    """The chain of *stream* from a connection's links in the order their toxics were
    added (None where toxicity said no): byte toxics of *stream* nearest the client, in
    that order; both-stream toxics as layers ordered by ``Toxic.layer`` then as added,
    outermost first upstream and innermost first downstream (see the module docstring)."""
    present = [link for link in links if link is not None]
    byte = [link for link in present if link.peer is None and link.stream == stream]
    layers = sorted((link for link in present if link.peer is not None), key=_layer)
    if stream == "upstream":
        return ToxicChain(byte + [_half(link, stream) for link in layers])
    return ToxicChain([_half(link, stream) for link in reversed(layers)] + byte)


def _layer(link: ChainLink) -> int:
    return link.toxic.layer


def _half(link: ChainLink, stream: str) -> ChainLink:
    half = link.on(stream)
    assert half is not None  # a pair has a link on each stream
    return half


class ToxicChain:
    """The links of one stream in order; empty means bytes go straight to the sink."""

    def __init__(self, links: Sequence[ChainLink]) -> None:
        self.links = list(links)

    def _at(self, i: int, sink: Sink) -> ChainLink | None:
        # The link at *i*, told where it stands; None past the last one (the sink's turn).
        if i == len(self.links):
            return None
        link = self.links[i]
        link._where = (self, i, sink)
        return link

    async def send(self, data: bytes, t_read: float, sink: Sink, start: int = 0) -> None:
        """Run *data* (read at trio time *t_read*) from link *start* to the sink."""
        link = self._at(start, sink)
        await (sink.send_all(data) if link is None else link.toxic.on_chunk(link, data, t_read))

    async def send_eof(self, sink: Sink, start: int = 0) -> None:
        """Offer the end of the stream from link *start* on (a toxic may hold it)."""
        link = self._at(start, sink)
        await (sink.send_eof() if link is None else link.toxic.on_eof(link))
