"""The report drawn from a real run holds everything the run's evidence holds.

The evidence is read here independently of the report's loader (raw proxy log, raw
BOTEVENT lines, raw call records and observer transcript, the experiment's own post
table), and every fault interval, post outcome and detection in it must be in what the
timeline drew and on the page. Then the evidence is broken on purpose: a received post
must stop being a silent loss, an unreceived one must become one.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.report import build, load_report

#: The kinds of BOTEVENT a reader of the evidence calls a detection or a recovery.
DETECTIONS = {"pong_timeout": "pong_timeout", "reconnected": "reconnected"}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def botevents(path: Path) -> list[dict]:
    return [
        json.loads(line.removeprefix("BOTEVENT "))
        for line in path.read_text().splitlines()
        if line.startswith("BOTEVENT {")
    ]


def raw_posts(arm: Path) -> list[dict]:
    """Each send-channel call, scored by hand: claimed by its answer, received if the
    observer got its exact text."""
    got = [r["text"] for r in records(arm / "observer.jsonl") if r["event"] == "message"]
    out = []
    for f in (arm / "calls" / "worker").glob("*.jsonl"):
        for r in records(f):
            if r["event"] == "request" and r.get("tool") == "send-channel":
                text = json.loads(r["arguments"])["text"]
                answer = r["result_text"] or ""
                claimed = "Broadcast to" in answer and "UNCONFIRMED" not in answer
                out.append(
                    {
                        "text": text,
                        "mono": r["mono"] - r["seconds"],
                        "claimed": claimed,
                        "received": any(text in g for g in got),
                    }
                )
    return out


def origin(arm: Path) -> float:
    return min(r["mono"] for r in records(arm / "proxy.jsonl") if r["event"] == "fault_applied")


@pytest.fixture(scope="module")
def built(pair_dir: Path):
    return build(pair_dir)


@pytest.mark.parametrize("arm_index,arm_name", [(0, "no-confirm"), (1, "fixed")])
def test_every_fault_post_and_detection_in_the_evidence_is_drawn_and_on_the_page(
    built, pair_dir: Path, arm_index: int, arm_name: str
) -> None:
    arm = pair_dir / arm_name
    t0 = origin(arm)
    page = built.html.read_text()
    drawn = [d for d in built.drawn if d.run == arm_index]
    assert built.report.runs[arm_index].title == arm_name

    faults = [r for r in records(arm / "proxy.jsonl") if r["event"] == "fault_applied"]
    removed = [r for r in records(arm / "proxy.jsonl") if r["event"] == "fault_removed"]
    assert faults and removed
    for f in faults:
        bands = [d for d in drawn if d.kind == "fault" and abs(d.t - (f["mono"] - t0)) < 1e-6]
        # On the proxy's lane and on the worker's lane behind it.
        assert {d.lane for d in bands} == {"proxy:proxy", "bot:worker"}, bands
        assert {d.what for d in bands} == {f["mode"]}
        by_lane = {d.lane: d for d in bands}
        # On the proxy's lane it ends with the thaw ...
        assert abs(by_lane["proxy:proxy"].end - (removed[0]["mono"] - t0)) < 1e-6
        # ... on the worker's, where the worker dropped the connection it froze (its own
        # disconnected event): it reconnected round the freeze, on a new connection.
        left = min(
            e["mono"]
            for e in botevents(arm / "worker.stderr")
            if e["event"] == "disconnected" and e["mono"] > f["mono"]
        )
        assert left < removed[0]["mono"]
        assert abs(by_lane["bot:worker"].end - (left - t0)) < 1e-6
        assert f'id="{bands[0].gid}"' in page
        assert f"<td>{f['mode']}</td>" in page

    posts = raw_posts(arm)
    assert len(posts) >= 10
    drawn_posts = [d for d in drawn if d.kind == "post"]
    assert len(drawn_posts) == len(posts)
    for p in posts:
        (d,) = [d for d in drawn_posts if abs(d.t - (p["mono"] - t0)) < 1e-6]
        expected = {
            (True, True): "delivered",
            (True, False): "silent_loss",
            (False, False): "unconfirmed",
            (False, True): "unconfirmed_received",
        }[(p["claimed"], p["received"])]
        assert d.what == expected, (p, d)
        assert f'id="{d.gid}"' in page
        # The page's post table has the post, with its outcome on the same row.
        row = re.search(
            r"<tr[^>]*>(?:(?!</tr>).)*" + re.escape(html.escape(p["text"])) + r".*?</tr>", page
        )
        assert row is not None and f"<b>{expected}</b>" in row.group(0)

    events = botevents(arm / "worker.stderr")
    for ev in events:
        kind = DETECTIONS.get(ev["event"])
        if kind is None:
            continue
        marks = [
            d
            for d in drawn
            if d.kind == "marker" and d.what == kind and abs(d.t - (ev["mono"] - t0)) < 1e-6
        ]
        assert len(marks) == 1 and marks[0].lane == "bot:worker", (ev, marks)
        assert f'id="{marks[0].gid}"' in page
    assert any(e["event"] == "pong_timeout" for e in events)

    # The panel's verdict is the checks' verdict, and the page has every check's numbers.
    result = json.loads((arm / "result.json").read_text())
    for c in result["checks"]:
        assert html.escape(c["name"]) in page and html.escape(c["detail"]) in page


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_the_defect_arm_shows_silent_losses_inside_the_frozen_band_and_the_fixed_arm_none(
    built, pair_dir: Path
) -> None:
    a, b = built.report.runs
    # The experiment's own scoring and the drawing name the same posts as silent losses.
    for run, arm in ((a, "no-confirm"), (b, "fixed")):
        table = json.loads((pair_dir / arm / "result.json").read_text())["details"]["posts"]
        scored = {row["text"] for row in table if row["silent_loss"]}
        drawn = {p.text for p in run.posts if p.outcome == "silent_loss"}
        assert drawn == scored
    assert a.outcome_counts().get("silent_loss", 0) >= 1
    freeze = a.faults[0]
    assert all(freeze.covers(p.t) for p in a.posts if p.outcome == "silent_loss")
    assert b.outcome_counts().get("unconfirmed", 0) >= 1
    assert "silent_loss" not in b.outcome_counts()
    # One above the other, on one time axis, with the pair's verdict.
    assert built.report.kind == "pair" and built.report.passed
    assert "SILENT LOSS" in built.svg.read_text()
    assert built.png.stat().st_size > 10_000


def copy_arm(pair_dir: Path, tmp_path: Path, name: str = "no-confirm") -> Path:
    dst = tmp_path / name
    shutil.copytree(pair_dir / name, dst)
    for f in ("report.html", "report.json", "timeline.png", "timeline.svg", "command.txt"):
        (dst / f).unlink(missing_ok=True)
    return dst


def test_a_received_post_is_never_drawn_as_a_silent_loss(pair_dir: Path, tmp_path: Path) -> None:
    arm = copy_arm(pair_dir, tmp_path)
    before = load_report(arm).runs[0]
    lost = [p for p in before.posts if p.outcome == "silent_loss"]
    assert lost
    # Breakage: the observer did receive the first "lost" post, while the link was down.
    obs = records(arm / "observer.jsonl")
    rec = dict(obs[0], text=lost[0].text, time=obs[0]["time"])
    with (arm / "observer.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n")
    after = load_report(arm).runs[0]
    now = {p.text: p.outcome for p in after.posts}
    assert now[lost[0].text] != "silent_loss"
    assert sum(o == "silent_loss" for o in now.values()) == len(lost) - 1


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_claimed_post_the_observer_never_got_is_drawn_as_a_silent_loss(
    pair_dir: Path, tmp_path: Path
) -> None:
    arm = copy_arm(pair_dir, tmp_path, "fixed")
    before = load_report(arm).runs[0]
    assert "silent_loss" not in before.outcome_counts()
    delivered = [p for p in before.posts if p.outcome == "delivered"]
    # Breakage: the observer's transcript loses one delivered post.
    keep = [
        r for r in records(arm / "observer.jsonl") if delivered[-1].text not in r.get("text", "")
    ]
    (arm / "observer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
    built = build(arm)
    lost = [p for p in built.report.runs[0].posts if p.outcome == "silent_loss"]
    assert [p.text for p in lost] == [delivered[-1].text]
    assert [d for d in built.drawn if d.what == "silent_loss"]
    assert "1 SILENT LOSS" in built.svg.read_text()


def test_without_a_transcript_no_post_is_scored(pair_dir: Path, tmp_path: Path) -> None:
    arm = copy_arm(pair_dir, tmp_path)
    (arm / "observer.jsonl").unlink()
    run = load_report(arm).runs[0]
    assert set(run.outcome_counts()) == {"unknown"}
    assert any("observer.jsonl" in n for n in run.notes)


def test_a_killed_attempt_still_draws_what_it_recorded(pair_dir: Path, tmp_path: Path) -> None:
    arm = copy_arm(pair_dir, tmp_path)
    (arm / "result.json").unlink()
    with (arm / "proxy.jsonl").open("a") as f:
        f.write('{"wall": 1, "mono": 2, "event": "conn_op')  # the shape a kill -9 leaves
    built = build(arm)
    run = built.report.runs[0]
    assert not built.report.passed and run.error and "result.json" in run.error
    assert any("truncated" in n for n in run.notes)
    assert run.faults and run.posts and any(m.kind == "pong_timeout" for m in run.markers)
    assert "Did not complete: the run wrote no result.json" in built.html.read_text()
    # Rebuilt without a recorded command: from what the directory says.
    assert "--seed" in run.replay and not run.replay_recorded


def test_the_page_is_self_contained(built) -> None:
    page = built.html.read_text()
    assert "<svg" in page and "<script" not in page
    # No resource is fetched: the only links are relative ones to evidence and images.
    assert not re.search(r'(src|href)="(https?:)?//', page)
    for href in re.findall(r'href="([^"#][^"]*)"', page):  # "#id": inside the SVG
        assert (built.html.parent / html.unescape(href)).is_file(), href
    assert str(built.report.runs[0].seed) in page
    assert "faultnet" in built.report.replay or "harness.pair" in built.report.replay


def test_a_decision_log_is_drawn_on_its_targets_lane(pair_dir: Path, tmp_path: Path) -> None:
    """faultnet chaos's join log (and the fleet's faults.jsonl, in its shape): every
    decision is a marker on the lane of the proxy it names, skips told apart."""
    arm = copy_arm(pair_dir, tmp_path)
    t0 = origin(arm)
    lines = [
        {
            "mono": t0 + 0.5,
            "event": "fault",
            "action": "freeze",
            "target": "proxy",
            "outcome": "applied",
        },
        {"mono": t0 + 0.7, "event": "skip", "action": "sever", "target": "proxy", "reason": "rail"},
        {"mono": t0 + 0.9, "event": "undo_failed", "action": "thaw", "target": "other"},
    ]
    (arm / "chaos-log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    built = build(arm)
    got = [(d.lane, round(d.t, 6), d.what) for d in built.drawn if d.what.startswith("decision")]
    assert got == [
        ("proxy:proxy", 0.5, "decision"),
        ("proxy:proxy", 0.7, "decision_skipped"),
        ("proxy:other", 0.9, "decision_failed"),
    ]
    assert "skip sever: rail" in built.html.read_text()


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_verifiers_verdict_joins_the_runs_checks(pair_dir: Path, tmp_path: Path) -> None:
    """The fleet's verdict.json (a verifier run apart from the run): its checks are the
    run's too, and one failing fails the run that passed on its own."""
    arm = copy_arm(pair_dir, tmp_path, "fixed")
    assert load_report(arm).passed
    verdict = {
        "ok": False,
        "checks": [{"name": "no silent loss", "passed": False, "detail": "2 lost"}],
    }
    (arm / "verdict.json").write_text(json.dumps(verdict))
    built = build(arm)
    assert not built.report.passed
    assert built.report.runs[0].verdict() == "FAIL: verifier: no silent loss"
    assert "verifier: no silent loss" in built.html.read_text()
