"""Each of the verifier's named checks on small hand-made facts: one that passes and
the breakage that makes it fail (the whole runs' tests are tests/harness/test_fleet.py)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.fleet._checks import (
    CHECKS,
    calls_recorded,
    descriptors_flat,
    faults_joined,
    joins,
    liveness,
    no_silent_loss,
    outage_posts_unconfirmed,
)
from harness.fleet._records import Bot, Episode, Facts, outage_window

CLAIMED = "Broadcast to #enclave (1 line)"
UNCONFIRMED = "UNCONFIRMED: sent, no echo within the confirmation budget"
TIMING = {"liveness_bound_s": 10.0, "detection_window_s": 2.0, "fd_tolerance": 1}


def _post(i: int, sent: float, reply: str = CLAIMED, kind: str = "post") -> dict[str, Any]:
    return {
        "i": i,
        "kind": kind,
        "text": f"w01 {i}",
        "sent": sent,
        "done": sent + 0.1,
        "reply": reply,
    }


def _bot(posts: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> Bot:
    fds = [{"stage": "baseline", "fds": 9}, {"stage": "final", "fds": 9}]
    return Bot("w01", posts, fds, [dict(e) for e in events or []], {p["text"] for p in posts})


def _freeze(began: float = 10.0, ended: float | None = 14.0, conns: list[int] | None = None):
    recs = [{"action": "freeze", "mono": began + 0.01, "began": began}]
    if ended is not None:
        recs.append({"action": "thaw", "mono": ended + 0.01, "began": ended})
    conns = [1] if conns is None else conns
    return Episode(3, "w01", "freeze", began, began + 0.01, ended, conns, recs)


def _facts(bot: Bot, eps: list[Episode], observed: list[str] | None = None) -> Facts:
    seen = observed if observed is not None else [p["text"] for p in bot.posts]
    f = Facts("main", {"w01": bot}, eps, "\n".join(seen), TIMING)
    for i, ep in enumerate(eps):
        f.windows[i] = outage_window(ep, bot)
    return f


#: A run that passes every check: a freeze of 4 s with one post in it (unconfirmed), a
#: reconnect, a confirmed roll call.
EVENTS = [
    {"event": "connected", "mono": 1.0},
    {"event": "pong_timeout", "mono": 12.5},
    {"event": "disconnected", "mono": 12.6, "reason": "ping timeout"},
    {"event": "connected", "mono": 15.0},
]


def _good() -> Facts:
    posts = [
        _post(1, 5.0),
        _post(2, 11.0, UNCONFIRMED),
        _post(3, 16.0, kind="roll_call"),
    ]
    f = _facts(_bot(posts, EVENTS), [_freeze()])
    f.observed = "\n".join(p["text"] for p in posts if p["reply"] == CLAIMED)
    return f


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_check_passes_a_good_run(check) -> None:
    finding = check(_good())
    assert finding.passed, finding


def test_a_claimed_post_never_observed_is_a_silent_loss() -> None:
    f = _good()
    f.observed = ""
    finding = no_silent_loss(f)
    assert not finding.passed and finding.counts == {"claimed": 2, "lost": 2}


def test_a_post_in_an_outage_that_claims_delivery_fails() -> None:
    f = _good()
    f.bots["w01"].posts[1]["reply"] = CLAIMED
    finding = outage_posts_unconfirmed(f)
    assert not finding.passed and [w["i"] for w in finding.evidence] == [2]


def test_no_post_in_any_outage_proves_nothing() -> None:
    f = _good()
    f.bots["w01"].posts.pop(1)
    finding = outage_posts_unconfirmed(f)
    assert not finding.passed and "proves nothing" in finding.detail


def test_a_bot_without_a_confirmed_roll_call_fails_liveness() -> None:
    f = _good()
    f.bots["w01"].posts.pop()  # the roll call
    finding = liveness(f)
    assert not finding.passed and list(finding.evidence) == ["w01"]
    assert not liveness(_facts(_bot([]), [])).passed  # no fault at all


def test_descriptors_that_grew_fail_flatness() -> None:
    f = _good()
    f.bots["w01"].fds[-1]["fds"] = 11
    finding = descriptors_flat(f)
    assert not finding.passed and finding.evidence == {"w01": {"baseline": 9, "final": 11}}


def test_a_post_without_a_call_record_fails() -> None:
    f = _good()
    f.bots["w01"].call_texts.clear()
    assert not calls_recorded(f).passed


def test_a_fault_that_took_a_connection_and_had_no_effect_is_unexplained() -> None:
    f = _good()
    bot = f.bots["w01"]
    bot.events[:] = bot.events[:1]  # no reconnect: the outage lasts its 20 s
    bot.posts[:] = bot.posts[:1]  # and no post in it
    f.eps = [_freeze(ended=30.0)]
    f.windows = {0: outage_window(f.eps[0], bot)}
    finding = faults_joined(f)
    assert not finding.passed and [j["counter"] for j in finding.evidence] == [3]


@pytest.mark.parametrize(
    ("episode", "words"),
    [
        (_freeze(conns=[]), "no live connection"),
        (_freeze(ended=11.0), "within the detection window"),
        (
            Episode(4, "w01", "toxic:latency", 10.0, 10.1, None, [], [{"action": "toxic:latency"}]),
            "does not act on a live link",
        ),
    ],
)
def test_a_fault_without_effect_has_its_reason(episode: Episode, words: str) -> None:
    f = _facts(_bot([], [{"event": "connected", "mono": 1.0}]), [episode])
    (join,) = joins(f)
    assert join["effects"] == [] and words in join["non_effect_reason"]
    assert faults_joined(f).passed


def test_a_join_lists_the_effects_in_order_with_their_times() -> None:
    (join,) = joins(_good())
    assert [(e["effect"], e["after_s"]) for e in join["effects"]] == [
        ("pong_timeout", 2.5),
        ("disconnected", 2.6),
        ("unconfirmed_post", 1.1),
    ]
    assert join["detected_by_own_keepalive"] and join["actions"] == ["freeze", "thaw"]
