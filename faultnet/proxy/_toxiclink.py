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

**Compiled stages.** When every toxic of the chain has a compiled form
(:meth:`~faultnet.toxics.base.Toxic.compiled`: latency, bandwidth, slicer, limit_data,
timeout, slow_close, reset_peer) and the plane has that pipeline
(:meth:`~faultnet.planes.Link.set_stages`: the native plane's is one of latency,
bandwidth, slicer or timeout, with a limit_data and a slow_close around it), the task
hands the stream back to the plane with the pipeline set and ends: the plane delays the
chunks itself, and each toxic's word goes with it
(:meth:`~faultnet.toxics.base.Toxic.stage_word`: its generator state, limit_data's
count; it comes back when the toxic leaves the plane). A toxic's own task
(``Toxic.run``: the timers of timeout and reset_peer) stays in trio.
An attribute update reaches the stage through :meth:`ToxicLink.retune`; a rebuilt chain
of another form takes the stream back to trio (or, empty, to the plain fast path).
``FAULTNET_COMPILED_STAGES=0`` keeps every chain in trio (the reference the differential
test compares the compiled stages with).

A stage's generator (:mod:`faultnet.toxics.draws`) is its word only when its form draws
(:func:`faultnet.planes.stage_draws`: a jitter, a size variation), and a word is taken
back only if it was handed (:attr:`ToxicLink.handed`): a stage that never drew leaves
the generator where the toxic would seed it, so its sequence is the same, and a
latency toxic without jitter seeds no ``random.Random`` per connection (issue 36).

**Many at once.** A toxic added to (or removed from) a proxy's connections takes each
idle stream onto the compiled stage, a pipeline of one (or off it), with :meth:`ToxicLink.staged` and
:meth:`ToxicLink.unstaged`, which only set what this object holds; the caller hands the
plane every such lane in one call (:mod:`faultnet.proxy._toxicbatch`).
"""

from __future__ import annotations

import os
from typing import Protocol

import trio

from faultnet.planes import Link, Stage, stage_draws
from faultnet.toxics.base import Toxic
from faultnet.toxics.chain import ToxicChain, ToxicStage
from faultnet.toxics.clock import monotonic_offset

__all__ = ["COMPILED_STAGES_ENV", "ChainSource", "ToxicLink"]

#: Set to ``0`` to keep every chain in trio (no compiled stage), read per connection.
COMPILED_STAGES_ENV = "FAULTNET_COMPILED_STAGES"

#: The chain of a stream no toxic has touched, shared by every such link (never
#: mutated: a chain is replaced whole), so an idle connection holds no chain of its own.
_NO_TOXICS = ToxicChain([])


class ChainSource(Protocol):
    """What a :class:`ToxicLink` asks of its connection: the chain as of now."""

    def build_chain(self, stream: str) -> ToxicChain:
        """The stages *stream*'s bytes go through, built from the connection's toxics."""
        ...


def _form(stage: ToxicStage) -> Stage:
    form = stage.toxic.compiled()
    assert form is not None  # a chain is compiled only when every stage has a form
    return form


def _give_back(stage: ToxicStage, word: int | None) -> None:
    """*stage*'s word, as the plane leaves it, back to its Python toxic (if it has one)."""
    if word is not None:
        stage.toxic.set_stage_word(stage, word)


