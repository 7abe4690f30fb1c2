"""An experiment's result: checks, headline numbers, the internal control, and how to print them.

A :class:`Result` is what one experiment run against one arm produced. It is plain data
(``to_json`` / ``from_json`` round-trip) so the pair runner, the demo and the tests read
the same thing the ``--out`` file holds.

Every check has a *role*:

* ``"target"``: the question the experiment asks (the check the defect arm must fail);
* ``"control"``: a check that must pass in BOTH arms, or the run measured nothing (a broken
  observer, a fault that was not in force, a detector that always says yes);
* ``"check"``: anything else worth a PASS/FAIL line.

The *internal control* is a number that must NOT move between arms (the silent worker's
detection time, the fd baseline, ...). Each :class:`ControlValue` carries its own
tolerance; :func:`control_drift` scores two arms against it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "Check",
    "ControlValue",
    "Drift",
    "Result",
    "control_drift",
    "render_result",
    "render_side_by_side",
]

Role = Literal["target", "control", "check"]

#: Exit codes shared by every experiment command.
EXIT_OK, EXIT_FAILED, EXIT_ENV = 0, 1, 2


@dataclass
class Check:
    """One PASS/FAIL line: a name, whether it passed, and the evidence in *detail*."""

    name: str
    passed: bool
    detail: str = ""
    role: Role = "check"

    def line(self) -> str:
        tag = "PASS" if self.passed else "FAIL"
        kind = {"target": "", "control": "CONTROL: ", "check": ""}[self.role]
        return f"[{tag}] {kind}{self.name}" + (f" -- {self.detail}" if self.detail else "")


@dataclass
class ControlValue:
    """A number that must not move between arms; *tolerance* is the largest allowed
    absolute difference. ``value=None`` means it was not measured (never steady)."""

    name: str
    value: float | None
    unit: str = ""
    tolerance: float = 0.0


@dataclass
class Drift:
    name: str
    a: float | None
    b: float | None
    unit: str
    tolerance: float
    #: |b - a|, or None if either arm did not measure it.
    drift: float | None
    steady: bool


@dataclass
class Result:
    """Everything one experiment run against one arm produced."""

    experiment: str
    arm: str = ""
    bot_argv: list[str] = field(default_factory=list)
    seed: int | None = None
    time_scale: float = 1.0
    checks: list[Check] = field(default_factory=list)
    #: Headline numbers, in the order they should print: name -> value (number or text).
    headline: dict[str, Any] = field(default_factory=dict)
    controls: list[ControlValue] = field(default_factory=list)
    #: Set when the run could not measure at all (environment, bot never connected...).
    #: Such a result has failed whatever its checks say.
    error: str | None = None
    #: "environment" for a failure of the machinery (exit 2), "run" for one in the bot.
    error_kind: str | None = None
    run_dir: str | None = None
    duration_s: float | None = None
    #: Free-form extra evidence (tables of posts, event times) for the JSON file.
    details: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, passed: bool, detail: str = "", role: Role = "check") -> bool:
        """Record a check; returns *passed* so callers can chain."""
        self.checks.append(Check(name, bool(passed), detail, role))
        return bool(passed)

    def control(
        self, name: str, value: float | None, unit: str = "", tolerance: float = 0.0
    ) -> None:
        """Record an internal control: a number that must not move between arms."""
        self.controls.append(ControlValue(name, value, unit, tolerance))

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def find(self, name_part: str) -> Check | None:
        """The first check whose name contains *name_part* (for tests and summaries)."""
        for c in self.checks:
            if name_part in c.name:
                return c
        return None

    def by_role(self, role: Role) -> list[Check]:
        return [c for c in self.checks if c.role == role]

    @property
    def exit_code(self) -> int:
        if self.error is not None and self.error_kind == "environment":
            return EXIT_ENV
        return EXIT_OK if self.passed else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["exit_code"] = self.exit_code
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Result:
        d = dict(d)
        d.pop("passed", None)
        d.pop("exit_code", None)
        d["checks"] = [Check(**c) for c in d.get("checks", [])]
        d["controls"] = [ControlValue(**c) for c in d.get("controls", [])]
        return cls(**d)


def clip(text: str, width: int) -> str:
    """*text* on one line in at most *width* characters: cut at a word boundary and
    marked with "..." when it is longer (never in the middle of a word)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    head = text[: width - 3]
    if " " in head and text[width - 3] != " ":
        head = head.rsplit(" ", 1)[0]
    return head.rstrip() + "..."


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return out


