"""The README says what the tree does: the files it and the code cite exist, its figures
match its flags, its samples run as written."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines() if line]


def test_every_markdown_file_the_tree_cites_is_in_the_tree() -> None:
    # DESIGN.md was cited by pyproject.toml and harness/_contract.py, and is not here.
    cited: dict[str, list[str]] = {}
    for path in _tracked():
        if path.suffix not in (".py", ".toml", ".md", ".json", ".sh") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    missing = {n: where for n, where in cited.items() if not list(ROOT.rglob(n))}
    assert missing == {}, f"cited but not in the tree: {missing}"


def test_the_time_unit_example_names_the_fraction_it_runs_in() -> None:
    (unit, word) = re.findall(
        r"`--time-unit ([0-9.]+)` runs a plan[^.]*?\bin (halves|\w+ths)\b", README
    )[0]
    fractions = {"0.5": "halves", "0.1": "tenths", "0.02": "fiftieths", "0.01": "hundredths"}
    assert fractions[unit] == word


def test_the_chaos_toolkit_sample_is_preceded_by_making_the_proxy_it_acts_on() -> None:
    sample = ROOT / "faultnet/chaostoolkit/example-experiment.json"
    proxy = json.loads(sample.read_text())["configuration"]["proxy"]["default"]
    at = README.index("chaos run example-experiment.json")
    before = README[max(0, at - 600) : at]
    assert f"faultnet create {proxy} --upstream" in before
