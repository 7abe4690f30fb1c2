"""report.html for a reader who never ran faultnet (issue 35 item 12): the first line
says what the page is; a pair's PASS says whose verdict it is and that the defect arm's
FAIL below it is the point; the arms are named one way (no "arm a/b"); and every kind of
mark the timeline draws has its legend entry."""

from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path

import pytest

from harness.report import DETECTIONS, OUTCOMES, build
from harness.report._timeline import draw
from harness.report.cli import main as report_main


@pytest.fixture(scope="module")
def built(pair_dir: Path):
    return build(pair_dir)


def _text(html: str) -> list[str]:
    body = html.split("<body>", 1)[1]
    return [unescape(re.sub(r"<[^>]+>", "", p)).strip() for p in re.split(r"</p>|</h\d>", body)]


def test_the_first_line_says_what_the_page_is(built) -> None:
    first = _text(built.html.read_text())[0]
    assert first.startswith("faultnet run report: a matched pair, the silent_loss experiment")
    assert "no-confirm and fixed" in first and "the arm with the defect is there to fail" in first


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_pairs_pass_says_whose_and_why_the_defect_arm_fails(built) -> None:
    lines = _text(built.html.read_text())
    assert lines[2] == "The pair's verdict: PASS", lines[:5]
    assert any(
        ln.startswith("no-confirm: FAIL below is expected: that is the arm with the defect")
        for ln in lines
    ), lines[:6]
    assert any(
        ln.endswith("no-confirm: FAIL as the pair expects: the arm with the defect") for ln in lines
    )
    assert any(ln.endswith("fixed: PASS") for ln in lines)
    fig, _ = draw(built.report)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0].startswith("no-confirm: FAIL, as the pair expects (the arm with the defect)")
    assert titles[1].startswith("fixed: PASS")
    assert "the pair's verdict PASS" in fig._suptitle.get_text()


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_the_arms_have_one_name_each(built) -> None:
    page = unescape(re.sub(r"<[^>]+>", " ", built.html.read_text()))
    assert not re.search(r"\barms? [ab]\b", page), re.findall(r".{40}\barms? [ab]\b.{40}", page)
    assert "the no-confirm arm failed" in page and "the fixed arm passed every check" in page


def test_every_kind_of_mark_drawn_is_in_the_legend(built) -> None:
    fig, drawn = draw(built.report)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    want = {
        f"fault in force: {d.what} (a band on each lane it holds)"
        for d in drawn
        if d.kind == "fault"
    }
    want |= {OUTCOMES[d.what].label for d in drawn if d.kind == "post"}
    want |= {DETECTIONS[d.what][0] for d in drawn if d.kind == "marker" and d.what in DETECTIONS}
    want.add("a post's call, from made to answered")
    assert "fault in force: freeze (a band on each lane it holds)" in want
    assert want <= set(labels), want - set(labels)


@pytest.mark.usefixtures("pair_verdict")  # reads the pair's verdict
def test_a_control_runs_loss_failing_as_it_must_is_not_a_fail(
    pair_dir: Path, tmp_path: Path
) -> None:
    # The fleet's control run (verdict.json: mode control, ok: it lost posts, as it
    # must): the page said FAIL and `faultnet report` exited 1, which the fleet then
    # printed as "report: ... exited 1:".
    arm = tmp_path / "control"
    shutil.copytree(pair_dir / "fixed", arm)
    verdict = {
        "mode": "control",
        "ok": True,
        "message": "control lost 2 of 9 claimed posts, as it must",
        "checks": [{"name": "no silent loss", "passed": False, "detail": "2 lost"}],
    }
    (arm / "verdict.json").write_text(json.dumps(verdict))
    assert report_main([str(arm)]) == 0
    built = build(arm)
    assert built.report.passed and built.report.runs[0].verdict() == "PASS"
    page = built.html.read_text()
    assert "as a control run must" in page and "control lost 2 of 9 claimed posts" in page
    # A control that lost nothing fails the harness: still a FAIL.
    verdict["ok"] = False
    (arm / "verdict.json").write_text(json.dumps(verdict))
    assert report_main([str(arm)]) == 1
    assert build(arm).report.runs[0].verdict() == "FAIL: verifier: no silent loss"
