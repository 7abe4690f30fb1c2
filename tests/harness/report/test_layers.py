"""Each layer of a timeline panel (``_timeline.PANEL_LAYERS``) and each part of a run's
section of the page (``_html.RUN_SECTIONS``), on a hand-built run: what each draws or
writes, from the model alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.report import FaultInterval, Lane, Marker, Post, Report, Run
from harness.report import _html as page
from harness.report import _timeline as tl


def hand_run(tmp_path: Path) -> Run:
    run = Run(path=tmp_path / "run", title="arm", experiment="silent_loss", seed=4)
    run.lanes = [
        Lane("proxy:p", "proxy :1", "proxy"),
        Lane("bot:w", "w (via proxy)", "bot", "p"),
        Lane("observer", "observer", "observer"),
    ]
    freeze = FaultInterval("p", "freeze", 0.0, 4.0, connections=[1], catches_new=False)
    freeze.left["bot:w"] = 2.0
    run.faults = [
        freeze,
        FaultInterval("p", "severed", 5.0, 5.0, connections=[2]),
        FaultInterval("p", "latency toxic", 6.0, None, stream="downstream"),
        FaultInterval("q", "refuse", 1.0, 2.0),  # no lane of proxy q: not drawn
    ]
    run.posts = [
        Post("bot:w", 0.5, 0.6, "a", "ok", True, None, "silent_loss"),
        Post("bot:w", 1.0, 1.0, "b", "ok", True, None, "silent_loss"),
        Post("bot:w", 3.0, 3.1, "c", "ok", True, 3.05, "delivered"),
        Post("bot:x", 3.0, 3.1, "d", "ok", True, 3.05, "delivered"),  # no such lane
    ]
    run.markers = [
        Marker("bot:w", 2.0, "pong_timeout", "PONG timeout"),
        Marker("bot:w", 2.05, "reconnected", "reconnected"),
        Marker("observer", 3.05, "received", "w: c"),
        Marker("proxy:p", 2.1, "brand_new_kind", "?"),
    ]
    run.end = 7.0
    run.result = {"passed": False, "checks": [{"name": "no loss", "passed": False}]}
    return run


def panel(run: Run) -> tl.Panel:
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    return tl.Panel(ax, 0, run, tl.lane_ys(run), 7.0, {}, [])


def layer(name: str):
    return dict((fn.__name__, fn) for _what, fn in tl.PANEL_LAYERS)[name]


def test_the_layers_in_order() -> None:
    assert [fn.__name__ for _w, fn in tl.PANEL_LAYERS] == [
        "_lanes", "_fault_bands", "_calls", "_posts", "_markers", "_undeclared_markers",
    ]  # fmt: skip


def test_lanes_layer(tmp_path: Path) -> None:
    pn = panel(hand_run(tmp_path))
    layer("_lanes")(pn)
    assert [t.get_text() for t in pn.ax.get_yticklabels()] == [
        "proxy :1",
        "w (via proxy)",
        "observer",
    ]
    assert pn.ax.get_title(loc="left").startswith("arm: FAIL, 0/1 checks passed\nFAILED: no loss")
    assert pn.drawn == []


def test_fault_bands_layer(tmp_path: Path) -> None:
    pn = panel(hand_run(tmp_path))
    layer("_fault_bands")(pn)
    got = [(d.lane, d.what, d.t, d.end) for d in pn.drawn]
    assert got == [
        ("proxy:p", "freeze", 0.0, 4.0),  # the proxy held it until the thaw
        ("bot:w", "freeze", 0.0, 2.0),  # the bot left it at its reconnect
        ("proxy:p", "severed", 5.0, 5.0),
        ("bot:w", "severed", 5.0, 5.0),
        ("proxy:p", "latency toxic", 6.0, None),
        ("bot:w", "latency toxic", 6.0, None),
    ]
    texts = [t.get_text() for t in pn.ax.texts]
    assert texts == [" freeze", " severed", " latency toxic (downstream) (never removed)"]
    gids = {a.get_gid() for a in pn.ax.collections}
    assert gids == {"fault-0-0-freeze", "fault-0-1-severed", "fault-0-2-latency_toxic"}
    # A band never removed runs to the axis' end; widths per lane.
    (freeze,) = [a for a in pn.ax.collections if a.get_gid() == "fault-0-0-freeze"]
    assert [round(p.get_extents().width, 6) for p in freeze.get_paths()] == [4.0, 2.0]
    (toxic,) = [a for a in pn.ax.collections if a.get_gid() == "fault-0-2-latency_toxic"]
    assert [round(p.get_extents().width, 6) for p in toxic.get_paths()] == [1.0, 1.0]


def test_calls_layer(tmp_path: Path) -> None:
    pn = panel(hand_run(tmp_path))
    layer("_calls")(pn)
    # One line per call that took time and is on a lane: a, c (b took none, d no lane).
    assert [tuple(ln.get_xdata()) for ln in pn.ax.lines] == [(0.5, 0.6), (3.0, 3.1)]


def test_posts_layer(tmp_path: Path) -> None:
    pn = panel(hand_run(tmp_path))
    layer("_posts")(pn)
    assert [(d.what, d.t) for d in pn.drawn] == [
        ("delivered", 3.0),
        ("silent_loss", 0.5),
        ("silent_loss", 1.0),
    ]
    assert [a.get_gid() for a in pn.ax.lines] == ["posts-0-delivered", "posts-0-silent_loss"]
    (tally,) = pn.ax.texts
    assert tally.get_text() == "2 SILENT LOSSES" and tally.get_gid() == "tally-0-silent_loss"
    assert list(pn.legend) == [
        "claimed and received",
        "SILENT LOSS: claimed, never received",
    ]


def test_markers_layers(tmp_path: Path) -> None:
    pn = panel(hand_run(tmp_path))
    layer("_markers")(pn)
    assert [(d.what, d.gid) for d in pn.drawn] == [
        ("pong_timeout", "markers-0-pong_timeout"),
        ("reconnected", "markers-0-reconnected"),
        ("received", "markers-0-received"),
    ]
    ys = {ln.get_gid(): ln.get_ydata()[0] for ln in pn.ax.lines}
    bot_y = pn.ys["bot:w"]
    assert ys["markers-0-pong_timeout"] > bot_y > ys["markers-0-reconnected"]
    layer("_undeclared_markers")(pn)
    assert pn.drawn[-1].what == "brand_new_kind" and pn.drawn[-1].gid == "markers-0-other"


def test_time_range_and_fault_label(tmp_path: Path) -> None:
    run = hand_run(tmp_path)
    assert tl.time_range([run]) == (0.0, 7.0)
    assert tl.time_range([]) == (0.0, 1.0)
    assert tl.fault_label(FaultInterval("p", "freeze", 0, 1, stream="upstream")) == (
        "freeze (upstream)"
    )


def test_draw_runs_every_layer_on_every_panel(tmp_path: Path) -> None:
    a, b = hand_run(tmp_path), hand_run(tmp_path)
    b.title = "other"
    fig, drawn = tl.draw(Report(tmp_path, "pair", "t", [a, b], True, "both fine"))
    assert {d.run for d in drawn} == {0, 1} and len(drawn) == 2 * 13
    assert fig._suptitle.get_text() == "t: the pair's verdict PASS\nboth fine"
    # 5 marks, the bands of the 3 modes drawn (freeze, severed, latency toxic), the calls.
    assert len(fig.legends[0].get_texts()) == 9


# --------------------------------------------------------------------------- the page


def section(tmp_path: Path, **kw) -> page.Section:
    run = hand_run(tmp_path)
    run.files = ["proxy.jsonl"]
    run.notes = ["observer.jsonl: absent"]
    run.skipped = ["x.jsonl: a symbolic link, not read"]
    run.replay, run.replay_recorded = "python -m harness.exp_silent_loss --seed 4", False
    return page.Section(run, kw.pop("page_dir", tmp_path), **kw)


@pytest.mark.parametrize(
    "part,expect",
    [
        ("_heading", []),
        ("_replay", ["<h3>Replay (rebuilt from result.json)</h3>"]),
        ("_error", []),
        ("_checks", ["<h3>Checks</h3>", '<span class="FAIL">FAIL</span>', "no loss"]),
        ("_numbers", []),
        ("_faults", ["<h3>Faults</h3>", "<td>freeze</td>", "w (via proxy) 2.000", "never removed"]),
        ("_detections", ["PONG timeout", "brand_new_kind"]),
        ("_posts", ["SILENT LOSS: claimed, never received: <b>2</b>", '<tr class="silent_loss">']),
        ("_notes", ["<li>observer.jsonl: absent</li>"]),
        ("_not_read", ["<li>x.jsonl: a symbolic link, not read</li>"]),
        ("_evidence", ['<a href="run/proxy.jsonl">run/proxy.jsonl</a>']),
    ],
)  # fmt: skip
def test_each_part_of_a_runs_section(tmp_path: Path, part: str, expect: list[str]) -> None:
    fn = dict((f.__name__, f) for _w, f in page.RUN_SECTIONS)[part]
    html = "\n".join(fn(section(tmp_path)))
    if not expect:
        assert html == ""
    for bit in expect:
        assert bit in html, (part, bit, html)


def test_parts_that_depend_on_the_page(tmp_path: Path) -> None:
    s = section(tmp_path, heading=True, page_replay="python -m harness.exp_silent_loss --seed 4")
    assert page._heading(s) == ['<h2>arm: <span class="FAIL">FAIL</span></h2>']
    assert page._replay(s) == []  # the page already shows it
    elsewhere = section(tmp_path, page_dir=tmp_path / "other")
    assert str(tmp_path / "run" / "proxy.jsonl") in "".join(page._evidence(elsewhere))
    s.run.result = None
    assert "Did not complete" in page._error(s)[0]
    s.run.result = {"headline": {"lost": 2}, "controls": [{"name": "c", "value": 1.0,
                    "unit": "s", "tolerance": 0.5}]}  # fmt: skip
    assert "internal control: c</td><td>1 s (tolerance 0.5)" in "".join(page._numbers(s))


def test_run_section_joins_every_part(tmp_path: Path) -> None:
    html = page.run_section(section(tmp_path))
    for h in ("Checks", "Faults", "Detections and reconnects", "Posts", "Notes", "Not read"):
        assert f"<h3>{h}</h3>" in html
