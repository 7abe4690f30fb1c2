"""Data planes: what moves a connection's bytes, behind one small interface.

The proxy core (:mod:`faultnet.proxy`) keeps each connection's fault state and drives
a plane only through :class:`Plane` and :class:`Link` below; a plane knows nothing of
fault modes, toxics or the event log. It moves bytes between two sockets, per direction
(a *lane*: ``upstream`` is client to server, ``downstream`` server to client), behind a
gate per lane, and tells the core what it must act on through ``on_event``.

The contract every plane keeps (and every plane runs the same tests):

* **Total on return.** When :meth:`Link.freeze` returns, no byte-moving syscall of those
  lanes is in progress and none starts until :meth:`Link.thaw`; the counters are final.
  :meth:`Link.end` takes the link out of the plane: after it returns the plane makes no
  syscall on its descriptors (the caller closes them).
* **Held, not lost.** Bytes read but not yet written while a lane is frozen (or its
  ``dst`` full) are kept by the plane and written in order on thaw, then a pending EOF.
* **Half-close.** An EOF read on a lane is forwarded as ``shutdown(SHUT_WR)`` on its
  ``dst`` once what it holds is written; the other lane keeps going. When both EOFs have
  been forwarded the link ends by itself with :data:`DONE`.
* **Events** reach trio in the trio thread, in batches, as ``on_event(kind, stream)``:
  the kinds below. After RESET, DONE, ERROR or UPSTREAM_FAILED the link has ended;
  after CLOSE the core ends it (a compiled stage asks: limit_data's limit reached).
* **The toxic path.** A lane handed over with :meth:`Link.to_trio` is still read by the
  plane (gate first), but its chunks are queued for trio (:meth:`Link.take`, b"" is the
  EOF, signalled by CHUNKS; :meth:`Link.take_timed` with each chunk's read time;
  the inbox is bounded in bytes) and trio writes what its toxic chain lets out with
  :meth:`Link.offer` / :meth:`Link.offer_eof` (gate first; DRAINED when held bytes went
  out). :meth:`Link.to_plane` hands the lane back once trio has taken every chunk
  (its toxics were removed).
* **Rerouting.** :meth:`Link.reroute` swaps a live link's server socket for another
  (the internal hop of two-way loss moves its bytes as two links of the plane).
* **Compiled stages.** A plane may run a chain of toxics itself, as a pipeline
  (:meth:`Link.set_stages`: the native plane runs latency, bandwidth, slicer,
  limit_data, timeout, slow_close and reset_peer on its thread): the lane's chunks then
  queue in the plane with their read times and leave when due, in order, the EOF after
  them, under the same gate, bounded by the same bytes. A plane without that pipeline
  says so, and the chain runs in trio. A plane names the stages it runs
  (:attr:`Plane.stages`) and gives pipelines to many links' lanes in one call
  (:meth:`Plane.set_stages`: a toxic added to every connection of a proxy is one
  hand-off, not a call per connection). The trio side of that path is the core's (:mod:`faultnet.proxy`), not a plane's.

Planes are registered in :data:`PLANES` (name -> module exposing ``Plane`` and
``AVAILABLE``), fastest first; :func:`default_plane` is the first available one unless
``$FAULTNET_DATAPLANE`` names another.
"""

from __future__ import annotations

import functools
import importlib
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = [
    "CHUNKS",
    "CLOSE",
    "DONE",
    "DRAINED",
    "ERROR",
    "PLANES",
    "RESET",
    "Pipelines",
    "Stage",
    "UPSTREAM_FAILED",
    "Words",
    "Link",
    "LinkBase",
    "Plane",
    "available_planes",
    "check_plane",
    "default_plane",
    "freeze_each",
    "thaw_each",
    "make_plane",
    "stage_draws",
]

