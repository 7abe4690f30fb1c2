"""A toxic link: one stream of one connection on the toxic path (Toxiproxy's ToxicLink).

::

    plane (Link.take_timed) > stage > stage > ... > this link's sink (Link.offer)

A plane hands a lane's chunks to trio (:meth:`faultnet.planes.Link.take_timed`,
signalled by the CHUNKS event), each with the time it was read. The :class:`ToxicLink`
of that stream owns what happens next, apart from the connection:

* the stream's chain (:class:`~faultnet.toxics.chain.ToxicChain`), rebuilt by
  :meth:`ToxicLink.rebuild` when the connection's toxics change, never per chunk;
* the one task that runs each chunk through it (:meth:`ToxicLink.run`) and is the
  chain's sink: what comes out is written with :meth:`~faultnet.planes.Link.offer`,
  gate first, by the plane;
* the tasks of the stages at home on this stream (a toxic's ``run``: a both-stream
  toxic's pair is at home on the stream of its first stage);
* its wake-ups: the plane's CHUNKS and DRAINED, a thaw, a change of chain.

The same code serves every plane: it asks nothing of a plane but the interface.

**Compiled stages.** When the chain is one toxic with a compiled form
(:meth:`~faultnet.toxics.base.Toxic.compiled`: latency, bandwidth, slicer) and the plane has that stage
(:meth:`~faultnet.planes.Link.set_stage`: the native plane), the task hands the stream
back to the plane with the stage set and ends: the plane delays the chunks itself, and
the toxic's generator state goes with it (and comes back if the chain leaves that form).
An attribute update reaches the stage through :meth:`ToxicLink.retune`; a rebuilt chain
of another form takes the stream back to trio (or, empty, to the plain fast path).
``FAULTNET_COMPILED_STAGES=0`` keeps every chain in trio (the reference the differential
test compares the compiled stages with).

The stage's generator (:mod:`faultnet.toxics.draws`) is handed to the plane only when
its form draws (:func:`faultnet.planes.stage_draws`: a jitter, a size variation), and
taken back only if it was handed (:attr:`ToxicLink.handed`): a stage that never drew
leaves the generator where the toxic would seed it, so its sequence is the same, and a
latency toxic without jitter seeds no ``random.Random`` per connection (issue 36).

**Many at once.** A toxic added to (or removed from) a proxy's connections takes each
idle stream onto the compiled stage (or off it) with :meth:`ToxicLink.staged` and
:meth:`ToxicLink.unstaged`, which only set what this object holds; the caller hands the
plane every such lane in one call (:mod:`faultnet.proxy._toxicbatch`).
"""

from __future__ import annotations

import os
from typing import Protocol

import trio

from faultnet.planes import Link, stage_draws
from faultnet.toxics.base import Toxic
from faultnet.toxics.chain import ToxicChain, ToxicStage
from faultnet.toxics.clock import monotonic_offset
from faultnet.toxics.draws import draws_of

__all__ = ["COMPILED_STAGES_ENV", "ChainSource", "ToxicLink"]

#: Set to ``0`` to keep every chain in trio (no compiled stage), read per connection.
COMPILED_STAGES_ENV = "FAULTNET_COMPILED_STAGES"


class ChainSource(Protocol):
    """What a :class:`ToxicLink` asks of its connection: the chain as of now."""

    def build_chain(self, stream: str) -> ToxicChain:
        """The stages *stream*'s bytes go through, built from the connection's toxics."""
        ...


