"""The rule every protocol session's states keep (h11's ``_state.py``): a state changes
only through its session's ``TRANSITIONS`` table, (state, event) -> next state.

Each session (:mod:`~faultnet.protocols.http`, ``http2``, ``resp``, ``postgres``,
``tls``) declares its own table, its streams' states side by side; :func:`step` is the
one way through any of them. A pair not in the table is a bug (KeyError), and so is a
next state of another kind than the one it leaves (one stream's state for another's).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["step"]

S = TypeVar("S", bound=enum.Enum)


def step(table: Mapping[Any, enum.Enum], state: S, event: enum.Enum) -> S:
    """The state *event* moves *state* to, by *table*."""
    new = table[(state, event)]
    assert isinstance(new, type(state)), (state, event, new)
    return new
