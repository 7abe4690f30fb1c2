"""The native data plane: the thread plane's semantics, forwarded by compiled code.

It implements :mod:`faultnet.planes`' interface, and mirrors :mod:`faultnet.planes.thread`
(read its theory of operation: the gate under the lock, held bytes, splice bursts,
interest, settle, setting up while a connect is under way, the toxic path); what
differs is where the work runs.

Theory of operation
-------------------

**One native thread, no GIL.** :mod:`faultnet.planes._native` (C, built by the package's
``setup.py`` where a compiler is found) starts a pthread that runs an edge-triggered
epoll over every link's sockets (a lane whose turn ends with bytes left is listed to be
served again; measured: ~1 us less per round trip than level-triggered) and the common case (read into one 64 KiB buffer, write
at once; splice through a lent pipe for bursts). It never takes the GIL and never
touches a Python object: a lane is a C struct (gate, counter, held bytes, pipe, EOF
state, the toxic path's inbox).

**The gate under one mutex.** The thread reads a lane's gate and makes its byte-moving
syscall holding the core's one mutex, and counts what moved before letting go, as the
thread plane does under its lock. Every call from here that needs that mutex (add,
freeze, thaw, end, counts, settle, take, offer, offer_eof) takes it in C, so a fault
stays total on return: at once if it is free (the thread is in epoll_wait), else after
releasing the GIL, so the forwarding thread is never waited for with the GIL held (the
thread never waits for the GIL: no lock order to get wrong). Releasing the GIL on every
call cost a freeze of 2,000 idle connections 63 ms against 29 ms (the thread plane: 34).

**Events in batches.** The thread appends events to an outbox under the mutex; the
first of a batch writes an eventfd. One trio system task waits readable on it and drains
the whole batch (:meth:`Plane._deliver`), calling each link's ``on_event(kind, stream)``
in the trio thread. Chosen over ``TrioToken.run_sync_soon`` because calling that needs
the GIL, which the thread must never take; a Python thread blocked on the eventfd that
calls it would cost a second GIL hand-off per batch for nothing.

**Ownership.** The core holds a reference to each link it forwards (taken in
:meth:`Plane.add`, with the GIL). Ending a link, in either thread, queues a release
behind the link's last event; :meth:`Plane._deliver` drops the reference once the batch
is built, so no event ever points at a freed link.

**Compiled stages.** The latency toxic (with jitter), the bandwidth toxic and the slicer
run on the thread when a stream's chain is that one toxic (:meth:`Link.set_stage`): the lane's inbox is then the stage's
queue, each chunk due at its read time plus its delay (drawn when it comes to the head,
from the same splitmix64 as :mod:`faultnet.toxics.draws`); one timerfd in the epoll is
armed at the earliest due time among the lanes that wait (timer slack 1 us: epoll_wait's
own timeout has millisecond steps). Reading stops at the lane's bound in bytes: a
latency stage's is what a stream at STAGE_RATE (2 GB/s) has in flight for its latency
+ jitter, between INBOX_BYTES and STAGE_MAX_BYTES (32 MiB; see the C); any other lane's
is INBOX_BYTES, as for trio.

**The toxic path** stays in Python for every other chain: :class:`faultnet.proxy._toxiclink.ToxicLink` drives it
through :meth:`Link.take_timed` / :meth:`Link.offer` / :meth:`Link.offer_eof`, which are C
calls; each chunk carries its CLOCK_MONOTONIC read time, the inbox is bounded in bytes
(INBOX_BYTES), and :meth:`Link.to_plane` hands an emptied lane back to the C path.

**Debug switches** (tests only): ``Core.set_unlocked(True)`` makes freeze and counts skip
the mutex (the freeze stress test goes red with it), and ``Core.hold_write(fd)`` stops the
thread inside its next write to *fd*, or just after the shutdown that forwards an EOF to
it, with the mutex held (freeze is seen to wait for it; a peer reads the FIN meanwhile);
``Core.set_edges_only(True)`` turns the again list off (queued bytes stall: the test of
that list goes red with it).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from faultnet import planes as _planes
from faultnet.planes import CHUNKS, DONE, DRAINED, ERROR, RESET, UPSTREAM_FAILED, LinkBase, Stage

if TYPE_CHECKING:
    import trio

try:
    from faultnet.planes import _native
except ImportError:  # built without a compiler: the pure-Python planes remain
    _native = None  # type: ignore[assignment]

__all__ = ["AVAILABLE", "Link", "Plane"]

#: Whether the compiled core was built and imports here.
AVAILABLE = _native is not None

STREAMS = ("upstream", "downstream")
_INDEX = {"upstream": 0, "downstream": 1}
_KINDS: dict[int, str] = (
    {
        _native.RESET: RESET,
        _native.DONE: DONE,
        _native.CHUNKS: CHUNKS,
        _native.DRAINED: DRAINED,
        _native.ERROR: ERROR,
        _native.UPSTREAM_FAILED: UPSTREAM_FAILED,
    }
    if AVAILABLE
    else {}
)


#: The toxics the thread runs as compiled stages (``Toxic.compiled()``'s kind -> the C's).
_STAGE_KINDS: dict[str, int] = (
    {
        "latency": _native.STAGE_LATENCY,
        "bandwidth": _native.STAGE_BANDWIDTH,
        "slicer": _native.STAGE_SLICER,
    }
    if AVAILABLE
    else {}
)


def _mask(streams: Iterable[str]) -> int:
    mask = 0
    for s in streams:
        mask |= 1 << _INDEX[s]
    return mask


class LaneView:
    """One direction of a link: its ``src`` and ``dst`` sockets (what a debug hook
    aims at: ``Core.hold_write(link.lanes["upstream"].dst.fileno())``)."""

    __slots__ = ("dst", "src", "stream")

    def __init__(self, stream: str, src: socket.socket, dst: socket.socket) -> None:
        self.stream = stream
        self.src = src
        self.dst = dst


if TYPE_CHECKING:
    from faultnet.planes._native import Link as _Base
else:
    _Base = _native.Link if AVAILABLE else object


class Link(LinkBase["Plane", LaneView], _Base):
    """One connection in the core: two lanes. Made by :meth:`Plane.add`; every method
    returns at once (the mutex is held for one socket's work at most). Its ``lanes``
    name each lane's sockets for the tests' debug hooks (the core has its own); its
    ``error`` is set just before an ERROR event is delivered."""

    def freeze(self, streams: Iterable[str]) -> None:
        """Close the gates: total on return (no syscall of these lanes is in progress and
        none starts; their counters are final). Only flags change, as in the thread plane."""
        self._freeze(_mask(streams))

    def thaw(self, streams: Iterable[str]) -> None:
        """Open the gates and re-arm the parked lanes before returning."""
        self._thaw(_mask(streams))

    def end(self) -> bool:
        """Take the link out of the plane (the caller then closes its sockets). False if
        it had already ended."""
        ended: bool = super().end()
        if self.plane._stopped:
            self.plane._core.drain()  # nobody delivers any more: drop the core's reference
        return ended

    def eof_forwarded(self, stream: str) -> bool:
        return self._eof_forwarded(_INDEX[stream])

    def on_toxic_path(self, stream: str) -> bool:
        return self._on_toxic_path(_INDEX[stream])

    def holding(self, stream: str) -> bool:
        """Whether *stream* holds bytes read and not yet written (under the mutex)."""
        return self._holding(_INDEX[stream])

    def to_trio(self, stream: str) -> None:
        """From now on bytes read on *stream* go to trio's chain (:meth:`take`)."""
        self._to_trio(_INDEX[stream])

    def to_plane(self, stream: str) -> bool:
        """Back to the fast path, unless chunks wait for trio (False: take them first)."""
        done: bool = self._to_plane(_INDEX[stream])
        return done

    def set_stage(
        self, stream: str, stage: tuple[str, float, float, float] | None, draws: int | None = None
    ) -> bool:
        """The lane's compiled stage (see :meth:`faultnet.planes.Link.set_stage`): the
        latency, bandwidth or slicer toxic, its draws made on the thread (``release_due``
        in the C)."""
        lane = _INDEX[stream]
        if stage is None:
            self._set_stage(lane, _native.STAGE_NONE, 0.0, 0.0)
            return True
        kind, a, b, c = stage
        code = _STAGE_KINDS.get(kind)
        if code is None:
            return False
        if draws is not None:
            self._stage_draws(lane, draws)
        self._set_stage(lane, code, a, b, c)
        return True

    def stage_draws(self, stream: str) -> int:
        """The generator state of the lane's stage."""
        state: int = self._stage_draws(_INDEX[stream])
        return state

    def take(self, stream: str) -> list[bytes]:
        """The chunks read for trio so far (b"" is the EOF), and re-arm the reader."""
        chunks: list[bytes] = self._take(_INDEX[stream])
        return chunks

    def take_timed(self, stream: str) -> list[tuple[bytes, float]]:
        """As :meth:`take`, each chunk with the CLOCK_MONOTONIC time the thread read it."""
        chunks: list[tuple[bytes, float]] = self._take(_INDEX[stream], True)
        return chunks

    def offer(self, stream: str, data: bytes | memoryview) -> bool:
        """Write *data* to the lane's ``dst`` (gate first, under the mutex); what the
        socket does not take is held for the thread. False (nothing done) while the gate
        is closed or earlier bytes are held: wait for thaw or DRAINED, offer again.
        Raises ConnectionResetError if the link has ended or the write failed."""
        written: bool = self._offer(_INDEX[stream], data)
        return written

    def offer_eof(self, stream: str) -> bool:
        """Forward the EOF after what is held; False while the gate is closed."""
        done: bool = self._offer_eof(_INDEX[stream])
        return done

    def reroute(self, sock: socket.socket) -> int | None:
        """Relay through *sock* in place of the server's socket (see
        :meth:`faultnet.planes.Link.reroute`; ``reroute_link`` in the C)."""
        written = self._reroute(sock.fileno())
        if written is not None:
            self.fds = (self.fds[0], sock.fileno())
            self.lanes["upstream"].dst = self.lanes["downstream"].src = sock
        return written


class Plane:
    """The compiled core and the trio task that delivers its events."""

    name = "native"
    stages = frozenset(_STAGE_KINDS)

    def __init__(self, splice: bool = True) -> None:
        if not AVAILABLE:
            raise RuntimeError("faultnet.planes._native was not built here")
        self._core = _native.Core(splice=splice and hasattr(os, "splice"))
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = False

    def start(self, token: object) -> None:
        """Start the native thread, and (through *token*, a TrioToken) the trio task that
        delivers its events."""
        self._token = token  # type: ignore[assignment]
        self._core.start()
        self._token.run_sync_soon(self._spawn)  # type: ignore[union-attr]

    def _spawn(self) -> None:
        import trio  # here, not at import: asking what is built (--version) needs no trio

        if not self._stopped:
            trio.lowlevel.spawn_system_task(self._events, name="faultnet-native-events")

    async def _events(self) -> None:
        import trio

        fd = self._core.notify_fd
        with trio.CancelScope() as self._scope:
            if self._stopped:
                return
            while True:
                await trio.lowlevel.wait_readable(fd)
                self._deliver()

    def _deliver(self) -> None:
        """In the trio thread: hand the batch of events to their links."""
        for link, kind, lane in self._core.drain():
            if kind == _native.ERROR:
                link.error = RuntimeError(link._error_message)
            link.on_event(_KINDS[kind], STREAMS[lane] if lane >= 0 else None)

    def stop(self) -> None:
        """End the thread and the delivering task. Links still in the plane stay their
        owners' to end (no syscall is made for them any more); events already queued are
        delivered in the trio thread soon, as the thread plane's would be."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()
        self._core.stop()
        if self._token is not None:
            import trio

            try:
                self._token.run_sync_soon(self._deliver)
            except trio.RunFinishedError:
                self._core.drain()

    def add(
        self,
        client: socket.socket,
        server: socket.socket,
        on_event: Callable[[str, str | None], None],
        frozen: Iterable[str] = (),
        to_trio: Iterable[str] = (),
        connect_timeout: float | None = None,
    ) -> Link:
        """Start forwarding between two non-blocking sockets (see
        :meth:`faultnet.planes.Plane.add`); what already arrived moves now, here."""
        link = Link(self, client, server, on_event, LaneView)
        self._core.add(
            link,
            client.fileno(),
            server.fileno(),
            _mask(frozen),
            _mask(to_trio),
            -1.0 if connect_timeout is None else float(connect_timeout),
        )
        return link

    def settle(self) -> None:
        """Move, in the calling thread (GIL released), whatever epoll reports ready now."""
        self._core.settle()

    def freeze(self, links: list[Link], streams: Iterable[str]) -> tuple[int, int]:
        """Close the gates of *streams* on every link: one C call, one hold of the mutex
        (see :meth:`faultnet.planes.Plane.freeze`). A link that is not one of this
        plane's own (a connection's joined links: faultnet/proxy/_hop.py) is frozen and
        counted by its own methods."""
        streams = list(streams)
        own, others = _own(links)
        up, down = self._core.freeze(own, _mask(streams))  # type: ignore[arg-type]
        if others:
            u, d = _planes.freeze_each(others, streams)
            up, down = up + u, down + d
        return up, down

    def set_stages(
        self, links: list[Link], stream: str, stage: Stage | None, draws: list[int] | None
    ) -> None:
        """*stage* on *stream* of every link in *links*: one C call, one hold of the
        mutex (see :meth:`faultnet.planes.Plane.set_stages`); a link not of this plane's
        own (a connection's joined links: faultnet/proxy/_hop.py) by its own calls."""
        if stage is None:
            kind, a, b, c = _native.STAGE_NONE, 0.0, 0.0, 0.0
        else:
            name, a, b, c = stage
            if name not in _STAGE_KINDS:
                raise ValueError(f"the native plane runs no {name!r} stage")
            kind = _STAGE_KINDS[name]
        own, others = _own(links)
        if others:  # a connection's joined links (rare): each as a toxic link's to_stage()
            i_of = {id(link): i for i, link in enumerate(links)}
            for link in others:
                link.set_stage(stream, stage, None if draws is None else draws[i_of[id(link)]])
                if stage is not None and link.on_toxic_path(stream):
                    link.to_plane(stream)
            if draws is not None:
                draws = [draws[i_of[id(link)]] for link in own]
        self._core.set_stages(own, _INDEX[stream], kind, a, b, c, draws)  # type: ignore[arg-type]


def _own(links: list[Link]) -> tuple[list[Link], list[Link]]:
    """*links* split into this plane's own links (one C call takes them all) and the
    others (a connection's joined links, faultnet/proxy/_hop.py: each its own calls)."""
    own = [link for link in links if type(link) is Link]
    if len(own) == len(links):
        return own, []
    return own, [link for link in links if type(link) is not Link]