class ToxicLink:
    """One stream of one connection on the toxic path: its chain, the task that runs it
    (:meth:`run`), the tasks of its stages (:meth:`start_stage`), and the chain's sink."""

    def __init__(self, stream: str, source: ChainSource) -> None:
        self.stream = stream
        self._source = source
        #: The connection in the plane, once it is there.
        self.plane: Link | None = None
        #: The stream's chain; replaced whole by :meth:`rebuild`.
        self.chain = _NO_TOXICS
        #: The chain's task is running (:meth:`start`).
        self.running = False
        self.eof_offered = False
        # The wake-ups' events are made when a task first waits on one (:meth:`_woken`,
        # :meth:`_changed`) and dropped when set: an idle link holds none. Four events
        # (and their four task sets) were 8 of an idle connection's 31 objects the
        # collector tracks (issue 36: its full passes at 9,000 connections).
        self._woken_event: trio.Event | None = None
        self._changed_event: trio.Event | None = None
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
        #: The stages the plane runs compiled for this stream, in the chain's order (None:
        #: trio runs the chain).
        self.compiled: tuple[ToxicStage, ...] | None = None
        #: The stages of :attr:`compiled` whose word the plane holds (handed over with
        #: it: :meth:`~faultnet.toxics.base.Toxic.stage_word`); the others' own is where
        #: it was.
        self.handed: tuple[ToxicStage, ...] = ()
        self._may_compile = os.environ.get(COMPILED_STAGES_ENV, "1") != "0"
        #: The chain last found to hold a both-stream stage (:meth:`_compilable`).
        self._paired: ToxicChain | None = None

    # -- the connection's side --

    def rebuild(self) -> None:
        """Take the chain as the connection's toxics now make it, and wake the task (an
        EOF a removed toxic held goes through; see :meth:`_eof`)."""
        self.chain = self._source.build_chain(self.stream)
        if self.compiled is not None:
            self.retune()
        changed, self._changed_event = self._changed_event, None
        if changed is not None:
            changed.set()
        self.wake()

    def _changed(self) -> trio.Event:
        """Set when the chain is next rebuilt (made now if no task waits for it yet)."""
        if self._changed_event is None:
            self._changed_event = trio.Event()
        return self._changed_event

    def _woken(self) -> trio.Event:
        """Set at the next :meth:`wake` (made now if no task waits for it yet)."""
        if self._woken_event is None:
            self._woken_event = trio.Event()
        return self._woken_event

    def retune(self) -> None:
        """While the plane runs the chain compiled: give it the chain's forms as of now
        (an attribute changed, or the chain did), or take the stream off the pipeline: to
        trio if the plane has no such pipeline (the caller starts the task: the
        connection's ``_put_on_path``), to the plain fast path if the chain is empty
        (what the pipeline queued goes out first)."""
        old, link = self.compiled, self.plane
        if old is None or link is None:
            return
        # Each stage leaving the plane takes its word (generator, count) back; one that
        # stays keeps the one the plane holds (None: the plane draws on; a word read and
        # put back would repeat a draw the thread made meanwhile), else gives its own.
        held = {
            stage: word
            for stage, word in zip(old, link.stage_words(self.stream), strict=False)
            if word is not None and stage in self.handed
        }
        wanted = self._compilable()
        if wanted is not None:
            for stage in old:
                if stage not in wanted:
                    _give_back(stage, held.get(stage))
            forms = [_form(stage) for stage in wanted]
            given = [None if stage in held else stage.toxic.stage_word(stage) for stage in wanted]
            if link.set_stages(self.stream, forms, given):
                self.compiled = wanted
                self.handed = tuple(
                    stage
                    for stage, word in zip(wanted, given, strict=True)
                    if word is not None or stage in held
                )
                return
            old = tuple(stage for stage in old if stage in wanted)  # the rest came back
        # Off the pipeline: the words come back to the Python toxics.
        self.compiled = None
        if self.chain.stages:
            link.to_trio(self.stream)  # the pipeline's queue goes to trio, read times kept
        else:
            link.set_stages(self.stream, [])
        for stage in old:
            _give_back(stage, held.get(stage))
        self.handed = ()

    def _compilable(self) -> tuple[ToxicStage, ...] | None:
        """The chain's stages, if the plane may run them compiled (the plane says whether
        it has that pipeline: :meth:`~faultnet.planes.Link.set_stages`)."""
        chain = self.chain
        if not self._may_compile or not chain.stages or chain is self._paired:
            return None
        stages = tuple(chain.stages)
        if any(stage.peer is not None for stage in stages):
            # A both-stream stage never has a compiled form, and a chain's stages never
            # change (it is replaced whole): asked before every chunk, answered once.
            self._paired = chain
            return None
        if any(stage.toxic.compiled() is None for stage in stages):
            return None
        return stages

    def to_stage(self) -> bool:
        """Hand the stream to the plane's compiled pipeline, if the chain has such a form
        and the plane that pipeline: True when it did (the task then ends)."""
        if self.compiled is not None:
            return True  # on it already (retune keeps it to the chain): the words are there
        link, stages = self.plane, self._compilable()
        if link is None or stages is None:
            return False
        forms = [_form(stage) for stage in stages]
        words = [stage.toxic.stage_word(stage) for stage in stages]
        if not link.set_stages(self.stream, forms, words):
            return False
        if not link.to_plane(self.stream):  # with a stage set it always takes the lane
            link.set_stages(self.stream, [])
            return False
        self.compiled = stages
        self.handed = tuple(
            stage for stage, word in zip(stages, words, strict=True) if word is not None
        )
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
        """*stage* is this :meth:`idle` stream's whole chain, run compiled by the plane
        (a pipeline of one): what :meth:`rebuild` and :meth:`to_stage` would make of it,
        the plane told by the caller (one call for many:
        :meth:`faultnet.planes.Plane.set_stages`). No task waits on an idle stream, so
        nothing is woken. *handed*: its word goes with it."""
        self.chain = ToxicChain([stage])
        self.compiled = (stage,)
        self.handed = self.compiled if handed else ()

    def retunable(self, stage: ToxicStage) -> bool:
        """Whether :meth:`retune` would only give the plane *stage*'s form anew: the
        plane runs it compiled as this stream's whole chain, and its word (generator,
        count), where it has one, is already the plane's (then the caller tells the
        plane, for many at once, with no word: the plane's goes on)."""
        if self.compiled != (stage,) or self._compilable() != (stage,):
            return False
        # A form that draws needs its generator on the plane; limit_data's count is
        # always handed with its stage (stage_word is never None for it).
        form = stage.toxic.compiled()
        return stage in self.handed or form is None or not stage_draws(form)

    def unstaged(self, stage: ToxicStage) -> bool:
        """Take *stage*, removed, off this stream if it is the whole chain and the plane
        runs it compiled (the caller then sets no pipeline on the lane, for many at
        once): True if it did. Its word is not taken back: the stage is gone."""
        compiled = self.compiled
        if compiled is None or len(compiled) != 1 or compiled[0] is not stage:
            return False
        if len(self.chain.stages) != 1 or self.running:
            return False
        self.chain = _NO_TOXICS
        self.compiled = None
        self.handed = ()
        return True

    def wake(self) -> None:
        """The plane has chunks, its held bytes drained, or the gate opened: look again."""
        woken, self._woken_event = self._woken_event, None
        if woken is not None:  # else no task waits: nothing to wake
            woken.set()

    def start(self, nursery: trio.Nursery) -> None:
        """Put the stream on the toxic path and start the chain's task (once)."""
        if self.running or self.eof_offered or self.plane is None or self.compiled is not None:
            return  # (compiled: the plane runs the chain)
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
        # Each chunk carries the time the plane read it (CLOCK_MONOTONIC, made trio
        # time): trio's clock is the same for the whole run, so its offset is read once.
        offset = monotonic_offset()
        try:
            while True:
                # Every chunk taken has been through the chain: the plane may run it now.
                if self.to_stage():
                    return
                woken = self._woken()  # taken before looking: no lost wake-up
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
                # The plane's read time, not one stamp for the batch taken now: that made
                # a chunk read while the last one was delayed wait out that delay and then
                # its own (issue 32: latency=5 ms on a steady stream gave 10-16 ms).
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
            changed = self._changed()  # taken before offering: no lost wake-up
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
            woken = self._woken()
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
            woken = self._woken()
            if self.plane.offer_eof(self.stream):
                self.eof_offered = True
                return
            await woken.wait()
