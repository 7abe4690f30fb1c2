"""One toxic added to, or removed from, every connection of a proxy: one pass over the
connections, one hand-off to the plane (issue 36, item 3).

Added one connection at a time, a latency toxic cost each of 9,000 idle connections a
chain built from the proxy's whole toxic list, a seeded ``random.Random`` for a
generator it never drew from, and four calls into the plane (to the toxic path, the
stage, its generator, back to the plane), each taking the plane's mutex: 297-640 ms
through the API, against a target of 200.

A :class:`ToxicBatch` is made once per operation from the toxic: what every
connection's stage of it shares (its compiled form, the stream). The proxy's one pass offers it each connection's stage: :meth:`ToxicBatch.take`
takes a stage the plane can run compiled on a stream that had no toxic and no task
(:meth:`~faultnet.proxy._toxiclink.ToxicLink.idle`): that stream's chain is the stage
alone, so nothing is built, and its lane is listed. Any other stage goes the
per-connection way (:meth:`faultnet.proxy._connection.Connection._put_on_path`: a chain
with other toxics, the hop, a both-stream toxic, a plane without the stage, a stream
whose task is running). :meth:`ToxicBatch.hand_off` then gives the plane every listed
lane in one call (:meth:`faultnet.planes.Plane.set_stages`), each a pipeline of that
one stage with its word (:meth:`~faultnet.toxics.base.Toxic.stage_word`: the generator
where the form draws, limit_data's count). An update of the toxic's attributes is the
same pass: :meth:`ToxicBatch.retake` lists each lane whose whole chain the plane runs as
that stage, its word already the plane's, and the hand-off gives it the new form and no
word (one call where a walk set each lane's stages on its own). A removal is the mirror:
:meth:`ToxicBatch.take_off` lists each lane whose chain was that stage alone, and the
hand-off sets the empty pipeline on them.

A stream already on a compiled pipeline of other toxics (a limit_data, say) that the
toxic joins, or leaves, goes the per-connection way: its chain is rebuilt and the
plane's pipeline retuned (:meth:`~faultnet.proxy._toxiclink.ToxicLink.retune`), which
keeps it on the plane where the plane has the longer pipeline. So does a toxic with a
task of its own (timeout's and reset_peer's timers).

Nothing checkpoints between the pass and the hand-off, so no task sees a connection
whose state says compiled while its lane does not yet have the stage; the plane's
thread may forward a lane's bytes meanwhile, before the toxic is in force (it is in
force when the add returns).
"""

from __future__ import annotations

from faultnet.planes import Link, Plane, Stage
from faultnet.proxy._toxiclink import ToxicLink
from faultnet.toxics.base import Toxic
from faultnet.toxics.chain import ToxicStage

__all__ = ["ToxicBatch"]


class ToxicBatch:
    """The lanes one toxic's add (or removal) hands the plane at once, and what every
    connection's stage of it shares."""

    def __init__(self, toxic: Toxic, plane: Plane | None) -> None:
        self.stream = toxic.stream
        #: The compiled form the plane runs for every taken lane (None: none is taken).
        self.form: Stage | None = None
        if plane is not None and not toxic.both_streams and type(toxic).run is Toxic.run:
            form = toxic.compiled()
            if form is not None and form[0] in plane.stages:
                self.form = form
        self.links: list[Link] = []
        #: Each taken stage's word (:meth:`~faultnet.toxics.base.Toxic.stage_word`: its
        #: generator where its form draws, limit_data's count), in :attr:`links`' order.
        self._words: list[int | None] = []
        self._toxic = toxic

    def take(self, toxic_link: ToxicLink, stage: ToxicStage) -> bool:
        """List *stage*'s lane for the compiled stage if its stream is idle (see the
        module docstring), and make the stage that stream's chain: True if taken."""
        if self.form is None or not toxic_link.idle() or not toxic_link.may_compile():
            return False
        assert toxic_link.plane is not None  # idle(): it is in the plane
        word = self._toxic.stage_word(stage)
        self._words.append(word)
        toxic_link.staged(stage, word is not None)
        self.links.append(toxic_link.plane)
        return True

    def retake(self, toxic_link: ToxicLink, stage: ToxicStage) -> bool:
        """List *stage*'s lane for the toxic's form as updated if the plane runs the
        stage compiled as its stream's whole chain, its word already the plane's where it
        has one (:meth:`~faultnet.proxy._toxiclink.ToxicLink.retunable`): True if taken
        (else the caller retunes it on its own)."""
        if self.form is None or toxic_link.plane is None or not toxic_link.retunable(stage):
            return False
        self._words.append(None)  # the plane's word goes on
        self.links.append(toxic_link.plane)
        return True

    def take_off(self, toxic_link: ToxicLink, stage: ToxicStage) -> bool:
        """List the lane of *stage*, removed, if the plane ran it compiled as the
        stream's whole chain: True if taken (its lane then gets no stage)."""
        if toxic_link.plane is None or not toxic_link.unstaged(stage):
            return False
        self.links.append(toxic_link.plane)
        return True

    def hand_off(self, plane: Plane | None, adding: bool) -> None:
        """Give the plane every listed lane at once: the toxic's stage (*adding*, or an
        update: no generator goes with it), or none (a removal)."""
        if plane is None or not self.links:
            return
        if adding:
            assert self.form is not None  # a lane is taken only with a form
            pipeline = [self.form]  # the one list every taken lane's entry points to
            words = (
                [[word] for word in self._words]
                if any(w is not None for w in self._words)
                else None
            )
            plane.set_stages(self.links, self.stream, [pipeline] * len(self.links), words)
        else:
            plane.set_stages(self.links, self.stream, [[]] * len(self.links), None)