#: Event kinds delivered to ``on_event(kind, stream)``.
RESET = "reset"  # a peer reset (or a syscall failed): errno in Link.errno; link ended
DONE = "done"  # both ways forwarded their EOF; link ended, sockets not yet closed
CHUNKS = "chunks"  # a toxic-path lane has chunks for trio (take them with Link.take)
DRAINED = "drained"  # a toxic-path lane's held bytes were written (offer may go on)
ERROR = "error"  # the plane failed on this link (a bug): Link.error; link ended
UPSTREAM_FAILED = "upstream_failed"  # the connect failed or timed out: Link.errno; ended
CLOSE = "close"  # a compiled stage ends the connection (a clean FIN both ways); link live


#: Plane name -> the module that implements it (``Plane``, ``AVAILABLE``), fastest first.
PLANES: dict[str, str] = {
    "native": "faultnet.planes.native",
    "thread": "faultnet.planes.thread",
}

OnEvent = Callable[[str, "str | None"], None]

#: A toxic's compiled form: (kind, a, b, c), a stage of :meth:`Link.set_stages`.
Stage = tuple[str, float, float, float]
#: A pipeline of stages for each link of a :meth:`Plane.set_stages` batch.
Pipelines = Sequence[Sequence[Stage]]
#: Each pipeline's stages' words (their generators' states, limit_data's count), or None.
Words = Sequence[Sequence[int | None]] | None


def stage_draws(stage: Stage) -> bool:
    """Whether a compiled stage of this form draws from its generator: latency with a
    jitter, the slicer with a size variation (``draw_uniform``, ``slice_head`` in the
    C). One that does not never needs its generator's state handed over, which costs a
    seeded ``random.Random`` per connection (~11 us: issue 36); it is handed when an
    update makes the stage draw (:meth:`faultnet.proxy._toxiclink.ToxicLink.retune`).
    The one test of it: :meth:`faultnet.toxics.base.Toxic.stage_word` asks it too."""
    kind, a, b, _ = stage
    return (kind == "latency" and b > 0) or (kind == "slicer" and a > 0 and b > 0)


