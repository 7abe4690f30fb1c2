"""Which planes can run here is looked up once a process, not once a proxy (issue 36:
each proxy's start asked twice, ~15 us of the ~340 us a proxy's create costs)."""

from __future__ import annotations

from typing import Any

import pytest

from faultnet import planes


def test_available_planes_imports_each_plane_module_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []
    real = planes._module

    def counting(name: str) -> Any:
        looked_up.append(name)
        return real(name)

    monkeypatch.setattr(planes, "_module", counting)
    planes._available.cache_clear()
    first = planes.available_planes()
    for _ in range(100):  # what 50 proxies' starts ask
        assert planes.available_planes() == first
        assert planes.check_plane(planes.default_plane()) == planes.default_plane()
    assert sorted(looked_up) == sorted(planes.PLANES.values())


def test_available_planes_is_the_callers_own_list() -> None:
    planes.available_planes().clear()
    assert planes.available_planes()
