"""The one derivation of a child seed from a parent seed (principle 7: reproducible).

A derived seed is a pure function of its parts, so the same server seed, proxy names,
connection order and toxic names replay the same random choices. Standard library only,
so the pytest plugin can use it without importing trio.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of *parts* (the parent seed first)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
