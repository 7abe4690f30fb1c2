"""The toxic path's trio side: a stream whose bytes pass through toxics.

A plane hands a lane's chunks to trio (:meth:`faultnet.planes.Link.take`, signalled by
the CHUNKS event); one task per such lane (:class:`ToxicLane`) runs them through the
stream's toxic chain (:mod:`faultnet.toxics.chain`) and is the chain's sink: what comes
out is written with :meth:`~faultnet.planes.Link.offer`, gate first, by the plane. The
same code serves every plane: it asks nothing of a plane but the interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from faultnet.planes import Link
from faultnet.toxics.chain import ToxicChain
from faultnet.toxics.clock import monotonic_offset

__all__ = ["Owner", "ToxicLane"]


class Owner(Protocol):
    """What a :class:`ToxicLane` asks of the connection it belongs to."""

    #: Set (and replaced) whenever the connection's toxic chains change.
    chain_changed: trio.Event

    def chain(self, stream: str) -> ToxicChain:
        """The toxics *stream*'s bytes go through, as of now."""
        ...


class ToxicLane:
    """trio's side of one lane on the toxic path: runs each chunk the thread read through
    the stream's toxic chain, in one task (:meth:`run`), and is the chain's sink: what
    comes out is written with :meth:`Link.offer`. *owner* is the connection
    (:class:`Owner`: its ``chain`` and ``chain_changed``); ``wake(stream)``
    returns the trio.Event set at the next CHUNKS, DRAINED or thaw.
    """

    def __init__(
        self, link: Link, stream: str, owner: Owner, wake: Callable[[str], trio.Event]
    ) -> None:
        self.link = link
        self.stream = stream
        self.owner = owner
        self._wake = wake
        self.eof_offered = False
        #: The lane's task has let others run since it took up its current chunk.
        self._yielded = False

    async def run(self) -> None:
        """Until the EOF has been offered through the chain (or the link ends)."""
        try:
            while True:
                woken = self._wake(self.stream)  # taken before looking: no lost wake-up
                chunks = self.link.take_timed(self.stream)
                if not chunks:
                    await woken.wait()
                    continue
                # Each chunk carries the time the plane read it (CLOCK_MONOTONIC, made
                # trio time): one stamp for the batch, taken now, made a chunk read while
                # the last one was delayed wait out that delay and then its own (issue 32:
                # latency=5 ms on a steady stream gave 10-16 ms).
                offset = monotonic_offset()
                now = trio.current_time() if offset is None else 0.0
                for data, t_plane in chunks:
                    if not data:
                        return await self._eof()
                    t_read = now if offset is None else t_plane + offset
                    self._yielded = False
                    await self.owner.chain(self.stream).send(data, t_read, self)
                    if not self._yielded:  # dropped or held by a toxic without a wait
                        await trio.lowlevel.checkpoint()
        except ConnectionError:
            return  # the link ended: its RESET event (or the fault that ended it) acts

    async def _eof(self) -> None:
        while True:
            changed = self.owner.chain_changed  # taken before offering: no lost wake-up
            await self.owner.chain(self.stream).send_eof(self)
            if self.eof_offered or self.link.ended:
                return
            # A toxic held the EOF (timeout does): offer it again whenever the chain
            # changes, so removing that toxic lets the FIN through.
            await changed.wait()

    # The chain's sink.
    async def send_all(self, data: bytes | memoryview) -> None:
        """Write *data* (gate first), then let the loop's other tasks run: a write that
        the socket takes at once schedules nothing, and a chain whose stages do not wait
        (a slicer with delay 0 writing 1-byte pieces, any pass-through while the plane
        keeps the inbox full) would otherwise hold trio's one thread for as long as the
        stream lasts (API calls and other proxies' accepts waited 19 s: issue 32). One
        checkpoint per write (per piece), or per chunk where none reaches the sink."""
        while True:
            woken = self._wake(self.stream)
            if self.link.offer(self.stream, data):
                break
            await woken.wait()
        self._yielded = True
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        while True:
            woken = self._wake(self.stream)
            if self.link.offer_eof(self.stream):
                self.eof_offered = True
                return
            await woken.wait()
