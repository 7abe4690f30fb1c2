"""The planner and the catalogue: pure, so tested by tables, without I/O."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from faultnet.chaos import PlanError, catalogue, draw, load_config, make_plan
from faultnet.chaos._draws import Draws
from faultnet.modes import MODES
from faultnet.toxics import TOXICS


def _config(**kw):
    kw.setdefault("proxies", ["db@http://127.0.0.1:8474", "cache@http://127.0.0.1:8474"])
    kw.setdefault("processes", ["bot1", "bot2"])
    kw.setdefault("duration", 200.0)
    kw.setdefault("gap", (1.0, 4.0))
    return load_config(**kw)


def test_a_draw_is_sha256_of_seed_colon_counter() -> None:
    # Written out here, independently of the module: any tool can replay a plan.
    digest = hashlib.sha256(b"7:3").digest()
    assert draw(7, 3) == (int.from_bytes(digest[:8], "big") >> 11) / 2**53
    d = Draws(7)
    assert [d.random() for _ in range(4)] == [draw(7, i) for i in range(4)]
    assert d.counter == 4


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    a, b = make_plan(_config(), 7), make_plan(_config(), 7)
    assert a == b and len(a.slots) > 20
    assert make_plan(_config(), 8).slots != a.slots
    # Counters strictly increase: each slot names the first draw that made it.
    counters = [s.counter for s in a.slots]
    assert counters == sorted(set(counters))


def test_every_mode_in_the_table_is_in_the_catalogue() -> None:
    faults = catalogue()
    for name, row in MODES.items():
        if row.acts_on == "undo":
            undone = [f for f in faults.values() if f.undo == name]
            assert undone, f"undo mode {name} undoes no fault of the catalogue"
        else:
            assert name in faults and faults[name].undo == row.undone_by, name
            # An undoable mode is held for a while; an instant one is not.
            assert (faults[name].duration[1] > 0) == (row.undone_by is not None)


def test_every_toxic_of_the_registry_is_in_the_catalogue() -> None:
    faults = catalogue()
    for type_name, cls in TOXICS.items():
        fault = faults[f"toxic:{type_name}"]
        assert fault.undo == "remove_toxic"
        cls.check_attributes(dict(fault.attributes))  # the defaults are valid


def test_the_catalogue_check_goes_red_when_a_mode_is_missing(monkeypatch) -> None:
    import faultnet.chaos._catalogue as cat

    real = cat._builtin

    def without_refuse():
        faults = real()
        del faults["refuse"]
        return faults

    monkeypatch.setattr(cat, "_builtin", without_refuse)
    with pytest.raises(AssertionError, match="refuse"):
        test_every_mode_in_the_table_is_in_the_catalogue()


def test_no_two_faults_overlap_on_one_target() -> None:
    plan = make_plan(_config(gap=(0.5, 1.0)), 11)
    held: dict[str, float] = {}
    busy = 0
    for s in plan.slots:
        if s.skip == "busy":
            busy += 1
            continue
        assert held.get(s.target, 0.0) <= s.at, s
        held[s.target] = s.at + s.duration
    assert busy > 0  # short gaps against long faults: the table exercises the skip


def test_once_faults_stay_in_the_draw_so_the_runner_can_spend_them_on_firing() -> None:
    config = _config(proxies=[])
    faults = {n: replace(f, weight=0.0) for n, f in config.faults.items()}
    faults["process:kill"] = replace(faults["process:kill"], weight=1.0)
    plan = make_plan(replace(config, faults=faults), 3)
    kills = [s for s in plan.slots if s.fault == "process:kill" and not s.skip]
    assert len(kills) > 1 and all(s.detail["signal"] == "SIGKILL" for s in kills)


def test_a_fault_without_a_target_of_its_kind_is_never_drawn() -> None:
    plan = make_plan(_config(processes=[]), 5)
    assert plan.slots and not any(s.fault.startswith("process:") for s in plan.slots)
    assert make_plan(_config(processes=[], proxies=[]), 5).slots == ()


def test_streams_are_drawn_for_modes_that_take_one_and_for_toxics() -> None:
    plan = make_plan(_config(duration=2000.0), 2)
    seen = {(s.fault, s.detail.get("stream")) for s in plan.slots if not s.skip}
    assert {("freeze", "both"), ("freeze", "upstream"), ("freeze", "downstream")} <= seen
    assert all(st in ("upstream", "downstream") for f, st in seen if f.startswith("toxic:"))
    assert all(st is None for f, st in seen if f in ("sever", "reset", "drop_syn", "refuse"))


def test_plan_files_in_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "plan.toml"
    toml.write_text(
        """
