"""Toxics: the byte-level ones named and typed as Toxiproxy's, one module per toxic,
and faultnet's protocol toxics (:mod:`faultnet.toxics.http`, :mod:`faultnet.toxics.http2`,
:mod:`faultnet.toxics.grpc`, :mod:`faultnet.toxics.tls`),
which see both streams of a connection and run a :mod:`faultnet.protocols` session.

Each toxic is a class in its own module of this package that declares its attributes
(:class:`Attribute`, with units) and registers itself with :func:`register`; importing
this package imports every module in it, so :data:`TOXICS` (Toxiproxy type name ->
class) holds them all, and each class is re-exported here under its own name.

* :mod:`faultnet.toxics.base` -- the interface (:class:`Toxic`, :class:`ToxicContext`);
* :mod:`faultnet.toxics._attributes` -- typed, validated, live-updatable attributes;
* :mod:`faultnet.toxics.chain` -- the chain a stream's bytes run through;
* :mod:`faultnet.toxics.registry` -- :data:`TOXICS` and :func:`register`.

The HTTP API's JSON codec for toxics lives with the server
(:mod:`faultnet.server.toxic_codec`); the OpenAPI document's toxic type enum and
attribute schemas are generated from :data:`TOXICS`.

Adding a toxic touches:

1. one module here, e.g. ``faultnet/toxics/packet_loss.py``: an
   :class:`AttributeToxic` subclass with ``type``, ``ATTRIBUTES`` and the hooks it needs
   (``on_chunk``, ``on_eof``, ``run``), decorated with ``@register``;
2. its unit tests in ``tests/faultnet/toxics/test_packet_loss.py`` (a fake context on
   trio's mock clock, ``tests/faultnet/toxics/fake.py``) and an end-to-end test through a real proxy in ``test_toxics_e2e.py``.

Nothing else: the server, the CLI and the OpenAPI document find it in :data:`TOXICS`.
"""

from __future__ import annotations

import importlib
import pkgutil

from faultnet.toxics._attributes import (
    INT64_MAX,
    INT64_MIN,
    Attribute,
    AttributeToxic,
    TextAttribute,
)
from faultnet.toxics.base import STREAMS, Toxic, ToxicContext
from faultnet.toxics.registry import TOXICS, register

# Every module of the package, so that each toxic registers itself.
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

# Each registered class under its own name (from faultnet.toxics import Latency).
globals().update({cls.__name__: cls for cls in TOXICS.values()})

__all__ = [  # the toxic classes are found, not listed
    "INT64_MAX",
    "INT64_MIN",
    "STREAMS",
    "TOXICS",
    "TextAttribute",
    "Attribute",
    "AttributeToxic",
    "Toxic",
    "ToxicContext",
    "register",
    *sorted(cls.__name__ for cls in TOXICS.values()),
]
