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

**Compiled stages.** The latency toxic (with jitter), the bandwidth toxic, the slicer,
limit_data (its count handed over as the generator is; EV_CLOSE asks trio to sever),
timeout (bytes dropped, the EOF held; its timer stays the toxic's trio task), slow_close
(the EOF due its delay after it came to the head) and reset_peer (the plain path: its
timer is trio's) run on the thread when a stream's chain is made of them, as one
pipeline per lane (:meth:`Link.set_stages`, :func:`_pipeline`: limit_data > one of
latency, bandwidth, slicer or the drop > slow_close): the lane's inbox is then the
pipeline's queue, each chunk due at its read time plus its delay (drawn when it comes to the head,
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
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from faultnet import planes as _planes
from faultnet.planes import (
    CHUNKS,
    CLOSE,
    DONE,
    DRAINED,
    ERROR,
    RESET,
    UPSTREAM_FAILED,
    LinkBase,
    Pipelines,
    Stage,
    Words,
)

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
        _native.CLOSE: CLOSE,
    }
    if AVAILABLE
    else {}
)


#: The toxics the thread runs as a pipeline's stage (``Toxic.compiled()``'s kind -> the
#: C's): one of these at most; the pipeline's other roles are :data:`_ROLES`'.
_STAGE_KINDS: dict[str, int] = (
    {
        "latency": _native.STAGE_LATENCY,
        "bandwidth": _native.STAGE_BANDWIDTH,
        "slicer": _native.STAGE_SLICER,
        "timeout": _native.STAGE_DROP,  # its timer is the toxic's task in trio
    }
    if AVAILABLE
    else {}
)
#: The toxics that sit around the stage (each once at most): limit_data before it,
#: slow_close after it (on the EOF), reset_peer nowhere (bytes pass; its timer is trio's).
_ROLES = {"limit_data": "limit", "slow_close": "slow", "reset_peer": "pass"}


#: ``_set_stage``'s figures after the lane: kind, a, b, c, limit, slow_ms.
_Figures = tuple[int, float, float, float, float, float]


def _pipeline(stages: Sequence[Stage]) -> tuple[_Figures, list[str]] | None:
    """The C's pipeline for a chain of *stages* (:data:`_Figures`) and each stage's
    role; None if it has no such form.

    The C runs limit > stage > slow_close whatever the chain's order: a slow_close acts
    on the EOF alone, after every byte before it, and once a limit is met the connection
    closes, so what would follow it is never seen. A timeout drops every byte and holds
    the EOF wherever it is (:func:`_dropping`). A stage on the plane keeps its role
    while it stays (a toxic added goes last), so its word stays where it is."""
    kinds = [form[0] for form in stages]
    if "timeout" in kinds:
        return _dropping(stages, kinds.index("timeout"))
    main: tuple[int, float, float, float] | None = None
    figures = {"limit": -1.0, "slow": -1.0}
    roles: list[str] = []
    for kind, a, b, c in stages:
        role = _ROLES.get(kind, "main")
        if role in figures and role not in roles:
            figures[role] = a
        elif role == "main" and main is None and kind in _STAGE_KINDS:
            main = (_STAGE_KINDS[kind], a, b, c)
        elif role != "pass":
            return None
        roles.append(role)
    if main is None:  # no stage: bytes due at once (or the plain path, none at all)
        around = figures["limit"] >= 0 or figures["slow"] >= 0
        main = (_native.STAGE_PASS if around else _native.STAGE_NONE, 0.0, 0.0, 0.0)
    return (*main, figures["limit"], figures["slow"]), roles