class ToxicLink:
    """One stream of one connection on the toxic path: its chain, the task that runs it
    (:meth:`run`), the tasks of its stages (:meth:`start_stage`), and the chain's sink."""

    def __init__(self, stream: str, source: ChainSource) -> None:
        self.stream = stream
        self._source = source
        #: The connection in the plane, once it is there.
        self.plane: Link | None = None
        #: The stream's chain; replaced whole by :meth:`rebuild`.
        self.chain = ToxicChain([])
        #: Set (and replaced) whenever the chain is rebuilt.
        self.changed = trio.Event()
        #: The chain's task is running (:meth:`start`).
        self.running = False
        self.eof_offered = False
        self._woken = trio.Event()
        self._scopes: dict[str, trio.CancelScope] = {}
        #: The task has let others run since it took up its current chunk.
        self._yielded = False
        #: The chain's task, while it runs (:meth:`run`).
        self._runner: trio.lowlevel.Task | None = None
        #: The task wrote without a checkpoint after it: it owes one, paid before its
        #: next chunk or by waiting for one (:meth:`send_all`).
        self._owed = False
        #: Chunks taken from the plane are still in the chain (not all written).
        self.holding = False
        #: The stage the plane runs compiled for this stream (None: trio runs the chain).
        self.compiled: ToxicStage | None = None
        #: The plane's stage holds the generator of :attr:`compiled` (handed over because
        #: its form draws); False: the toxic's own is where it was.
        self.handed = False
        self._may_compile = os.environ.get(COMPILED_STAGES_ENV, "1") != "0"

    # -- the connection's side --

    def rebuild(self) -> None:
        """Take the chain as the connection's toxics now make it, and wake the task (an
        EOF a removed toxic held goes through; see :meth:`_eof`)."""
        self.chain = self._source.build_chain(self.stream)
        if self.compiled is not None:
            self.retune()
        self.changed.set()
        self.changed = trio.Event()
        self.wake()

    def retune(self) -> None:
        """While the plane runs the chain compiled: give it the chain's form as of now
        (an attribute changed), or take the stream off the stage: to trio if the chain
        has another form (the caller starts the task: the connection's ``_put_on_path``),
        to the plain fast path if it is empty (what the stage queued goes out first)."""
        old, link = self.compiled, self.plane
        if old is None or link is None:
            return
        wanted = self._compilable()
        if wanted is not None:
            if wanted is not old:  # another toxic of that form: the generator is its own
                self._take_back(old, link)
            form = wanted.toxic.compiled()
            draws = None
            if form is not None and stage_draws(form) and not self.handed:
                draws = draws_of(wanted.state, wanted.rng).state
            if form is not None and link.set_stage(self.stream, form, draws):
                self.compiled = wanted
                self.handed = self.handed or draws is not None
                return
        # Off the stage: its generator state comes back to the Python toxic.
        self.compiled = None
        if self.chain.stages:
            link.to_trio(self.stream)  # the stage's queue goes to trio, read times kept
        else:
            link.set_stage(self.stream, None)
        self._take_back(old, link)

    def _take_back(self, stage: ToxicStage, link: Link) -> None:
        """The generator the plane drew *stage*'s draws from, back to the toxic (if it
        was handed: else the toxic's own is untouched)."""
        if self.handed:
            draws_of(stage.state, stage.rng).state = link.stage_draws(self.stream)
            self.handed = False

    def _compilable(self) -> ToxicStage | None:
        """The chain's one stage, if the plane may run it compiled."""
        if not self._may_compile or len(self.chain.stages) != 1:
            return None
        stage = self.chain.stages[0]
        return stage if stage.peer is None and stage.toxic.compiled() is not None else None

    def to_stage(self) -> bool:
        """Hand the stream to the plane's compiled stage, if the chain has that form and
        the plane that stage: True when it did (the task then ends)."""
        link, stage = self.plane, self._compilable()
        if link is None or stage is None:
            return False
        form = stage.toxic.compiled()
        if form is None:
            return False
        draws = draws_of(stage.state, stage.rng).state if stage_draws(form) else None
        if not link.set_stage(self.stream, form, draws):
            return False
        if not link.to_plane(self.stream):  # with a stage set it always takes the lane
            link.set_stage(self.stream, None)
            return False
        self.compiled = stage
        self.handed = draws is not None
        return True

    def idle(self) -> bool:
        """In the plane, no toxic on it and no task running it: a stage can be set on
        it without waking anything (:meth:`staged`)."""
        return (
            self.plane is not None
            and not self.running
            and self.compiled is None
            and not self.chain.stages
        )

    def may_compile(self) -> bool:
        """Whether a compiled stage may run this stream (``FAULTNET_COMPILED_STAGES``)."""
        return self._may_compile

    def staged(self, stage: ToxicStage, handed: bool) -> None:
        """*stage* is this :meth:`idle` stream's whole chain, run compiled by the plane:
        what :meth:`rebuild` and :meth:`to_stage` would make of it, the plane told by the
        caller (one call for many: :meth:`faultnet.planes.Plane.set_stages`). No task
        waits on an idle stream, so nothing is woken. *handed*: its generator goes
        with it."""
        self.chain = ToxicChain([stage])
        self.compiled = stage
        self.handed = handed

    def unstaged(self, stage: ToxicStage) -> bool:
        """Take *stage*, removed, off this stream if it is the whole chain and the plane
        runs it compiled (the caller then sets no stage on the lane, for many at once):
        True if it did. Its generator is not taken back: the stage is gone."""
        if self.compiled is not stage or len(self.chain.stages) != 1 or self.running:
            return False
        self.chain = ToxicChain([])
        self.compiled = None
        self.handed = False
        return True

    def wake(self) -> None:
        """The plane has chunks, its held bytes drained, or the gate opened: look again."""
        self._woken.set()
        self._woken = trio.Event()

    def start(self, nursery: trio.Nursery) -> None:
        """Put the stream on the toxic path and start the chain's task (once)."""
        if self.running or self.eof_offered or self.plane is None:
            return
        self.plane.to_trio(self.stream)
        self.running = True
        nursery.start_soon(self.run)

    def start_stage(self, nursery: trio.Nursery, stage: ToxicStage) -> None:
        """Run *stage*'s toxic task (``Toxic.run``) until :meth:`stop_stage` or the end."""
        name = stage.toxic.name
        if name in self._scopes or type(stage.toxic).run is Toxic.run:
            return  # running, or the base's run, which does nothing: no task for it
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await stage.toxic.run(stage)

        try:
            nursery.start_soon(run)
        except RuntimeError:
            # "Nursery is closed to new arrivals": the connection is being torn down
            # (still listed for a moment). No byte will cross it again.
            return
        self._scopes[name] = scope

    def stop_stage(self, name: str) -> None:
        scope = self._scopes.pop(name, None)
        if scope is not None:
            scope.cancel()

    # -- the chain's task --

    async def run(self) -> None:
        """Until the EOF has been offered through the chain, the link ends, or the chain
        is empty and the stream back on the plane (:meth:`faultnet.planes.Link.to_plane`)."""
        assert self.plane is not None
        link = self.plane
        self._runner = trio.lowlevel.current_task()
        try:
            while True:
                # Every chunk taken has been through the chain: the plane may run it now.
                if self.to_stage():
                    return
                woken = self._woken  # taken before looking: no lost wake-up
                chunks = link.take_timed(self.stream)
                if not chunks:
                    # Its toxics gone and every chunk handed on: back to the plane's fast
                    # path (no checkpoint since the take: the chain cannot change between;
                    # a chunk the plane read meanwhile makes it refuse, and is taken next).
                    if not self.chain.stages and link.to_plane(self.stream):
                        return
                    self._owed = False  # the wait is a checkpoint (set or not)
                    await woken.wait()
                    continue
                # Each chunk carries the time the plane read it (CLOCK_MONOTONIC, made
                # trio time): one stamp for the batch, taken now, made a chunk read while
                # the last one was delayed wait out that delay and then its own (issue 32:
                # latency=5 ms on a steady stream gave 10-16 ms).
                offset = monotonic_offset()
                now = trio.current_time() if offset is None else 0.0
                self.holding = True
                for data, t_plane in chunks:
                    if self._owed:  # the last chunk's write: others run before this one
                        self._owed = False
                        await trio.lowlevel.checkpoint()
                    if not data:
                        self.holding = False
                        return await self._eof()
                    t_read = now if offset is None else t_plane + offset
                    self._yielded = False
                    await self.chain.send(data, t_read, self)
                    if not self._yielded:  # dropped or held by a toxic without a wait
                        await trio.lowlevel.checkpoint()
                self.holding = False
        except ConnectionError:
            return  # the link ended: its RESET event (or the fault that ended it) acts
        finally:
            self.running = False
            self._runner, self._owed = None, False

    async def _eof(self) -> None:
        assert self.plane is not None
        while True:
            changed = self.changed  # taken before offering: no lost wake-up
            await self.chain.send_eof(self)
            if self.eof_offered or self.plane.ended:
                return
            # A toxic held the EOF (timeout does): offer it again whenever the chain
            # changes, so removing that toxic lets the FIN through.
            await changed.wait()

    # -- the chain's sink --

    async def send_all(self, data: bytes | memoryview) -> None:
        """Write *data* (gate first), then let the loop's other tasks run: a write that
        the socket takes at once schedules nothing, and a chain whose stages do not wait
        (a slicer with delay 0 writing 1-byte pieces, any pass-through while the plane
        keeps the inbox full) would otherwise hold trio's one thread for as long as the
        stream lasts (API calls and other proxies' accepts waited 19 s: issue 32). One
        checkpoint per write (per piece), or per chunk where none reaches the sink.

        The chain's own task defers its first write's checkpoint to :meth:`run`, which
        pays it before its next chunk or by waiting for one: a chunk that goes out in
        one write (a protocol toxic's session that faults nothing) then costs one pass
        of trio's loop less, and nothing runs longer between checkpoints than one chunk
        (pgbench -S through a postgres toxic: 5.2 passes of the loop per query, now
        4.0, and 10 % fewer instructions)."""
        assert self.plane is not None
        while True:
            woken = self._woken
            if self.plane.offer(self.stream, data):
                break
            await woken.wait()
        self._yielded = True
        if not self._owed and trio.lowlevel.current_task() is self._runner:
            self._owed = True
            return
        self._owed = False
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        assert self.plane is not None
        while True:
            woken = self._woken
            if self.plane.offer_eof(self.stream):
                self.eof_offered = True
                return
            await woken.wait()
