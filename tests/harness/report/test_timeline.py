"""The timeline says what the evidence says and nothing else (issue 24 item 18): a band
never holds a post made round the fault, each arm's answer is counted on the picture,
every legend entry is its own mark, and the caption lists only what was drawn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.report import DETECTIONS, OUTCOMES, FaultInterval, build
from harness.report._evidence import Call, score_call
from harness.report._faults import fault_intervals, mark_left, released_at
from harness.report._html import caption
from harness.report._timeline import Drawn, draw


@pytest.fixture(scope="module")
def built(pair_dir: Path):
    return build(pair_dir)


def test_no_delivered_post_sits_inside_a_fault_band_on_its_lane(built) -> None:
    bands = [d for d in built.drawn if d.kind == "fault"]
    posts = [d for d in built.drawn if d.kind == "post" and d.what == "delivered"]
    assert bands and posts
    for p in posts:
        inside = [
            b
            for b in bands
            if b.run == p.run and b.lane == p.lane and b.t <= p.t <= (b.end or float("inf"))
        ]
        assert not inside, (p, inside)
    # Yet the proxy's own band still spans them: it held the old connection until thawed.
    proxy_band = next(b for b in bands if b.lane.startswith("proxy:") and b.run == 0)
    assert any(proxy_band.t <= p.t <= proxy_band.end for p in posts if p.run == 0)


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_each_arm_counts_its_answer_beside_it(built) -> None:
    svg = built.svg.read_text()
    for ri, run in enumerate(built.report.runs):
        for name, n in run.outcome_counts().items():
            tally = OUTCOMES[name].tally
            if not tally[0]:
                continue
            group = re.search(rf'<g id="tally-{ri}-{name}">(.*?)</g>', svg, re.S)
            assert group is not None, (ri, name)
            assert f"{n} {tally[n > 1]}" in group.group(1)
    a, b = built.report.runs
    assert a.outcome_counts().get("silent_loss") and b.outcome_counts().get("unconfirmed")
    assert re.search(r"\d+ UNCONFIRMED", svg) and re.search(r"\d+ SILENT LOSS", svg)


def test_no_two_legend_entries_share_a_mark(built) -> None:
    marks = [(oc.color.lower(), oc.marker) for oc in OUTCOMES.values()]
    marks += [(col.lower(), mk) for _label, col, mk in DETECTIONS.values()]
    assert len(set(marks)) == len(marks), sorted(marks)
    fig, _drawn = draw(built.report)
    (legend,) = fig.legends
    # A band's entry is a patch, a call's a line with no marker, the rest marks.
    shown = [
        (
            type(h).__name__,
            str(h.get_facecolor() if hasattr(h, "get_facecolor") else h.get_color()),
            getattr(h, "get_marker", lambda: "")(),
        )
        for h in legend.legend_handles
    ]
    assert len(set(shown)) == len(shown) == len(legend.get_texts())


def test_the_caption_lists_what_was_drawn_and_nothing_else(built) -> None:
    page = built.html.read_text()
    (cap,) = re.findall(r'<p class="muted">The timeline as.*?</p>', page, re.S)
    drawn_kinds = {d.what for d in built.drawn if d.kind == "marker"}
    for kind, (label, _c, _m) in DETECTIONS.items():
        assert (label in cap) == (kind in drawn_kinds), (kind, label)
    drawn_outcomes = {d.what for d in built.drawn if d.kind == "post"}
    for name, oc in OUTCOMES.items():
        assert (oc.label in cap) == (name in drawn_outcomes), name
    assert "decision" not in cap  # no decision log in this run
    # A caption of nothing drawn names no marker at all.
    assert "Markers" not in caption([], "t.png", "t.svg")
    one = [Drawn("marker", 0, "bot:x", 0.0, "reconnected")]
    assert "Markers: reconnected." in caption(one, "t.png", "t.svg")


def rec(mono: float, event: str, **fields) -> dict:
    return {"mono": mono, "event": event, **fields}


def test_a_fault_on_open_connections_is_released_when_their_clients_leave() -> None:
    log = [
        rec(10, "fault_applied", mode="freeze", stream="both", connections=[1, 2]),
        rec(11, "held_fin", conn=1, stream="downstream"),  # the server's: not the client
        rec(12, "held_fin", conn=1, stream="upstream"),
        rec(13, "conn_close", conn=2, how="reset"),
        rec(14, "fault_removed", mode="thaw", stream="both", connections=[1, 2]),
        # include_new: new connections are caught too, so it never releases early.
        rec(20, "fault_applied", mode="freeze", include_new=True, connections=[3]),
        rec(21, "held_rst", conn=3, stream="upstream"),
        rec(22, "fault_removed", mode="thaw", connections=[3]),
        # One of its two connections kept: still holding a client.
        rec(30, "fault_applied", mode="blackhole", connections=[4, 5]),
        rec(31, "peer_reset", conn=4),
        rec(32, "fault_removed", mode="thaw", connections=[4, 5]),
        # A partition also drops new SYNs: not released by its clients leaving.
        rec(40, "fault_applied", mode="partition", connections=[6]),
        rec(41, "conn_close", conn=6),
        rec(42, "fault_removed", mode="thaw"),
        # Left only after the thaw: nothing changes.
        rec(50, "fault_applied", mode="loss", connections=[7]),
        rec(51, "fault_removed", mode="thaw", connections=[7]),
        rec(52, "conn_close", conn=7),
        # Never removed, but left: released.
        rec(60, "fault_applied", mode="freeze", connections=[8]),
        rec(61, "conn_close", conn=8),
    ]
    got = [(f.mode, f.start, f.end, f.released) for f in fault_intervals(log, "p", 10)]
    assert got == [
        ("freeze", 0, 4, 3),
        ("freeze", 10, 12, None),
        ("blackhole", 20, 22, None),
        ("partition", 30, 32, None),
        ("loss", 40, 41, None),
        ("freeze", 50, None, 51),
    ]
    iv = FaultInterval("p", "freeze", 5.0, 9.0, connections=[1])
    assert released_at(iv, {1: [4.0, 6.0]}) == 6.0  # a leave before it began is not it
    assert released_at(iv, {1: [9.5]}) is None


def test_a_bot_lane_band_ends_where_that_bot_dropped_the_held_connection() -> None:
    iv = FaultInterval("p", "freeze", 5.0, 9.0, connections=[1, 2], catches_new=False)
    mark_left(iv, "bot:a", [1.0, 6.5, 7.0])  # before the fault: not it
    mark_left(iv, "bot:b", [9.5])  # after the thaw: nothing changes
    assert iv.left == {"bot:a": 6.5}
    iv.released = 8.0
    assert [iv.end_on(ln) for ln in ("proxy:p", "bot:a", "bot:b")] == [9.0, 6.5, 8.0]
    assert iv.holds("bot:a", 6.0) and not iv.holds("bot:a", 7.0) and iv.holds("proxy:p", 7.0)
    # A fault that catches new connections holds a bot whatever it reconnects on.
    wide = FaultInterval("p", "freeze", 5.0, 9.0, connections=[1])
    mark_left(wide, "bot:a", [6.5])
    assert wide.left == {} and wide.end_on("bot:a") == 9.0


def test_a_post_made_after_its_bot_left_the_fault_is_not_in_it() -> None:
    """Scored by the fault that still held its bot: a post made on the new connection
    after the bot reconnected round a freeze, received after the thaw, is delivered (not
    late), while one made on the frozen connection and received after it is late."""
    freeze = FaultInterval("p", "freeze", 0.0, 4.0, connections=[1], catches_new=False)
    freeze.left["bot:w"] = 1.8
    rec = {"result_text": "Broadcast to #c", "outcome": "ok"}
    after = Call(rec, 2.0, 2.01, "after")
    before = Call(rec, 1.0, 1.01, "before")
    got = [(4.5, "w", "after"), (4.6, "w", "before")]
    assert score_call("bot:w", after, got, True, [freeze]).outcome == "delivered"
    assert score_call("bot:w", before, got, True, [freeze]).outcome == "late"
