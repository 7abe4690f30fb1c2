"""The base toxic (faultnet.toxics.base)."""

from __future__ import annotations

import pytest


def test_the_base_toxic_updates_without_attributes() -> None:
    from faultnet.toxics import Toxic

    class Plain(Toxic):
        type = "plain"

    t = Plain("p")
    t.update({})
    assert t.attributes() == {}
    with pytest.raises(ValueError, match="unknown attribute 'anything' of toxic plain"):
        t.update({"anything": 1})
    with pytest.raises(TypeError, match="must be an object"):
        t.update([1])  # type: ignore[arg-type]
