"""Reproducible randomness: every random choice is ``sha256("<seed>:<counter>")``.

Not :mod:`random`: its generator is a process-local object whose state a second process
(or a second implementation) cannot reproduce from the seed alone. A draw here is a pure
function of two integers, so any tool in any language replays a plan from its seed, and
every decision in the join log names the counter that made it. The hash is
:func:`faultnet.seeds.derive_bits`, the one faultnet derives every seed with.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import TypeVar

from faultnet.seeds import derive_bits

__all__ = ["Draws", "choose_seed", "draw"]

T = TypeVar("T")

#: Seeds chosen when none is given fit in 32 bits: short enough to type back in.
SEED_BITS = 32


def draw(seed: int, counter: int) -> float:
    """The draw numbered *counter* under *seed*: a float in [0, 1), 53 bits of the hash."""
    return derive_bits(seed, counter, bits=53) / (1 << 53)


def choose_seed() -> int:
    """A fresh seed from the OS (used once, then logged like any other decision)."""
    return secrets.randbits(SEED_BITS)


class Draws:
    """Numbered draws under one seed; :attr:`counter` is the number of the next one."""

    def __init__(self, seed: int, counter: int = 0) -> None:
        self.seed = seed
        self.counter = counter

    def random(self) -> float:
        value = draw(self.seed, self.counter)
        self.counter += 1
        return value

    def uniform(self, lo: float, hi: float) -> float:
        """A value in [lo, hi], rounded to milliseconds of a unit (plans print exactly)."""
        return round(lo + (hi - lo) * self.random(), 3)

    def choice(self, items: Sequence[T]) -> T:
        if not items:
            raise ValueError("choice from nothing")
        return items[min(int(self.random() * len(items)), len(items) - 1)]

    def weighted(self, items: Sequence[tuple[T, float]]) -> T:
        """One item, with probability proportional to its weight (weights > 0)."""
        total = sum(w for _, w in items)
        if not items or total <= 0:
            raise ValueError("weighted choice from nothing")
        x = self.random() * total
        for item, weight in items:
            x -= weight
            if x < 0:
                return item
        return items[-1][0]