def _dropping(stages: Sequence[Stage], at: int) -> tuple[_Figures, list[str]] | None:
    """The pipeline of a chain whose stage *at* is a timeout: the drop, and a limit_data
    before it (which counts what the timeout then drops, and closes at its limit); the
    rest sees nothing, or nothing that leaves. The first of latency, bandwidth and
    slicer keeps the stage's role (its word on the plane, where the drop leaves it
    untouched); the others pass (their words stay in Python). None where a delay before
    that limit would move its close (the C counts first)."""
    kinds = [form[0] for form in stages]
    before = kinds[:at]
    limit = before.index("limit_data") if "limit_data" in before else -1
    if limit >= 0 and any(k in _STAGE_KINDS for k in before[:limit]):
        return None
    timing = [i for i, k in enumerate(kinds) if k in _STAGE_KINDS and k != "timeout"]
    main = timing[0] if timing else -1
    roles = ["limit" if i == limit else "main" if i == main else "pass" for i in range(len(stages))]
    figure = stages[limit][1] if limit >= 0 else -1.0
    return (_native.STAGE_DROP, 0.0, 0.0, 0.0, figure, -1.0), roles


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

    def __init__(
        self,
        plane: Plane,
        client: socket.socket,
        server: socket.socket,
        on_event: Callable[[str, str | None], None],
        lane: Callable[[str, socket.socket, socket.socket], LaneView],
    ) -> None:
        super().__init__(plane, client, server, on_event, lane)
        #: Each lane's pipeline: its stages' roles as last set (:meth:`set_stages`).
        self._roles: list[list[str]] = [[], []]

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

    def set_stages(
        self, stream: str, stages: Sequence[Stage], words: Sequence[int | None] = ()
    ) -> bool:
        """The lane's compiled pipeline (see :meth:`faultnet.planes.Link.set_stages` and
        :func:`_pipeline`), its draws made on the thread (``release_due`` in the C)."""
        lane = _INDEX[stream]
        made = _pipeline(stages)
        if made is None:
            return False
        figures, roles = made
        draws, count = _lane_words(roles, words)
        if draws is not None:
            self._stage_draws(lane, draws)
        if count is not None:
            self._stage_count(lane, count)
        self._set_stage(lane, *figures)
        self._roles[lane] = roles
        return True

    def stage_words(self, stream: str) -> list[int | None]:
        """The generator state of the pipeline's stage, limit_data's count; None for the
        others (they carry none)."""
        lane = _INDEX[stream]
        words: dict[str, int | None] = {
            "main": self._stage_draws(lane),
            "limit": self._stage_count(lane),
        }
        return [words.get(role) for role in self._roles[lane]]

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
    stages = frozenset(_STAGE_KINDS) | frozenset(_ROLES)

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

    def thaw(self, links: list[Link], streams: Iterable[str]) -> None:
        """Open the gates of *streams* on every link: one C call, one hold of the mutex
        (see :meth:`faultnet.planes.Plane.thaw`); a joined link (the hop's) by its own."""
        streams = list(streams)
        own, others = _own(links)
        self._core.thaw(own, _mask(streams))  # type: ignore[arg-type]
        _planes.thaw_each(others, streams)

    def set_stages(
        self, links: list[Link], stream: str, pipelines: Pipelines, words: Words
    ) -> None:
        """Link i's pipeline ``pipelines[i]`` on *stream* of every link in *links*: one C
        call, one hold of the mutex (see :meth:`faultnet.planes.Plane.set_stages`); each
        distinct pipeline is mapped once (:func:`_pipeline`: a toxic added to every
        connection is one). A link not of this plane's own (a connection's joined links:
        faultnet/proxy/_hop.py) by its own calls."""
        made: dict[tuple[Stage, ...], tuple[_Figures, list[str]]] = {}
        for forms in map(tuple, pipelines):  # every pipeline first: nothing changes if one fails
            if forms not in made:
                pipeline = _pipeline(forms)
                if pipeline is None:
                    raise ValueError(f"the native plane runs no pipeline {forms!r}")
                made[forms] = pipeline
        lane = _INDEX[stream]
        own: list[Link] = []
        figures: list[_Figures] = []
        roles: list[list[str]] = []
        lane_words: list[tuple[int | None, int | None]] = []
        for i, link in enumerate(links):
            forms, ws = tuple(pipelines[i]), () if words is None else words[i]
            if type(link) is not Link:  # a connection's joined links (rare): as to_stage()
                link.set_stages(stream, forms, ws)
                if forms and link.on_toxic_path(stream):
                    link.to_plane(stream)
                continue
            own.append(link)
            figures.append(made[forms][0])
            roles.append(made[forms][1])
            lane_words.append(_lane_words(made[forms][1], ws))
        self._core.set_stages(own, lane, figures, None if words is None else lane_words)  # type: ignore[arg-type]
        for link, its_roles in zip(own, roles, strict=True):
            link._roles[lane] = its_roles


def _lane_words(roles: Sequence[str], words: Sequence[int | None]) -> tuple[int | None, int | None]:
    """The C's two words of a lane from its pipeline's *words* (see
    :meth:`Link.set_stages`): the stage's generator state and limit_data's count (None:
    the lane's own goes on)."""
    draws = count = None
    for role, word in zip(roles, words, strict=False):
        if word is not None and role == "main":
            draws = word
        elif word is not None and role == "limit":
            count = word
    return draws, count


def _own(links: list[Link]) -> tuple[list[Link], list[Link]]:
    """*links* split into this plane's own links (one C call takes them all) and the
    others (a connection's joined links, faultnet/proxy/_hop.py: each its own calls)."""
    own = [link for link in links if type(link) is Link]
    if len(own) == len(links):
        return own, []
    return own, [link for link in links if type(link) is not Link]
