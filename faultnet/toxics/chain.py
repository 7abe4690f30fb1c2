"""The chain of toxics on one stream of one connection::

    plane > ToxicStage > ToxicStage > ... > sink (the socket write, or the FIN)

Words: a *link* is a connection in a data plane (:class:`faultnet.planes.Link`), and a
*toxic link* the path of one of its streams through toxics
(:class:`faultnet.proxy._toxiclink.ToxicLink`, Toxiproxy's ToxicLink); a *stage* is one
toxic applied to one connection and stream, a place in that path (Toxiproxy's
ToxicStub). This module knows stages and chains only.

:class:`ToxicChain` runs a chunk (or the end of the stream) through the stages in order;
each stage is the :class:`~faultnet.toxics.base.ToxicContext` its toxic sees: its
``forward`` hands the bytes to the next stage, the last one to the sink. The sink is
whatever moves bytes for the stream (the toxic link); this module knows only its two
methods.

**Both-stream toxics** (``Toxic.both_streams``: a protocol's toxics, which read requests
on one stream and answer or alter them on the other) get one stage per stream, a pair
sharing ``state`` (:meth:`ToxicStage.pair`, :attr:`ToxicStage.peer`). They sit in the
chains as layers of an onion (:func:`chain_of`): byte toxics nearest the client, then the
layers from the outermost in (upstream) and from the innermost out (downstream), so what
a layer injects passes through every layer outside it, and a layer's requests and
answers cross the layers inside it in the same order. Such a stage may also write on its
own stream when the chain is not running it (:meth:`ToxicStage.inject`): it asks its
connection (:class:`StageHost`) for the stream's current chain and sink.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import trio

from faultnet.toxics.base import Toxic

__all__ = ["Ends", "ToxicStage", "StageHost", "Sink", "ToxicChain", "chain_of"]


class Ends(Protocol):
    """What ends a stage's connection: a FIN both ways (:meth:`sever`) or an RST."""

    async def sever(self) -> None: ...

    async def reset(self) -> None: ...


