"""faultnet.proxy._faultstate, the pure core: transitions and what a state wants, by
tables (no sockets)."""

from __future__ import annotations

import itertools

import pytest

from faultnet import bpf
from faultnet.modes import MODES
from faultnet.proxy._faultstate import (
    ALL,
    LABELS,
    TRANSITIONS,
    Condition,
    FaultState,
    ListenerFaults,
    NewConnectionFaults,
)

BOTH = ("upstream", "downstream")
UP, DOWN = ("upstream",), ("downstream",)

#: (steps, the label, the closed streams, the client socket's filter, the server's).
SEQUENCES = [
    ([], "open", set(), None, None),
    ([("freeze", BOTH)], "frozen", set(BOTH), None, None),
    ([("freeze", UP)], "frozen-upstream", set(UP), None, None),
    ([("freeze", DOWN)], "frozen-downstream", set(DOWN), None, None),
    ([("blackhole", BOTH)], "blackholed", set(BOTH), "every segment", None),
    (
        [("blackhole", BOTH), ("thaw", UP)],
        "blackholed-downstream",
        set(DOWN),
        "every segment",
        None,
    ),
    ([("blackhole", BOTH), ("thaw", UP), ("thaw", DOWN)], "open", set(), None, None),
    ([("blackhole", BOTH), ("thaw", DOWN), ("thaw", UP)], "open", set(), None, None),
    ([("partition", BOTH), ("thaw", DOWN)], "blackholed-upstream", set(UP), "every segment", None),
    ([("blackhole", BOTH), ("freeze", BOTH)], "blackholed", set(BOTH), "every segment", None),
    ([("freeze", BOTH), ("blackhole", BOTH), ("thaw", BOTH)], "open", set(), None, None),
    (
        [("blackhole", BOTH), ("thaw", UP), ("freeze", UP)],
        "blackholed",
        set(BOTH),
        "every segment",
        None,
    ),
    ([("loss", UP)], "open", set(), "5 % of segments", None),
    ([("loss", DOWN)], "open", set(), None, "5 % of segments"),
    (
        [("loss", BOTH), ("blackhole", BOTH)],
        "blackholed",
        set(BOTH),
        "every segment",
        "5 % of segments",
    ),
    ([("loss", BOTH), ("thaw", UP)], "open", set(), None, "5 % of segments"),
]


@pytest.mark.parametrize(("steps", "label", "closed", "client", "server"), SEQUENCES)
def test_a_sequence_of_transitions_ends_in_the_state_the_table_says(
    steps: list[tuple[str, tuple[str, ...]]],
    label: str,
    closed: set[str],
    client: str | None,
    server: str | None,
) -> None:
    state = FaultState()
    for mode, streams in steps:
        state = state.apply(mode, streams, 0.05)
    assert state.label == label
    assert state.closed() == closed
    filters = state.filters()
    assert (filters["client"] and filters["client"].what) == client
    assert (filters["server"] and filters["server"].what) == server


def test_two_way_loss_loses_the_client_s_bare_segments_as_round_trips_on_its_leg() -> None:
    state = FaultState().apply("loss", BOTH, 0.2, both_ways=True)
    filters = state.filters()
    assert filters["hop"] is not None and filters["hop"].what == "20 % of segments"
    # Between a probe's round trip on a route losing 20 % each way (1 - 0.8 ** 2, 36 %)
    # and an ACK's one way (20 %, the hop's already): the client's ACKs lost at the
    # round trip's share backed off 5.7 points more downloads than the kernel's route.
    assert filters["client"] is not None and filters["client"].what == "28 % of bare segments"
    assert filters["server"] is None
    assert state.apply("blackhole", UP).filters()["client"] == bpf.drop_all()
    # One-way upstream loss beside it keeps its own filter (it loses probes too).
    mixed = FaultState().apply("loss", DOWN, 0.2, both_ways=True).apply("loss", UP, 0.1)
    assert mixed.filters()["client"] == bpf.drop_fraction(0.1)
    assert state.apply("thaw", BOTH).filters()["client"] is None


def test_thawing_the_streams_one_at_a_time_equals_thawing_both_from_any_state() -> None:
    modes = [m for m in TRANSITIONS if m != "thaw"]
    for a, b in itertools.product(modes, repeat=2):
        for sa, sb in itertools.product((BOTH, UP, DOWN), repeat=2):
            state = FaultState().apply(a, sa, 0.3).apply(b, sb, 0.3)
            assert state.apply("thaw", UP).apply("thaw", DOWN) == state.apply("thaw", BOTH)
            assert state.apply("thaw", DOWN).apply("thaw", UP) == FaultState()


def test_equal_states_hash_alike_however_they_were_made() -> None:
    # The hash is cached per state object: equal states made by different paths (a
    # transition, a join, the constructor) must still meet in a set and in the
    # transitions' cache.
    steps = list(itertools.product(TRANSITIONS, (BOTH, UP, DOWN)))
    made: list[FaultState] = []
    for (a, sa), (b, sb) in itertools.product(steps, repeat=2):
        state = FaultState().apply(a, sa, 0.3).apply(b, sb, 0.3)
        made += [state, state.join(FaultState()), FaultState(state.upstream, state.downstream)]
    for x, y in itertools.product(made, repeat=2):
        assert x != y or hash(x) == hash(y), (x, y)
    assert len(set(made)) == len({(s.upstream, s.downstream) for s in made}) > 10


def test_every_pair_of_conditions_has_a_label() -> None:
    assert set(LABELS) == set(itertools.product(Condition, repeat=2))


def test_the_transitions_are_the_modes_that_act_on_connections_and_thaw() -> None:
    stateful = {m.name for m in MODES.values() if m.undone_by == "thaw"} | {"thaw"}
    assert set(TRANSITIONS) == stateful


def test_new_connections_join_include_new_and_every_matching_partition() -> None:
    new = NewConnectionFaults()
    new.apply("freeze", UP)
    new.partition(("127.0.0.2", None))
    assert new.for_peer(("127.0.0.1", 5)).label == "frozen-upstream"
    assert new.for_peer(("127.0.0.2", 5)).label == "blackholed"
    assert new.syn_dropped_peers() == (False, [("127.0.0.2", None)])
    new.thaw(UP, ("127.0.0.2", None))  # that partition's upstream only
    assert new.syn_dropped_peers() == (False, [("127.0.0.2", None)])
    new.thaw(DOWN, ("127.0.0.2", None))  # its last stream: the partition has ended
    assert new.syn_dropped_peers() == (False, [])
    assert new.default.label == "frozen-upstream"  # a peer's thaw leaves include_new
    new.partition(ALL)
    assert new.syn_dropped_peers() == (True, [])
    new.thaw(BOTH)
    assert new.default.clear and new.partitions == {}


def test_the_listener_filter_joins_its_faults_and_the_partitions() -> None:
    new = NewConnectionFaults()
    assert ListenerFaults().program(new) is None
    assert ListenerFaults(syn_dropped=True).program(new) == bpf.drop_all()
    new.partition(("127.0.0.2", None))
    program = ListenerFaults(syn_loss=0.2).program(new)
    assert program is not None and program.what == "SYNs from 127.0.0.2 and 20 % of SYNs"
    new.partition(ALL)
    assert ListenerFaults().program(new) == bpf.drop_all()
