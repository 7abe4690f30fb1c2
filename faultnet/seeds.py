"""The one derivation of a child seed from a parent seed (principle 7: reproducible).

A derived seed is a pure function of its parts, so the same server seed, proxy names,
connection order and toxic names replay the same random choices. Standard library only,
so the pytest plugin can use it without importing trio.

Both faultnet's seeds and the chaos plan's draws (:mod:`faultnet.chaos._draws`) are
:func:`derive_bits`: the leading bits of ``sha256("<part>:<part>:...")``.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_bits", "derive_seed"]


def derive_bits(*parts: object, bits: int) -> int:
    """The leading *bits* (1 to 256) bits of ``sha256`` of *parts* as ``str``, joined by
    ``":"`` and UTF-8 encoded, as an unsigned integer: a pure function of the parts that
    any language can recompute."""
    if not 1 <= bits <= 256:
        raise ValueError(f"bits must be 1 to 256, not {bits}")
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest, "big") >> (256 - bits)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of *parts* (the parent seed first)."""
    return derive_bits(*parts, bits=63)
