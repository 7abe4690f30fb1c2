"""The base toxic (faultnet.toxics.base)."""

from __future__ import annotations

import pytest


def test_the_base_toxic_updates_without_attributes() -> None:
    from faultnet.toxics import Toxic

    class Plain(Toxic):
        type = "plain"

    t = Plain("p")
    t.update({"anything": 1})  # unknown keys are ignored, as Toxiproxy does
    assert t.attributes() == {}
    with pytest.raises(TypeError, match="must be an object"):
        t.update([1])  # type: ignore[arg-type]
