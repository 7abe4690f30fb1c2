"""The HTTP toxics' fidelity rows: each toxic against nginx doing the same fault itself
(``return 503``, an upstream that closes mid-body, ``limit_rate``, an upstream that
never answers), seen by the same real clients with their retry logic: requests with
urllib3's Retry and aiohttp with aiohttp-retry (harness/fidelity/_toxics.py's pair
rows, harness/fidelity/_http.py's clients). No root: nginx runs from a temporary
directory on this process's loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import faultnet.protocols.http as http_session
from harness.fidelity._http import CLIENTS, same_outcome, same_pace
from harness.fidelity._toxics import TOXIC_CASES, ToxicCase, ToxicServers, run_toxic, toxic_servers
from harness.fidelity._world import nginx_path
from tests.conftest import require_program
from tests.fidelity._toxic_rows import check_toxic_row, row_param

PAIRS = [c for c in TOXIC_CASES if c.reference is not None]


@pytest.fixture(scope="module")
def servers() -> Iterator[ToxicServers]:
    require_program(nginx_path(), "nginx")
    pytest.importorskip("aiohttp_retry")
    with toxic_servers() as running:
        yield running


@pytest.mark.parametrize("case", [row_param(c) for c in PAIRS])
def test_each_http_toxic_fails_as_nginx_does_and_its_breakage_does_not(
    case: ToxicCase, servers: ToxicServers
) -> None:
    check_toxic_row(case, servers)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_abort_row_tells_an_abort_that_closes_without_saying_so(
    client: str, servers: ToxicServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 33, 2: an abort that closed the connection without `Connection: close`.
    # A client may send its retry into the closed connection (fewer requests reach the
    # toxic, or requests raises ConnectionError) or see the FIN first and open another;
    # which of the two is a race (on a loaded machine the FIN wins, and the outcome and
    # requests match nginx's). Either way it opens a connection per request where nginx's
    # keep-alive 503 kept one (measured: 4 or 2 against 1, every run): one run tells.
    answer = http_session._answer

    def closes_unsaid(*args: Any) -> tuple[bytes, bool]:
        data, _ = answer(*args)
        return data, True

    monkeypatch.setattr(http_session, "_answer", closes_unsaid)
    case = next(c for c in PAIRS if c.toxic == "http_abort" and f", {client}:" in c.name)
    row = run_toxic(case, servers)
    assert not row.verdict.same, row.seen


def test_every_http_fault_a_server_makes_has_a_row_for_each_client() -> None:
    # http_delay and http_header have none: stock nginx cannot wait before answering,
    # and a header is bytes, held byte for byte by tests/faultnet/toxics/test_http.py.
    made = {"http_abort", "http_hold", "http_slow_body", "http_truncate", "http_reset"}
    for toxic in made:
        clients = sorted(c.name.split(", ")[-1].split(":")[0] for c in PAIRS if c.toxic == toxic)
        assert clients == sorted(CLIENTS), toxic
    for c in PAIRS:
        assert c.server == "nginx" and c.breakages, c.name


def _side(
    outcome: str, requests: int, seconds: float = 1.0, connections: int = 1
) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "requests": requests,
        "seconds": seconds,
        "connections": connections,
    }


@pytest.mark.parametrize(
    ("nginx", "toxic", "judge", "same"),
    [
        (_side("RetryError", 4), _side("RetryError", 4), same_outcome, True),
        # Same outcome, another number of retries: different.
        (_side("RetryError", 4), _side("RetryError", 3), same_outcome, False),
        (_side("answered 503", 4), _side("answered 500", 4), same_outcome, False),
        # The same, but a connection opened for each request where nginx kept one.
        (_side("answered 503", 4), _side("answered 503", 4, connections=4), same_outcome, False),
        # A side that counted nothing is no evidence (every client makes one request).
        (_side("answered 200", 0), _side("answered 200", 0), same_outcome, False),
        (_side("answered 200", 1, 1.0), _side("answered 200", 1, 0.95), same_pace, True),
        (_side("answered 200", 1, 1.0), _side("answered 200", 1, 0.5), same_pace, False),
        (_side("answered 200", 1, 1.0), _side("answered 200", 1, 2.0), same_pace, False),
        (_side("answered 200", 1, 1.0), _side("ReadTimeout", 1, 1.0), same_pace, False),
    ],
)
def test_a_pair_is_the_same_only_in_outcome_requests_connections_and_pace(
    nginx: dict[str, Any], toxic: dict[str, Any], judge: Any, same: bool
) -> None:
    assert (judge({"nginx": nginx, "toxic": toxic}, {}) is None) is same
