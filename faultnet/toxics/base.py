"""The one small interface every toxic implements.

A toxic is a byte-level fault on ONE stream of a proxy (``upstream`` = client to server,
``downstream`` = server to client), named and typed as in Toxiproxy. The proxy keeps one
:class:`Toxic` object per toxic (its attributes, mutable live) and, for each connection
the toxic applies to, one :class:`ToxicContext` holding that connection's state.

Data flows through the toxics of a stream as a chain, in the order they were added:
the proxy calls ``on_chunk`` of the first; each toxic passes bytes on with
``ctx.forward`` (now, later, split, or never); the last ``forward`` writes to the socket.
``t_read`` is the trio clock when the proxy read the chunk, so a delay measured from it
pipelines: chunks read 1 ms apart leave 1 ms apart, whatever the delay.

Rules for implementers:

* ``on_chunk`` runs in the stream's single writer task, so calls never overlap for one
  connection and stream, and blocking in it (sleeping) back-pressures the reader.
* ``run`` is the toxic's per-connection background task (timers that fire without data,
  such as ``reset_peer``); it is cancelled when the toxic is removed or the connection
  ends. The default does nothing.
* Attributes are read at use, so an update applies to the next chunk.
* Toxicity is decided by the proxy once per connection and kept; a toxic never sees a
  connection it does not apply to.
* A toxic that must see both streams (a protocol's: requests go upstream, answers come
  downstream) sets ``both_streams``: it then gets a context on each stream, the two
  sharing ``state``, whatever its ``stream`` says, and sits in the chains as a layer
  (``layer``: lower is nearer the client; see :mod:`faultnet.toxics.chain`).
"""

from __future__ import annotations

import difflib
import random
from abc import ABC
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from faultnet.planes import stage_draws
from faultnet.toxics.draws import draws_of

__all__ = ["STREAMS", "Toxic", "ToxicContext", "refuse_unknown"]

#: Toxiproxy's stream names: upstream carries client->server bytes, downstream the reply.
STREAMS = ("upstream", "downstream")


class ToxicContext(Protocol):
    """What the proxy gives a toxic for one connection and stream."""

    conn_id: int
    stream: str
    #: Per-connection random source, derived from the proxy's seed: reproducible.
    rng: random.Random
    #: Scratch space for this toxic on this connection (byte counters, timers...).
    state: dict[str, Any]

    async def forward(self, data: bytes, t_read: float) -> None:
        """Pass *data* to the next toxic of the chain, or write it to the socket."""

    async def forward_eof(self) -> None:
        """Pass the end of this stream on (a FIN, half-close kept)."""

    async def close(self) -> None:
        """End the whole connection with a clean FIN both ways."""

    async def reset(self) -> None:
        """End the whole connection with an RST both ways."""


def refuse_unknown(type_name: str, attributes: Any, known: list[str]) -> None:
    """TypeError unless *attributes* is an object; ValueError naming the first key not in
    *known*, every known one, and the closest (worded as the chaos plan's check)."""
    if not isinstance(attributes, Mapping):
        raise TypeError(f"attributes must be an object, not {type(attributes).__name__}")
    for key in attributes:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            names = ", ".join(known) or "none"
            raise ValueError(
                f"unknown attribute {key!r} of toxic {type_name} (known: {names}){hint}"
            )


class Toxic(ABC):
    """Base class: a pass-through. Subclasses override what they change."""

    #: Toxiproxy's type name, e.g. ``"latency"``.
    type: ClassVar[str]
    #: True: the toxic sees both streams of a connection (see the module docstring).
    both_streams: ClassVar[bool] = False
    #: Where a both-stream toxic sits, lowest nearest the client: TLS termination 0,
    #: protocol toxics 1, TLS towards the upstream 2.
    layer: ClassVar[int] = 1

    def __init__(self, name: str, stream: str = "downstream", toxicity: float = 1.0) -> None:
        self.name = name
        self.stream = stream
        self.toxicity = toxicity

    def attributes(self) -> dict[str, Any]:
        """The toxic's attributes as Toxiproxy names them (units in the names' docs)."""
        return {}

    @classmethod
    def check_attributes(cls, attributes: Any) -> dict[str, Any]:
        """Validate a JSON ``attributes`` value (an object, or null); return the keys this
        toxic knows, checked. The base knows none: any key is refused (issue 33, 7).
        Raises TypeError/ValueError."""
        if attributes is not None:
            refuse_unknown(getattr(cls, "type", cls.__name__), attributes, [])
        return {}

    def check_update(self, attributes: Any) -> dict[str, Any]:
        """Validate *attributes* as an update of this toxic: :meth:`check_attributes`,
        and what the merged values mean together where a type says (a dns toxic's
        action and its figure). Raises TypeError/ValueError; applies nothing."""
        return self.check_attributes(attributes)

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Merge *attributes* into this toxic, all or nothing; live for every connection."""
        self.check_attributes(attributes)

    def compiled(self) -> tuple[str, float, float, float] | None:
        """This toxic as a data plane's compiled stage (see
        :meth:`faultnet.planes.Link.set_stages`), read again when its attributes change;
        None (the default): it runs in trio only."""
        return None

    def stage_word(self, ctx: ToxicContext) -> int | None:
        """The one word of *ctx*'s state a compiled stage carries (handed to the plane
        with the stage, and back when it leaves the plane): the stage's seeded generator
        (:func:`~faultnet.toxics.draws.draws_of`) where its compiled form draws
        (:func:`faultnet.planes.stage_draws`, the one test of it), else None (none: no
        generator is seeded for it)."""
        form = self.compiled()
        return draws_of(ctx.state, ctx.rng).state if form and stage_draws(form) else None

    def set_stage_word(self, ctx: ToxicContext, word: int) -> None:
        """Take back what :meth:`stage_word` handed to the plane, as the plane left it."""
        draws_of(ctx.state, ctx.rng).state = word

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        await ctx.forward(data, t_read)

    async def on_eof(self, ctx: ToxicContext) -> None:
        await ctx.forward_eof()

    async def run(self, ctx: ToxicContext) -> None:
        return None
