"""The toxics' seeded generator: splitmix64, defined once for Python and for C.

Whether a toxic of toxicity < 1 applies to a connection is its seed's first draw
(:func:`picks`). A toxic that draws (latency's jitter, the slicer's sizes) draws from
:class:`Draws`, seeded from its stage's rng (itself derived from the proxy's seed, the
connection and the toxic's name). The native plane's compiled stages
(``faultnet/planes/_native.c``: ``draw64``, ``draw_uniform``) run the same generator,
bit for bit, on a state handed to them, so a stream draws the same sequence whichever
path runs it (``tests/faultnet/planes/test_compiled_stages.py`` compares the two).

splitmix64 (Steele, Lea and Flood, 2014) because it is a few lines in any language, its
state is one 64-bit word that can be handed over (and stepped back: ``state -= GAMMA``)
and it passes BigCrush; ``random.Random`` (Mersenne Twister) has 2.5 KB of state.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["GAMMA", "Draws", "draws_of", "picks"]

GAMMA = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


class Draws:
    """One seeded sequence of draws; :attr:`state` is all of it."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next64(self) -> int:
        """The next 64-bit draw."""
        self.state = z = (self.state + GAMMA) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def random(self) -> float:
        """Uniform in [0, 1): the draw's top 53 bits over 2**53 (exact in a double)."""
        return (self.next64() >> 11) * (1.0 / 9007199254740992.0)

    def uniform(self, a: float, b: float) -> float:
        """Uniform in [a, b): ``a + (b - a) * u``, the same operations as the C."""
        return a + (b - a) * self.random()

    def integer(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi] (hi >= lo): lo + the draw modulo the range's size, as the
        C's ``draw_int`` (the modulo's bias is below 2**-40 for ranges under 2**24)."""
        return lo + self.next64() % (hi - lo + 1)


def picks(seed: int, toxicity: float) -> bool:
    """Whether a toxic of *toxicity* applies to the connection whose seed is *seed* (the
    proxy's seed, the connection and the toxic's name: ``derive_seed``): the first
    :meth:`Draws.random` of that seed is below *toxicity*. The C's ``draw_uniform(seed,
    0, 1)`` is the same number, bit for bit; 0 never applies, 1 always does (no draw)."""
    return toxicity >= 1.0 or Draws(seed).random() < toxicity


def draws_of(state: dict[str, Any], rng: random.Random) -> Draws:
    """The :class:`Draws` kept in a stage's *state*, seeded the first time with 64 bits
    of the stage's *rng* (so the connection's seed decides every draw)."""
    found = state.get("draws")
    if isinstance(found, Draws):
        return found
    made = Draws(rng.getrandbits(64))
    state["draws"] = made
    return made
