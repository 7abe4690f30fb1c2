"""report.html in a real browser (headless Chromium, Debian's package): it loads with
no console error, its timeline is there, and every link resolves. The check is shown to
go red on a page broken on purpose. Outside CI, without Chromium, it skips saying so;
`.ci/run` installs it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.report import build
from tests.conftest import require_program
from tests.harness.report.browser import check_page, find_chromium


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_program(find_chromium(), "chromium (Debian's package)")


def test_the_report_loads_with_no_console_error_and_every_link_resolves(
    chromium: str, pair_dir: Path, tmp_path: Path
) -> None:
    built = build(pair_dir)
    got = check_page(built.html, chromium, tmp_path / "profile")
    assert got.loaded and got.errors == [], got.errors
    assert got.svgs == 1
    hrefs = [href for href, _url, _ok in got.links]
    assert "timeline.png" in hrefs and "timeline.svg" in hrefs
    assert any(h.endswith("/proxy.jsonl") for h in hrefs) and len(hrefs) >= 10
    assert got.broken_links == [], got.broken_links


def test_the_browser_check_goes_red_on_a_broken_page(
    chromium: str, pair_dir: Path, tmp_path: Path
) -> None:
    page_dir = tmp_path / "page"
    shutil.copytree(pair_dir, page_dir)
    built = build(page_dir)
    html = built.html.read_text()
    # Breakage: one evidence file gone, an image that is not there, a malformed path.
    (page_dir / "fixed" / "observer.jsonl").unlink()
    html = html.replace(
        "</body>",
        '<img src="no-such.png" alt=""><svg><path d="M 0 0 L x"/></svg></body>',
    )
    built.html.write_text(html)
    got = check_page(built.html, chromium, tmp_path / "profile")
    assert got.loaded
    assert got.broken_links == ["fixed/observer.jsonl"], got.broken_links
    assert any("no-such.png" in e for e in got.errors), got.errors
    assert any("attribute d" in e for e in got.errors), got.errors
