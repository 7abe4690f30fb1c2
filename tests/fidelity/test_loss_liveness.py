"""The two-way loss liveness row: clients with keepalive and TCP_USER_TIMEOUT die
through faultnet's ``loss(both_ways=True)`` about as often as through nft's random drop,
and its judge goes red when the client's own leg is spared (the loss on the internal
hop only, as before: none died). In a network namespace the run makes (root)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.fidelity._cases import CASES, lossy_lives
from tests.fidelity.test_fidelity_table import _require_root

#: The row's scenario run with faultnet's side broken: the client leg's probe loss
#: taken off (``client_leg_loss`` 0: no filter on the client-facing socket).
_SPARED = """
import json
import faultnet.proxy._faultstate as faultstate
faultstate.client_leg_loss = lambda p: 0.0
from harness.fidelity import enter_private_netns, run
from harness.fidelity._cases import CASES, lossy_lives
enter_private_netns()
(row,) = run([c for c in CASES if c.scenario is lossy_lives])
print(json.dumps([row.verdict.same, row.verdict.text, row.faultnet.counts, row.faultnet.tries]))
"""


def test_the_liveness_row_is_two_way_loss_judged_by_the_share_that_lived() -> None:
    (case,) = [c for c in CASES if c.scenario is lossy_lives]
    assert case.faultnet == ("loss", {"percent": 20, "both_ways": True}, "thaw")
    assert case.contrast is None


# Measured: the row takes 16 s at load 7 and 17-19 s at load 10-15 (both sides, 64
# connections each in two turns of 4 s).
@pytest.mark.timeout(150)
def test_the_liveness_row_s_judge_goes_red_when_the_client_s_leg_is_spared() -> None:
    _require_root()
    done = subprocess.run(
        [sys.executable, "-c", _SPARED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    same, verdict, counts, tries = json.loads(done.stdout)
    assert counts == {"lived": tries}, verdict  # the old behaviour: none died
    assert not same, verdict
