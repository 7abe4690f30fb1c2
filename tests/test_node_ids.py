"""The suite refuses tests that share a node id (tests/conftest.py): pytest-xdist would
run only one of them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import pytest_collection_modifyitems


def _items(*ids: str) -> Any:
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_distinct_node_ids_pass() -> None:
    pytest_collection_modifyitems(_items("t.py::a[x]", "t.py::a[y]", "t.py::b"))


def test_a_shared_node_id_is_refused_naming_it() -> None:
    with pytest.raises(pytest.UsageError, match=r"share a node id .*; 1 shared: t\.py::a$"):
        pytest_collection_modifyitems(_items("t.py::a", "t.py::b", "t.py::a"))
