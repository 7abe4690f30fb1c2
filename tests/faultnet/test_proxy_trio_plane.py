"""The proxy's whole test module, and the toxics' end-to-end tests, again on the trio
pumps (faultnet.pump: a task per direction), the data plane ``FAULTNET_DATAPLANE=trio``
or ``Proxy(dataplane="trio")`` picks instead of the default thread plane.

The imported tests are collected here a second time, and this module's autouse fixture
sets ``FAULTNET_DATAPLANE=trio`` for them, so every Proxy they make forwards with trio's
pumps (tests that ask for a plane by argument keep theirs).
"""

from __future__ import annotations

import pytest

from tests.faultnet.test_proxy import *  # noqa: F403
from tests.faultnet.toxics.test_toxics_e2e import *  # noqa: F403


@pytest.fixture(autouse=True)
def _trio_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTNET_DATAPLANE", "trio")