def render_result(result: Result) -> str:
    """The table of headline numbers and controls, then one PASS/FAIL line per check."""
    lines = [f"== {result.experiment}" + (f" [{result.arm}]" if result.arm else "") + " =="]
    rows = [[k, _fmt(v)] for k, v in result.headline.items()]
    rows += [
        [f"internal control: {c.name}", _fmt(c.value) + (f" {c.unit}" if c.unit else "")]
        for c in result.controls
    ]
    if rows:
        lines += _table(rows, ["measure", "value"])
    lines.append("")
    lines += [c.line() for c in result.checks]
    if result.error:
        lines.append(f"[FAIL] run did not complete -- {result.error}")
    verdict = "PASS" if result.passed else "FAIL"
    failed = ", ".join(c.name for c in result.failed_checks())
    lines.append(
        f"{verdict}: {result.experiment}"
        + (f" [{result.arm}]" if result.arm else "")
        + (f" (failed: {failed})" if failed else "")
    )
    return "\n".join(lines)


def control_drift(a: Result, b: Result) -> list[Drift]:
    """Score each internal control of *a* against the same-named one in *b*.

    A control measured in only one arm, or not measured, is not steady: an unmeasured
    control cannot vouch for the comparison.
    """
    out: list[Drift] = []
    b_by_name = {c.name: c for c in b.controls}
    for ca in a.controls:
        cb = b_by_name.get(ca.name)
        vb = cb.value if cb else None
        tol = max(ca.tolerance, cb.tolerance if cb else 0.0)
        if ca.value is None or vb is None:
            out.append(Drift(ca.name, ca.value, vb, ca.unit, tol, None, False))
            continue
        d = abs(vb - ca.value)
        out.append(Drift(ca.name, ca.value, vb, ca.unit, tol, d, d <= tol + 1e-9))
    for cb in b.controls:
        if cb.name not in {c.name for c in a.controls}:
            out.append(Drift(cb.name, None, cb.value, cb.unit, cb.tolerance, None, False))
    return out


def render_side_by_side(a: Result, b: Result, drifts: list[Drift]) -> str:
    """Both arms in columns: every headline number, every check, every internal control."""
    na, nb = a.arm or "a", b.arm or "b"
    lines = [f"== {a.experiment}: {na} vs {nb} =="]
    keys = list(dict.fromkeys([*a.headline, *b.headline]))
    rows = [[k, _fmt(a.headline.get(k)), _fmt(b.headline.get(k))] for k in keys]
    if rows:
        lines += _table(rows, ["measure", na, nb])
        lines.append("")
    names = list(dict.fromkeys([c.name for c in a.checks] + [c.name for c in b.checks]))
    role = {c.name: c.role for c in [*b.checks, *a.checks]}

    def status(r: Result, name: str) -> str:
        c = next((c for c in r.checks if c.name == name), None)
        return "-" if c is None else ("PASS" if c.passed else "FAIL")

    crow = [
        [("CONTROL: " if role[n] == "control" else "") + n, status(a, n), status(b, n)]
        for n in names
    ]
    for r, n in ((a, na), (b, nb)):
        if r.error:
            crow.append(
                [f"run completed ({n})", "FAIL" if r is a else "-", "FAIL" if r is b else "-"]
            )
    if crow:
        lines += _table(crow, ["check", na, nb])
        lines.append("")
    if drifts:
        drow = [
            [
                d.name,
                _fmt(d.a),
                _fmt(d.b),
                (_fmt(d.drift) if d.drift is not None else "-") + (f" {d.unit}" if d.unit else ""),
                f"<= {_fmt(d.tolerance)}",
                "steady" if d.steady else "MOVED",
            ]
            for d in drifts
        ]
        lines += _table(drow, ["internal control", na, nb, "drift", "tolerance", "verdict"])
    return "\n".join(lines)