class Sink(Protocol):
    """Where the last stage's bytes and end of stream go."""

    async def send_all(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...


class StageHost(Protocol):
    """What a stage of a both-stream toxic asks of its connection (beyond close/reset)."""

    @property
    def seed(self) -> int:
        """The proxy's seed (logged at its start), for draws that must not depend on
        which connection a request came on."""
        ...

    def chain(self, stream: str) -> ToxicChain:
        """The chain of *stream* as of now."""
        ...

    def sink(self, stream: str) -> Sink | None:
        """What writes *stream*'s bytes (None before the connection forwards, or after)."""
        ...

    def log_event(self, event: str, **fields: Any) -> None:
        """Record *event* in the event log, with the connection's id."""
        ...


class ToxicStage:
    """One toxic applied to one connection and stream: its context for the toxic.

    *ends* ends the whole connection (a FIN or an RST both ways: :meth:`close`,
    :meth:`reset`). *host* is the connection, for stages of both-stream toxics
    (:meth:`inject`, :meth:`log_event`). A connection is both: one object where two bound
    methods and their tuple were three more the collector tracks per connection with a
    toxic (issue 36).
    """

    def __init__(
        self,
        toxic: Toxic,
        conn_id: int,
        stream: str,
        rng: random.Random | Callable[[], random.Random],
        ends: Ends,
        host: StageHost | None = None,
    ) -> None:
        self.toxic = toxic
        self.conn_id = conn_id
        self.stream = stream
        # *rng*, or what makes it at its first use (:attr:`rng`).
        self._rng = rng if isinstance(rng, random.Random) else None
        self._make_rng = None if isinstance(rng, random.Random) else rng
        self.state: dict[str, Any] = {}
        self._ends = ends
        self.host = host
        #: The other stream's stage of a both-stream toxic (None for a byte toxic).
        self.peer: ToxicStage | None = None
        # Where this stage stands while the chain runs it: (chain, index, sink).
        self._where: tuple[ToxicChain, int, Sink] | None = None

    @property
    def rng(self) -> random.Random:
        """The stage's random source, made at its first use where the stage was given
        the function that makes it: seeding one costs ~11 us, ~100 ms of a toxic's add
        on 9,000 connections whose toxic may never draw (issue 36)."""
        if self._rng is None:
            assert self._make_rng is not None
            self._rng = self._make_rng()
        return self._rng

    @rng.setter
    def rng(self, rng: random.Random) -> None:
        self._rng = rng

    def _shared_rng(self) -> random.Random:
        # The peer's rng is this stage's: made (once) by whichever half draws first.
        return self.rng

    # -- both-stream toxics --

    def pair(self) -> ToxicStage:
        """Make (once) and return the stage of the other stream, sharing ``state``, rng,
        ends and host: the two halves of a both-stream toxic on a connection."""
        if self.peer is None:
            other = "downstream" if self.stream == "upstream" else "upstream"
            peer = ToxicStage(
                self.toxic,
                self.conn_id,
                other,
                self._shared_rng,
                self._ends,
                self.host,
            )
            peer.state = self.state
            peer.peer = self
            self.peer = peer
        return self.peer

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams this toxic's stages sit on, for this connection."""
        return (self.stream,) if self.peer is None else (self.stream, self.peer.stream)

    def on(self, stream: str) -> ToxicStage | None:
        """This toxic's stage on *stream* (this one or its peer), or None."""
        if self.stream == stream:
            return self
        if self.peer is not None and self.peer.stream == stream:
            return self.peer
        return None

    async def inject(self, data: bytes, t_read: float | None = None) -> None:
        """Send *data* on, from this stage's place in its stream's chain, from any task
        (not only while the chain runs this stage): an answer the toxic makes itself.
        The caller orders its own writes (the chain does not). ConnectionResetError if
        the stream no longer forwards."""
        chain, i, sink = self._located()
        t = trio.current_time() if t_read is None else t_read
        await chain.send(data, t, sink, i + 1)

    async def inject_eof(self) -> None:
        """The end of this stream, from this stage's place on (see :meth:`inject`)."""
        chain, i, sink = self._located()
        await chain.send_eof(sink, i + 1)

    def _located(self) -> tuple[ToxicChain, int, Sink]:
        host = self.host
        sink = host.sink(self.stream) if host is not None else None
        if host is None or sink is None:
            raise ConnectionResetError("the stream does not forward")
        chain = host.chain(self.stream)
        for i, stage in enumerate(chain.stages):
            if stage is self:
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
        await self._ends.sever()

    async def reset(self) -> None:
        await self._ends.reset()


def chain_of(stages: Iterable[ToxicStage | None], stream: str) -> ToxicChain:
    """The chain of *stream* from a connection's stages in the order their toxics were
    added (None where toxicity said no): byte toxics of *stream* nearest the client, in
    that order; both-stream toxics as layers ordered by ``Toxic.layer`` then as added,
    outermost first upstream and innermost first downstream (see the module docstring)."""
    present = [stage for stage in stages if stage is not None]
    byte = [stage for stage in present if stage.peer is None and stage.stream == stream]
    layers = sorted((stage for stage in present if stage.peer is not None), key=_layer)
    if stream == "upstream":
        return ToxicChain(byte + [_half(stage, stream) for stage in layers])
    return ToxicChain([_half(stage, stream) for stage in reversed(layers)] + byte)


def _layer(stage: ToxicStage) -> int:
    return stage.toxic.layer


def _half(stage: ToxicStage, stream: str) -> ToxicStage:
    half = stage.on(stream)
    assert half is not None  # a pair has a stage on each stream
    return half


class ToxicChain:
    """The stages of one stream in order; empty means bytes go straight to the sink.
    Built when the stream's toxics change (:func:`chain_of`), not per chunk."""

    def __init__(self, stages: Sequence[ToxicStage]) -> None:
        self.stages = list(stages)

    def _at(self, i: int, sink: Sink) -> ToxicStage | None:
        # The stage at *i*, told where it stands; None past the last one (the sink's turn).
        if i == len(self.stages):
            return None
        stage = self.stages[i]
        stage._where = (self, i, sink)
        return stage

    async def send(self, data: bytes, t_read: float, sink: Sink, start: int = 0) -> None:
        """Run *data* (read at trio time *t_read*) from stage *start* to the sink."""
        stage = self._at(start, sink)
        await (sink.send_all(data) if stage is None else stage.toxic.on_chunk(stage, data, t_read))

    async def send_eof(self, sink: Sink, start: int = 0) -> None:
        """Offer the end of the stream from stage *start* on (a toxic may hold it)."""
        stage = self._at(start, sink)
        await (sink.send_eof() if stage is None else stage.toxic.on_eof(stage))
