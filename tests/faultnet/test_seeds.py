"""faultnet.seeds: the one hash every seed and every chaos draw comes from."""

from __future__ import annotations

import hashlib

import pytest

from faultnet.chaos import draw
from faultnet.seeds import derive_bits, derive_seed


def test_derive_bits_is_the_leading_bits_of_sha256_of_the_joined_parts() -> None:
    digest = hashlib.sha256("faultnet:7:proxy é".encode()).digest()
    whole = int.from_bytes(digest, "big")
    assert derive_bits("faultnet", 7, "proxy é", bits=256) == whole
    assert derive_bits("faultnet", 7, "proxy é", bits=64) == int.from_bytes(digest[:8], "big")
    assert derive_bits("faultnet", 7, "proxy é", bits=1) == digest[0] >> 7
    for bad in (0, 257):
        with pytest.raises(ValueError, match="bits must be 1 to 256"):
            derive_bits("x", bits=bad)


def test_seeds_and_chaos_draws_are_derive_bits_with_values_unchanged() -> None:
    # Pinned before the chaos draws were expressed through derive_bits: plans replay.
    assert derive_seed(7, 3) == 616456930342725979
    assert derive_seed("faultnet", 1, "p") == 2259300488451996133
    assert draw(7, 3) == 0.06683639431213284 and draw(0, 0) == 0.6736177528149841
    for seed in (0, 1, 2**32 - 1, 2**62):
        for counter in range(50):
            assert derive_seed(seed, counter) == derive_bits(seed, counter, bits=63)
            assert draw(seed, counter) == derive_bits(seed, counter, bits=53) / 2**53