class Link(Protocol):
    """One connection in a plane: two lanes. Every method returns at once."""

    # Read-only to the core (a plane sets them; a link made of two, the hop's, derives
    # them from its links).
    @property
    def connecting(self) -> bool:
        """The upstream connect is still under way (nothing is forwarded yet)."""

    @property
    def ended(self) -> bool:
        """The link has left the plane (ended by an event or by :meth:`end`)."""

    @property
    def errno(self) -> int:
        """The errno behind RESET or UPSTREAM_FAILED."""

    @property
    def error(self) -> Exception | None:
        """The exception behind ERROR."""

    #: Where its events go (its owner may redirect them later: the hop does).
    on_event: OnEvent

    def freeze(self, streams: Iterable[str]) -> None:
        """Close the lanes' gates: total on return."""

    def thaw(self, streams: Iterable[str]) -> None:
        """Open the gates; held bytes, then a held EOF, go out before anything newer."""

    def end(self) -> bool:
        """Take the link out of the plane; False if it had already ended."""

    def counts(self) -> tuple[int, int]:
        """Bytes written (upstream, downstream): every byte a peer can have read."""

    def eof_forwarded(self, stream: str) -> bool:
        """Whether *stream*'s EOF has been passed on (a half-close)."""

    def to_trio(self, stream: str) -> None:
        """Put *stream* on the toxic path (until :meth:`to_plane`)."""

    def to_plane(self, stream: str) -> bool:
        """Take *stream* off the toxic path, back to the plane's own forwarding: False
        (nothing changed) while chunks read for trio wait to be taken. Bytes trio's last
        offer left held go out first, then the plane reads on by itself."""

    def on_toxic_path(self, stream: str) -> bool:
        """Whether *stream* is on the toxic path."""

    def holding(self, stream: str) -> bool:
        """Whether *stream* holds bytes it read and has not written (held behind a full
        ``dst`` or a closed gate, or read for trio and not yet taken): what ending the
        link now would lose."""

    def set_stages(
        self, stream: str, stages: Sequence[Stage], words: Sequence[int | None] = ()
    ) -> bool:
        """Run *stream*'s chain as a compiled pipeline of the plane: *stages* in the
        chain's order, each a toxic's form (``("latency", latency_ms, jitter_ms, 0)``,
        ``("bandwidth", rate_kbps, 0, 0)``, ``("slicer", average_size, size_variation,
        delay_us)``, ``("limit_data", bytes, 0, 0)``, ``("timeout", 0, 0, 0)``: drop all,
        hold the EOF, ``("slow_close", delay_ms, 0, 0)``, ``("reset_peer", 0, 0, 0)``:
        bytes pass), ``words[i]`` the word ``stages[i]`` starts from
        (:meth:`faultnet.toxics.base.Toxic.stage_word`: its generator of
        :mod:`faultnet.toxics.draws`, limit_data's count; None or absent: the one it has
        on the plane goes on): in force at once, and on its own once :meth:`to_plane`
        takes the lane back from trio, which it then does even with chunks untaken
        (they are the pipeline's). Empty: none (what it queued goes out at once, in
        order; then the plain fast path). False (nothing changed) for a pipeline this
        plane has not compiled: the chain stays in trio."""

    def stage_words(self, stream: str) -> list[int | None]:
        """The words of *stream*'s pipeline (:meth:`set_stages`), in its stages' order
        (None for a stage that carries none)."""

    def take(self, stream: str) -> list[bytes]:
        """The chunks read for trio so far (b"" is the EOF)."""

    def take_timed(self, stream: str) -> list[tuple[bytes, float]]:
        """As :meth:`take`, each chunk with the time the plane read it, in seconds of
        CLOCK_MONOTONIC (``time.monotonic()``; trio's real clock is that plus its
        offset). The latency toxic delays a chunk from this time."""

    def offer(self, stream: str, data: bytes | memoryview) -> bool:
        """Write *data* (gate first); False while frozen or earlier bytes are held.
        Raises ConnectionError if the link has ended or the write failed."""

    def offer_eof(self, stream: str) -> bool:
        """Forward the EOF after what is held; False while frozen."""

    def reroute(self, sock: socket.socket) -> int | None:
        """Relay through *sock* in place of the server's socket from now on (the
        internal hop: :mod:`faultnet.proxy._hop`): the upstream lane writes to it, the
        downstream lane reads it. Bytes held keep their order (held upstream bytes go to
        *sock*; held downstream bytes, read from the server, still go to the client), an
        upstream EOF already forwarded is forwarded to *sock* too, and the server's
        socket leaves the plane untouched (for another link). Returns the bytes the
        upstream lane had written by then, all to the server's socket (its count goes
        on: later bytes are written to *sock*), or None (nothing changed) while the link is connecting
        or has ended."""


class Plane(Protocol):
    """What moves the bytes of every connection of the proxies that share it (one
    started plane of each kind per trio run: :mod:`faultnet.proxy._sharedplane`); each
    link's events go to its own ``on_event``, and each owner ends its own links."""

    #: Its name in :data:`PLANES`.
    name: str
    #: The kinds of compiled stage it runs (:meth:`Link.set_stages`; empty: none).
    stages: frozenset[str]

    def start(self, token: object) -> None:
        """Start forwarding; events reach trio through *token* (a TrioToken)."""

    def stop(self) -> None:
        """Stop forwarding; links still in the plane are their owners' to end."""

    def add(
        self,
        client: socket.socket,
        server: socket.socket,
        on_event: OnEvent,
        frozen: Iterable[str] = (),
        to_trio: Iterable[str] = (),
        connect_timeout: float | None = None,
    ) -> Link:
        """Start forwarding between two non-blocking sockets (*frozen* lanes start with
        their gate closed, *to_trio* lanes on the toxic path). With *connect_timeout*,
        *server*'s connect is under way: forwarding starts once it completes, or the
        link ends with UPSTREAM_FAILED."""

    def settle(self) -> None:
        """Move, in the calling thread, whatever is ready now (faults call it before
        counting connections)."""

    def freeze(self, links: list[Link], streams: Iterable[str]) -> tuple[int, int]:
        """What :meth:`Link.freeze` does, for every link in *links* at once (a fault on
        many connections: one call); returns (upstream, downstream), the bytes they had
        written when their gates closed, summed (:meth:`Link.counts` of each)."""

    def thaw(self, links: list[Link], streams: Iterable[str]) -> None:
        """What :meth:`Link.thaw` does, for every link in *links* at once (a thaw of a
        fault on many connections: one call)."""

    def set_stages(
        self, links: list[Link], stream: str, pipelines: Pipelines, words: Words
    ) -> None:
        """What :meth:`Link.set_stages` does, for *stream* of every link in *links* at
        once: link i's gets ``pipelines[i]`` (its stages' forms, each kind one of
        :attr:`stages`; empty: none), with ``words[i]`` if *words* is given; a lane on
        the toxic path goes back to the plane with it, as :meth:`Link.to_plane`. A link
        that has ended is left alone. ValueError for a pipeline this plane does not run
        (nothing is changed then)."""


