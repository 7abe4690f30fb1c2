"""The chain of toxics on one stream of one connection::

    reader > ChainLink > ChainLink > ... > sink (the socket write, or the FIN)

:class:`ToxicChain` runs a chunk (or the end of the stream) through the links in order;
each link is one toxic applied to one connection and stream, and is the
:class:`~faultnet.toxics.base.ToxicContext` that toxic sees: its ``forward`` hands the
bytes to the next link, the last one to the sink. The sink is whatever moves bytes for
the stream (:class:`faultnet.proxy._toxicpath.ToxicLane`); this module knows only its two methods.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from faultnet.toxics.base import Toxic

__all__ = ["ChainLink", "Sink", "ToxicChain"]


class Sink(Protocol):
    """Where the last link's bytes and end of stream go."""

    async def send_all(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...


class ChainLink:
    """One toxic applied to one connection and stream: its context for the toxic.

    *close* and *reset* end the whole connection (a FIN or an RST both ways).
    """

    def __init__(
        self,
        toxic: Toxic,
        conn_id: int,
        stream: str,
        rng: random.Random,
        close: Callable[[], Awaitable[None]],
        reset: Callable[[], Awaitable[None]],
    ) -> None:
        self.toxic = toxic
        self.conn_id = conn_id
        self.stream = stream
        self.rng = rng
        self.state: dict[str, Any] = {}
        self._close = close
        self._reset = reset
        # Where this link stands while the chain runs it: (chain, index, sink).
        self._where: tuple[ToxicChain, int, Sink] | None = None

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
