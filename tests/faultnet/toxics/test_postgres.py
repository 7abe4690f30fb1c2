"""The ``postgres`` toxic's rule (faultnet.toxics.postgres): its attributes refused when
they mean nothing, what ``at`` and ``query`` pick, the seeded draw by the request's
identity, ``count``, and the plans each ``fault`` makes."""

from __future__ import annotations

import pytest

from faultnet.protocols.postgres import PgRequest, parse_error_response
from faultnet.toxics import TOXICS, Postgres


def q(*texts: str, status: str = "T") -> PgRequest:
    return PgRequest("query", texts, status)


STARTUP = PgRequest("startup", params=(("user", "app"), ("database", "db")))


def test_it_is_registered_as_one_both_stream_type() -> None:
    assert TOXICS["postgres"] is Postgres and Postgres.both_streams


@pytest.mark.parametrize(
    "attributes, error",
    [
        ({"fault": "delay"}, "needs delay_ms"),
        ({"match": "regex", "query": "(unclosed"}, "not a regular expression"),
        ({"sqlstate": "4001"}, "five digits"),
        ({"sqlstate": "40p01"}, "five digits"),
        ({"fault": "explode"}, "must be 'error' or"),
        ({"severity": "WARNING"}, "must be 'auto' or"),
        ({"stauts": 1}, "unknown attribute 'stauts' of toxic postgres"),
    ],
)
def test_a_rule_that_means_nothing_is_refused(attributes: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Postgres(**attributes)
    with pytest.raises(ValueError, match=error):
        Postgres().check_update(attributes)


@pytest.mark.parametrize(
    "attributes, request_, picked",
    [
        ({}, q("SELECT 1"), "SELECT 1"),
        (
            {"query": "update accounts *"},
            q("UPDATE  accounts\n SET x = 1"),
            "UPDATE  accounts\n SET x = 1",
        ),
        ({"query": "update accounts *"}, q("UPDATE other SET x = 1"), None),
        ({"query": r"^SELECT \d$", "match": "regex"}, q("SELECT 7"), "SELECT 7"),
        ({"query": r"^select", "match": "regex"}, q("SELECT 7"), None),  # as written
        ({"query": "select 2"}, q("SELECT 1", "select 2"), "select 2"),  # a batch's second
        ({}, STARTUP, None),
        ({"at": "startup"}, STARTUP, ""),
        ({"at": "startup"}, q("SELECT 1"), None),
        ({"at": "commit"}, q("COMMIT"), "COMMIT"),
        ({"at": "commit"}, q("SELECT 1"), None),
    ],
)
def test_at_and_query_pick(
    attributes: dict[str, str], request_: PgRequest, picked: str | None
) -> None:
    assert Postgres(**attributes).picked(request_, {}) == picked


def test_at_commit_with_a_query_picks_the_commit_of_a_transaction_that_ran_it() -> None:
    toxic = Postgres(at="commit", query="update accounts*")
    conn: dict[str, object] = {}
    seen = [
        toxic.picked(q(text), conn)
        for text in ("BEGIN", "SELECT 1", "COMMIT", "BEGIN", "UPDATE accounts SET x = 1", "COMMIT")
    ]
    assert seen == [None, None, None, None, None, "COMMIT"]
    assert toxic.picked(q("COMMIT"), conn) is None  # the next transaction ran none


def test_count_faults_the_first_ones_and_percent_draws_by_identity() -> None:
    toxic = Postgres(count=2)
    plans = [toxic.decide(q("SELECT 1"), 7, i, {}) for i in range(4)]
    assert [p is not None for p in plans] == [True, True, False, False]
    assert (toxic.matched, toxic.faulted) == (4, 2)

    def fates(seed: int) -> list[bool]:
        t = Postgres(name="pg", percent=50)
        return [t.decide(q(f"SELECT {i % 5}"), seed, i, {}) is not None for i in range(200)]

    assert fates(7) == fates(7) and fates(7) != fates(8)
    assert 60 < sum(fates(7)) < 140
    # The identity is the text and its place on the connection, never the arrival order.
    t = Postgres(name="pg", percent=50)
    late = [t.decide(q(f"SELECT {i % 5}"), 7, i, {}) is not None for i in reversed(range(200))]
    assert late[::-1] == fates(7)


@pytest.mark.parametrize(
    "attributes, request_, action, fields",
    [
        ({}, q("x"), "error", {"S": "ERROR", "C": "40001"}),
        ({"sqlstate": "57P01"}, q("x"), "fatal", {"S": "FATAL", "C": "57P01"}),
        ({"sqlstate": "08006"}, q("x"), "fatal", {"S": "FATAL"}),
        ({"sqlstate": "40001", "severity": "FATAL"}, q("x"), "fatal", {"S": "FATAL"}),
        ({"sqlstate": "57P01", "severity": "ERROR"}, q("x"), "error", {"S": "ERROR"}),
        ({"at": "startup", "sqlstate": "28P01"}, STARTUP, "fatal",
         {"S": "FATAL", "M": 'password authentication failed for user "app"'}),
        ({"at": "startup", "sqlstate": "40001"}, STARTUP, "fatal", {"S": "FATAL"}),
        ({"message": "custom"}, q("x"), "error", {"M": "custom"}),
        ({"sqlstate": "XX001"}, q("x"), "error", {"M": "faultnet: an injected fault"}),
    ],
)  # fmt: skip
def test_error_plans_say_what_postgresql_would(
    attributes: dict[str, str], request_: PgRequest, action: str, fields: dict[str, str]
) -> None:
    toxic = Postgres(**attributes)
    conn: dict[str, object] = {}
    toxic.picked(STARTUP, conn)  # the connection's user
    plan = toxic.decide(request_, 1, 0, conn)
    assert plan is not None and plan.action == action
    got = parse_error_response(plan.error)
    assert {k: got[k] for k in fields} == fields
    assert plan.detail["sqlstate"] == got["C"] and plan.detail["severity"] == got["S"]


def test_the_other_faults_plan_with_their_figures() -> None:
    delay = Postgres(fault="delay", delay_ms=250).decide(q("x"), 1, 0, {})
    assert delay is not None and (delay.action, delay.delay) == ("delay", 0.25)
    close = Postgres(fault="close", rows=3).decide(q("x"), 1, 0, {})
    assert close is not None and (close.action, close.rows, close.detail["rows"]) == ("close", 3, 3)
    hold = Postgres(fault="hold").decide(q("x"), 1, 0, {})
    assert hold is not None and hold.action == "hold"
    commit = Postgres(at="commit").decide(q("COMMIT"), 1, 0, {})
    assert commit is not None and commit.substitute == "ROLLBACK"