_P = TypeVar("_P")
_L = TypeVar("_L")


class LinkBase(Generic[_P, _L]):
    """What a plane's link holds on the Python side, in every plane: its plane, the
    owner's ``on_event``, the exception behind ERROR, the two sockets' descriptors
    (client's, server's) and its two lanes, made by ``lane(stream, src, dst)``:
    ``upstream`` reads the client and writes the server, ``downstream`` the reverse."""

    def __init__(
        self,
        plane: _P,
        client: socket.socket,
        server: socket.socket,
        on_event: OnEvent,
        lane: Callable[[str, socket.socket, socket.socket], _L],
    ) -> None:
        self.plane = plane
        self.on_event = on_event
        self.error: Exception | None = None
        self.fds = (client.fileno(), server.fileno())
        self.lanes = {
            "upstream": lane("upstream", client, server),
            "downstream": lane("downstream", server, client),
        }
        # The compiled base's own init (the native plane's: its lanes own no pipe yet).
        super().__init__()


def thaw_each(links: Iterable[Link], streams: Iterable[str]) -> None:
    """:meth:`Plane.thaw` one link at a time: each link's own :meth:`Link.thaw`."""
    streams = list(streams)
    for link in links:
        link.thaw(streams)


def freeze_each(links: Iterable[Link], streams: Iterable[str]) -> tuple[int, int]:
    """:meth:`Plane.freeze` one link at a time: each link's own :meth:`Link.freeze`,
    then its :meth:`Link.counts`, summed."""
    streams = list(streams)
    up = down = 0
    for link in links:
        link.freeze(streams)
        u, d = link.counts()
        up += u
        down += d
    return up, down


def available_planes() -> list[str]:
    """The planes that can run here (a compiled one only where it was built)."""
    return list(_available())


@functools.cache
def _available() -> tuple[str, ...]:
    # Looked up once: a module's AVAILABLE is fixed at its import, and every proxy's
    # start asks twice (issue 36: ~15 us of a 1,000-proxy create's ~340 us a proxy).
    return tuple(name for name, module in PLANES.items() if _module(module).AVAILABLE)


def default_plane() -> str:
    """``$FAULTNET_DATAPLANE`` if set, else the first available plane."""
    return os.environ.get("FAULTNET_DATAPLANE") or available_planes()[0]


def check_plane(name: str) -> str:
    """*name* if it is a plane that can run here; ValueError naming those that can."""
    found = available_planes()
    if name not in found:
        raise ValueError(f"dataplane must be one of {', '.join(found)}, not {name!r}")
    return name


def make_plane(name: str, *, splice: bool = True) -> Plane:
    """A new, not yet started, plane *name*; ValueError naming the available ones."""
    plane: Plane = _module(PLANES[check_plane(name)]).Plane(splice=splice)
    return plane


def _module(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(name)
