"""Each step of the run loader (``_evidence.LOAD_STEPS``) and each source of a post's
claim (``CLAIM_SOURCES``), on small hand-written evidence: what one step reads, it puts
in the run, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.report import _evidence as ev
from harness.report._evidence import Call, Loading, begin, choose_origin, read_claim
from harness.report._model import Lane

T0 = 100.0  # the monotonic instant of the hand-written run's freeze


def jsonl(path: Path, *records: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def botevent(**fields: Any) -> str:
    return "BOTEVENT " + json.dumps(fields)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """One small run: a proxy on port 4000 froze connection 1 of the bot "w" (which
    reconnected), an observer got one of its two posts."""
    d = tmp_path / "run"
    jsonl(
        d / "events.jsonl",
        {"mono": T0 - 2, "event": "attempt", "experiment": "silent_loss", "arm": "x", "seed": 3},
        {"mono": T0 - 1.5, "event": "bot_started", "label": "w", "nick": "wn",
         "via": ["127.0.0.1", 4000]},
        {"mono": T0 + 9, "event": "done"},
    )  # fmt: skip
    jsonl(
        d / "proxy.jsonl",
        {"mono": T0 - 3, "event": "listening", "proxy": "proxy", "listen": "127.0.0.1:4000"},
        {"mono": T0 - 1, "event": "conn_open", "proxy": "proxy", "conn": 1},
        {"mono": T0, "event": "fault_applied", "proxy": "proxy", "mode": "freeze",
         "include_new": False, "connections": [1]},
        {"mono": T0 + 2.1, "event": "held_fin", "proxy": "proxy", "conn": 1, "stream": "upstream"},
        {"mono": T0 + 4, "event": "fault_removed", "proxy": "proxy", "mode": "thaw",
         "connections": [1]},
    )  # fmt: skip
    (d / "w.stderr").write_text(
        "\n".join(
            [
                "noise",
                botevent(event="connected", mono=T0 - 1, session=1),
                botevent(event="pong_timeout", mono=T0 + 2, pong_timeout_s=0.6),
                botevent(event="disconnected", mono=T0 + 2, reason="pong_timeout"),
                botevent(event="connected", mono=T0 + 2.05, session=2),
                botevent(event="reconnected", mono=T0 + 2.05, down_ms=5),
            ]
        )
        + "\n"
    )
    call = {"event": "request", "method": "tools/call", "tool": "send-channel", "outcome": "ok"}
    jsonl(
        d / "calls" / "w" / "mcp-1.jsonl",
        {**call, "mono": T0 + 1.01, "seconds": 0.01, "arguments": '{"text": "one"}',
         "result_text": "Broadcast to #c"},
        {**call, "mono": T0 + 3.01, "seconds": 0.01, "arguments": '{"text": "two"}',
         "result_text": "Broadcast to #c"},
        {"event": "request", "method": "tools/list", "mono": T0},
    )  # fmt: skip
    # Received at wall 1003.02, recorded at (wall 1003.5, mono T0 + 3.5): T0 + 3.02.
    jsonl(
        d / "observer.jsonl",
        {"event": "message", "sender": "wn", "text": "two", "time": 1003.02, "wall": 1003.5,
         "mono": T0 + 3.5},
        {"event": "join", "mono": T0},
    )  # fmt: skip
    (d / "result.json").write_text(json.dumps({"experiment": "silent_loss", "seed": 3}))
    return d


def loaded(run_dir: Path, upto: str) -> Loading:
    """A Loading after every step before *upto* and *upto* itself."""
    ld = begin(run_dir)
    for _what, step in ev.LOAD_STEPS:
        step(ld)
        if step.__name__ == upto:
            return ld
    raise AssertionError(upto)


@pytest.mark.parametrize(
    "events,proxy,origin",
    [
        ([{"event": "attempt", "mono": 5}], [{"event": "fault_applied", "mono": 7}],
         (7, "the first fault applied")),
        ([{"event": "attempt", "mono": 5}], [{"event": "toxic_added", "mono": 6},
          {"event": "fault_applied", "mono": 7}], (6, "the first fault applied")),
        ([{"event": "attempt", "mono": 5}], [{"event": "conn_open", "mono": 4}],
         (5, "the run's start")),
        ([{"event": "x", "mono": 9}], [{"event": "conn_open", "mono": 4}],
         (4, "the first record")),
        ([], [], (0.0, "the first record")),
    ],
)  # fmt: skip
def test_choose_origin(events, proxy, origin) -> None:
    assert choose_origin(events, {"p": proxy}) == origin


def test_begin_reads_identity_and_axis(run_dir: Path) -> None:
    ld = begin(run_dir, "my title")
    run = ld.run
    assert (run.title, run.experiment, run.arm, run.seed) == ("my title", "silent_loss", "x", 3)
    assert (run.origin_mono, run.origin) == (T0, "the first fault applied")
    assert ld.rel(T0 + 1.5) == 1.5 and not run.lanes and not run.notes
    (run_dir / "result.json").unlink()
    assert any("result.json: absent" in n for n in begin(run_dir).run.notes)


def test_load_proxies(run_dir: Path) -> None:
    ld = loaded(run_dir, "load_proxies")
    assert [(ln.id, ln.title) for ln in ld.run.lanes] == [("proxy:proxy", "proxy 127.0.0.1:4000")]
    assert ld.port_to_proxy == {4000: "proxy"}
    assert [(f.mode, f.start, f.end, f.catches_new) for f in ld.run.faults] == [
        ("freeze", 0.0, 4.0, False)
    ]
    assert [(m.kind, m.label) for m in ld.run.markers] == [
        ("conn_open", "conn 1 open"),
        ("held_close", "conn 1 FIN held (upstream)"),
    ]


def test_an_http_fault_is_a_mark_on_the_proxy_lane(run_dir: Path) -> None:
    with (run_dir / "proxy.jsonl").open("a") as f:
        f.write(
            '{"mono": %r, "event": "http_fault", "proxy": "proxy", "conn": 1, '
            '"toxic": "t", "method": "GET", "path": "/api/x", "action": "abort"}\n' % (T0 + 1)
        )
    ld = loaded(run_dir, "load_proxies")
    assert ("http_fault", "conn 1 GET /api/x: abort") in [(m.kind, m.label) for m in ld.run.markers]


def test_find_bots_in_start_order_then_by_name(run_dir: Path) -> None:
    (run_dir / "a.stderr").write_text("")
    (run_dir / "calls" / "b").mkdir()
    ld = loaded(run_dir, "find_bots")
    assert ld.labels == ["w", "a", "b"]


def test_load_observer_maps_receive_times_onto_the_axis(run_dir: Path) -> None:
    ld = loaded(run_dir, "load_observer")
    assert ld.has_observer
    ((t, sender, text),) = ld.received
    assert (round(t, 6), sender, text) == (3.02, "wn", "two")
    (run_dir / "observer.jsonl").unlink()
    ld = loaded(run_dir, "load_observer")
    assert not ld.has_observer and any("observer.jsonl: absent" in n for n in ld.notes)


def test_load_bots(run_dir: Path) -> None:
    ld = loaded(run_dir, "load_bots")
    lane = ld.run.lane("bot:w")
    assert lane == Lane("bot:w", "w wn (via proxy)", "bot", "proxy")
    kinds = [(m.kind, round(m.t, 6)) for m in ld.run.markers if m.lane == "bot:w"]
    assert kinds == [("connected", -1.0), ("pong_timeout", 2.0), ("reconnected", 2.05)]
    assert ld.run.faults[0].left == {"bot:w": 2.0}  # it dropped the frozen connection
    posts = {p.text: (p.outcome, p.claim_source) for p in ld.run.posts}
    assert posts == {
        "one": ("silent_loss", "the call record's answer"),  # in the freeze, never got
        "two": ("delivered", "the call record's answer"),  # on the new connection
    }


def test_load_bots_without_stderr_says_so(run_dir: Path) -> None:
    (run_dir / "w.stderr").unlink()
    ld = loaded(run_dir, "load_bots")
    assert any("w.stderr: absent" in n for n in ld.notes)
    assert not [m for m in ld.run.markers if m.lane == "bot:w"]


@pytest.mark.parametrize(
    "record,marker",
    [
        ({"event": "fault", "action": "freeze", "mono": 1, "outcome": "applied"},
         ("decision", "fault freeze: applied")),
        ({"event": "plan", "action": "skip", "mono": 1, "reason": "rail"},
         ("decision_skipped", "plan skip: rail")),
        ({"event": "refuse", "action": "sever", "mono": 1, "rail": "allowlist"},
         ("decision_skipped", "refuse sever: allowlist")),
        ({"event": "error", "action": "x", "mono": 1, "reason": "a",
          "detail": {"reason": "b"}}, ("decision_failed", "error x: b")),
        ({"event": "undo", "action": "thaw", "mono": 1}, ("decision", "undo thaw")),
        ({"event": "fault", "action": "freeze"}, None),  # no time: not drawn
        ({"event": "plan", "action": "freeze", "mono": 1}, None),
    ],
)  # fmt: skip
def test_decision_marker(record, marker) -> None:
    assert ev._decision_marker(record) == marker


@pytest.mark.parametrize(
    "botevent,marker",
    [
        ({"event": "connected", "session": 1}, ("connected", "connected")),
        ({"event": "connected", "session": 2}, None),  # its reconnect says it
        ({"event": "disconnected", "reason": "eof"}, ("connection_lost", "connection lost (eof)")),
        ({"event": "disconnected", "reason": "pong_timeout"}, None),
        ({"event": "pong_timeout", "pong_timeout_s": 0.6},
         ("pong_timeout", "PONG timeout after 0.6 s")),
        ({"event": "reconnected", "down_ms": 5}, ("reconnected", "reconnected (down 5 ms)")),
        ({"event": "connect_failed"}, ("connect_failed", "connect_failed")),
        ({"event": "post_confirm"}, None),
    ],
)  # fmt: skip
def test_bot_marker(botevent, marker) -> None:
    assert ev._bot_marker(botevent) == marker


def test_load_decisions_adds_a_lane_for_an_unknown_target(run_dir: Path) -> None:
    jsonl(
        run_dir / "faults.jsonl",
        {"mono": T0 + 1, "event": "fault", "action": "freeze", "target": "proxy"},
        {"mono": T0 + 2, "event": "fault", "action": "sever", "target": "db"},
    )
    ld = loaded(run_dir, "load_decisions")
    assert ld.run.lanes[0].id == "proxy:db"
    assert [(m.lane, m.kind) for m in ld.run.markers if m.kind == "decision"] == [
        ("proxy:proxy", "decision"),
        ("proxy:db", "decision"),
    ]


def test_add_observer_lane(run_dir: Path) -> None:
    ld = loaded(run_dir, "add_observer_lane")
    assert ld.run.lanes[-1].id == "observer"
    assert [m.label for m in ld.run.markers if m.lane == "observer"] == ["wn: two"]


def test_order_lanes_puts_each_proxy_above_its_bots_and_the_observer_last(
    run_dir: Path,
) -> None:
    ld = begin(run_dir)
    ld.run.lanes = [
        Lane("observer", "o", "observer"),
        Lane("bot:a", "a", "bot", "p2"),
        Lane("proxy:p1", "p1", "proxy"),
        Lane("bot:b", "b", "bot", "p1"),
        Lane("bot:c", "c", "bot"),
        Lane("proxy:p2", "p2", "proxy"),
    ]
    ev.order_lanes(ld)
    assert [ln.id for ln in ld.run.lanes] == [
        "proxy:p1", "bot:b", "proxy:p2", "bot:a", "bot:c", "observer",
    ]  # fmt: skip


def test_set_span_sorts_and_ends_at_the_last_record(run_dir: Path) -> None:
    ld = loaded(run_dir, "set_span")
    assert [p.t for p in ld.run.posts] == sorted(p.t for p in ld.run.posts)
    assert [m.t for m in ld.run.markers] == sorted(m.t for m in ld.run.markers)
    assert ld.run.end == 9.0  # events.jsonl's "done"


def test_set_replay_recorded_or_rebuilt(run_dir: Path) -> None:
    ld = loaded(run_dir, "set_replay")
    assert not ld.run.replay_recorded and "--seed 3" in ld.run.replay
    (run_dir / "command.txt").write_text("python -m harness.pair x --seed 3\n")
    ld = loaded(run_dir, "set_replay")
    assert (ld.run.replay, ld.run.replay_recorded) == ("python -m harness.pair x --seed 3", True)
    (run_dir / "command.txt").write_text("  \n")  # empty here: the pair's above it
    (run_dir.parent / "command.txt").write_text("python -m harness.pair y\n")
    assert loaded(run_dir, "set_replay").run.replay == "python -m harness.pair y"


def test_list_files_leaves_out_outputs_and_secrets(run_dir: Path) -> None:
    (run_dir / "report.html").write_text("")
    (run_dir / "env").mkdir()
    (run_dir / "env" / "state.env").write_text("TOKEN=x")
    (run_dir / "env" / "port").write_text("1")
    ld = loaded(run_dir, "list_files")
    assert ld.run.files == [
        "calls/w/mcp-1.jsonl", "env/port", "events.jsonl", "observer.jsonl", "proxy.jsonl",
        "result.json", "w.stderr",
    ]  # fmt: skip
    assert ld.run.skipped == []


# --------------------------------------------------------------------------- claims


def call(rec: dict[str, Any], **kw: Any) -> Call:
    return Call({"outcome": "ok", **rec}, 1.0, 1.5, "hello", **kw)


@pytest.mark.parametrize(
    "c,claim",
    [
        (call({"result_text": "Broadcast to #c"}),
         ("Broadcast to #c", True, "the call record's answer")),
        (call({"result_text": "UNCONFIRMED: Broadcast to #c"}),
         ("UNCONFIRMED: Broadcast to #c", False, "the call record's answer")),
        (call({"result_text": None, "outcome": "timeout"}),
         ("<timeout>", False, "the call record's answer")),
        (call({}, post_table={"hello": {"result": "r", "claimed": 1}}),
         ("r", True, "the experiment's post table")),
        (call({}, post_table={"hello": {"result": "r"}}), (None, None, "")),
        (call({}, confirms=[(0.5, {"result": "confirmed"}), (1.2, {"result": "unconfirmed"})]),
         ("post_confirm unconfirmed", False, "the bot's post_confirm event")),
        (call({}, confirms=[(1.2, {"result": "skipped"})]),
         ("post_confirm skipped", True, "the bot's post_confirm event")),
        (call({"outcome": "transport_error"}), ("<transport_error>", False, "the call record")),
        (call({"outcome": "is_error"}), (None, None, "")),
    ],
)  # fmt: skip
def test_read_claim_takes_the_first_source_that_knows(c: Call, claim) -> None:
    assert read_claim(c) == claim