duration = 30
gap = [1, 2]
[targets]
proxies = ["db@http://127.0.0.1:8474", "cache"]
processes = ["bot1"]
[faults.freeze]
weight = 5
duration = [1, 2]
[faults."toxic:latency"]
attributes = { latency = 50 }
[faults."process:kill"]
weight = 0
"""
    )
    c = load_config(toml, servers=["http://127.0.0.1:9000/"])
    assert c.proxies == ("db@http://127.0.0.1:8474", "cache@http://127.0.0.1:9000")
    assert c.servers == ("http://127.0.0.1:8474", "http://127.0.0.1:9000")
    assert c.faults["freeze"].weight == 5 and c.faults["freeze"].duration == (1.0, 2.0)
    assert dict(c.faults["toxic:latency"].attributes) == {"latency": 50, "jitter": 100}
    js = tmp_path / "plan.json"
    js.write_text(json.dumps({"targets": {"proxies": ["db"]}, "gap": [1, 2]}))
    assert load_config(js).proxies == ("db@local",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("duration = -1", "duration must be > 0"),
        ("gap = [0, 1]", "gap must be"),
        ("color = 1", "unknown key 'color'"),
        ("[faults.melt]\nweight = 1", "unknown fault 'melt'"),
        ("[faults.sever]\nduration = [1, 2]", "sever is instant"),
        ("[faults.freeze]\nweight = -2", "weight must be a number >= 0"),
        ('[faults."toxic:latency"]\nattributes = { latency = "slow" }', "must be an integer"),
        ("[faults.refuse]\ninclude_new = true", "include_new"),
        ("[targets]\nproxies = [1]", "targets.proxies must be a list of names"),
        ("duration = [", "plan file"),
    ],
)
def test_a_bad_plan_file_says_why(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "plan.toml"
    p.write_text(text)
    with pytest.raises(PlanError, match=message.replace("[", r"\[")):
        load_config(p)


def test_a_missing_plan_file_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read plan file"):
        load_config(tmp_path / "absent.toml")


def test_every_default_names_a_fault_of_the_catalogue() -> None:
    # A default left behind by a renamed mode or toxic would silently stop applying.
    from faultnet.chaos._catalogue import _DEFAULTS, _builtin

    assert set(_DEFAULTS) <= set(_builtin())


# -- episodes, storms, rests, the ensured slot, the list, the cap ---------------------------


def test_each_episode_is_a_holding_mode_ended_by_a_mode_on_connections() -> None:
    from faultnet.chaos._catalogue import EPISODES

    faults = catalogue()
    assert set(EPISODES) == {"episode:freeze-sever", "episode:blackhole-reset"}
    for name, (down, end) in EPISODES.items():
        assert MODES[down].undone_by and MODES[down].per_connection, down
        assert MODES[end].undone_by is None and MODES[end].per_connection, end
        f = faults[name]
        assert (f.kind, f.on, f.down, f.undo) == ("episode", "proxy", down, end)


def test_an_episode_slot_says_how_it_goes_down_and_ends() -> None:
    plan = make_plan(_config(processes=[]), 0)
    ep = next(s for s in plan.slots if s.fault == "episode:freeze-sever")
    assert ep.detail == {"down": "freeze", "end": "sever"} and ep.duration > 0


def test_only_is_the_list_and_a_faults_table_tunes(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text('only = ["sever"]\n[faults.freeze]\nweight = 5\n')
    config = _config(path=plan_file)
    assert {s.fault for s in make_plan(config, 1).slots if not s.skip} == {"sever"}
    # Without `only`, a table tunes its fault and every other fault is still drawn.
    plan_file.write_text("[faults.freeze]\nweight = 5\n")
    drawn = {s.fault for s in make_plan(_config(path=plan_file), 1).slots}
    assert "freeze" in drawn and len(drawn) > 5
    plan_file.write_text('only = ["melt"]\n')
    with pytest.raises(PlanError, match="only: unknown fault 'melt'"):
        _config(path=plan_file)


def test_rest_keeps_a_target_free_of_faults_after_one_ended(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text("rest = 7\n")
    plan = make_plan(_config(path=plan_file, processes=[]), 5)
    for key in plan.config.proxies:
        mine = [s for s in plan.slots if s.target == key]
        assert all(x.at + x.duration + 7 <= y.at for x, y in zip(mine, mine[1:], strict=False))


def test_a_storm_hits_every_target_at_once_in_each_wave(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text("waves = 3\n")
    plan = make_plan(_config(path=plan_file, processes=[], duration=90.0), 7)
    assert len(plan.slots) == 3 * 2
    by_at: dict[float, list[str]] = {}
    for s in plan.slots:
        by_at.setdefault(s.at, []).append(s.target)
        assert s.duration <= 0.8 * 30
    assert sorted(by_at) == [1.0, 31.0, 61.0]
    assert all(sorted(t) == sorted(plan.config.proxies) for t in by_at.values())


def test_ensure_forces_one_long_enough_slot_when_none_was_drawn(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        'only = ["sever"]\n[ensure]\nfaults = ["episode:freeze-sever"]\nduration = 30\n'
    )
    plan = make_plan(_config(path=plan_file, processes=[]), 2)
    forced = [s for s in plan.slots if "forced" in s.detail]
    assert len(forced) == 1 and forced[0] == next(s for s in plan.slots if not s.skip)
    assert forced[0].fault == "episode:freeze-sever" and forced[0].duration >= 30
    later = [s for s in plan.slots if s.target == forced[0].target and s.at > forced[0].at]
    assert all(s.at >= forced[0].at + forced[0].duration for s in later)
    # A plan that drew one is left as it is.
    plan_file.write_text('[ensure]\nfaults = ["freeze"]\nduration = 0\n')
    assert not any("forced" in s.detail for s in make_plan(_config(path=plan_file), 2).slots)


def test_a_plan_capped_at_its_slot_limit_says_so() -> None:
    plan = make_plan(_config(duration=1e9, gap=(1.0, 1.0)), 1)
    assert plan.capped and len(plan.slots) == 10_000
    assert not make_plan(_config(), 1).capped


def test_a_fixed_stream_replaces_the_draw(tmp_path: Path) -> None:
    data = {"only": ["freeze"], "faults": {"freeze": {"stream": "both"}}}
    plan = make_plan(_config(data=data, processes=[]), 1)
    assert {s.detail["stream"] for s in plan.slots if not s.skip} == {"both"}
    with pytest.raises(PlanError, match="stream is one of"):
        _config(data={"faults": {"sever": {"stream": "both"}}})
    with pytest.raises(PlanError, match="stream is one of"):
        _config(data={"faults": {"toxic:latency": {"stream": "both"}}})
    with pytest.raises(PlanError, match="a plan is a table of"):
        _config(data={"latenzy": 1})
