"""The proxy's fault state machine, against a model, on real sockets.

Hypothesis draws sequences of freeze / blackhole / loss (one way, or both ways on the
connection's internal hop) / partition / thaw / sever over streams, ``only=`` and ``peer=``, with new connections arriving from two client
addresses (127.0.0.1 and 127.0.0.2). After every step each connection is checked
against a model written here from the README's semantics, independently of
faultnet.proxy._faultstate:

* the listing's ``state`` and ``loss``, and ``proxy.state``;
* the filter the kernel holds on each of the proxy's sockets (SO_GET_FILTER's length:
  1 for the blackhole's drop-all, 4 for a loss program, 0 for none), and on both ends of
  a connection's hop once it has one (it keeps it, lossless, after thaw);
* which bytes cross: while neither socket has a filter, a byte is sent each way; on an
  open stream it, and everything held before it, must arrive; on a closed one the plane
  must not move it (its counter is unchanged after ``settle``). At the end everything
  is thawed and every byte ever sent must arrive, on every connection and a new one.

The proxy runs in a trio loop of its own thread, as it does under a real client; the
test's sockets are plain blocking ones. Examples and steps are bounded (CI: 25 x 12).
On main before issue 20 this found the per-stream thaw defect (blackhole, then
thaw("upstream"), then thaw("downstream"): still "blackholed", the drop filter still on).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from faultnet.planes import available_planes
from faultnet.proxy import open_proxy
from faultnet.sockopts import filter_length

PEERS = ("127.0.0.1", "127.0.0.2")
STREAMS = ("upstream", "downstream")
MAX_LIVE = 3
#: How long a byte on an open stream may take to arrive: microseconds on loopback, but
#: up to the sender's backed-off retransmission timer for bytes written while a filter
#: dropped the ACKs (a few hundred ms in these short examples).
ARRIVAL_BOUND_S = 10.0
#: Instruction counts of faultnet.bpf's programs: drop_all, drop_fraction,
#: drop_bare_fraction (two-way loss's client leg).
DROP_ALL_LEN, LOSS_LEN, BARE_LEN = 1, 4, 14

ORDER = {"open": 0, "frozen": 1, "blackholed": 2}


def label(up: str, down: str) -> str:
    """The listing's state for two stream conditions (the README's table)."""
    if "blackholed" in (up, down):
        if up == down or "frozen" in (up, down):
            return "blackholed"
        return f"blackholed-{'upstream' if up == 'blackholed' else 'downstream'}"
    if up == down == "frozen":
        return "frozen"
    if "frozen" in (up, down):
        return f"frozen-{'upstream' if up == 'frozen' else 'downstream'}"
    return "open"


class ProxyThread:
    """A Proxy in a trio loop on a thread of its own, called from this thread."""

    def __init__(self, upstream: tuple[str, int], plane: str) -> None:
        self._upstream = upstream
        self._plane = plane
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the proxy did not start within 10 s")
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test thread
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with open_proxy(self._upstream, dataplane=self._plane) as proxy:
            self.proxy = proxy
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def call_sync(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return trio.from_thread.run_sync(
            functools.partial(fn, *args, **kwargs), trio_token=self._token
        )

    def close(self) -> None:
        self.call_sync(self._stop.set)
        self._thread.join(30)


class Pair:
    """One client connection through the proxy and its upstream end, and the model."""

    def __init__(self, client: socket.socket, server: socket.socket, cid: int, peer: str):
        self.client, self.server, self.id, self.peer = client, server, cid, peer
        self.condition = dict.fromkeys(STREAMS, "open")
        self.loss = dict.fromkeys(STREAMS, 0.0)
        #: Per stream: its loss is both ways (on the hop); and whether it has a hop.
        self.both_ways = dict.fromkeys(STREAMS, False)
        self.on_hop = False
        self.sent = dict.fromkeys(STREAMS, 0)
        self.received = dict.fromkeys(STREAMS, 0)

    def ends(self, stream: str) -> tuple[socket.socket, socket.socket]:
        return (self.client, self.server) if stream == "upstream" else (self.server, self.client)

    def filters(self) -> tuple[int, int]:
        """The model's (client socket, upstream socket) filter lengths."""
        one_way = {s: self.loss[s] and not self.both_ways[s] for s in STREAMS}
        if "blackholed" in self.condition.values():
            client = DROP_ALL_LEN
        elif one_way["upstream"]:
            client = LOSS_LEN
        else:
            client = BARE_LEN if any(self.loss[s] and self.both_ways[s] for s in STREAMS) else 0
        return client, LOSS_LEN if one_way["downstream"] else 0

    def hop_filter(self) -> int | None:
        """The model's filter length on each end of the hop (None: no hop)."""
        if not self.on_hop:
            return None
        return LOSS_LEN if any(self.loss[s] and self.both_ways[s] for s in STREAMS) else 0


selectors = st.sampled_from([None, *PEERS])
stream_choices = st.sampled_from(["both", "upstream", "downstream"])


class FaultSequences(RuleBasedStateMachine):
    #: The data plane the proxy runs on (set per test).
    plane = "thread"

    @initialize()
    def start(self) -> None:
        self.upstream = socket.create_server(("127.0.0.1", 0))
        self.upstream.settimeout(ARRIVAL_BOUND_S)
        self.px = ProxyThread(self.upstream.getsockname(), self.plane)
        self.pairs: dict[int, Pair] = {}
        #: The include_new state, per stream, and each partition's (None: everyone).
        self.new = dict.fromkeys(STREAMS, "open")
        self.partitions: dict[str | None, dict[str, str]] = {}

    def teardown(self) -> None:
        if not hasattr(self, "px"):
            return
        try:
            # Everything thawed: no filter is left, every connection forwards both ways,
            # and so does a new one.
            self.px.call(self.px.proxy.thaw)
            self._thaw_model(STREAMS, None, None)
            self.connect("127.0.0.1")
            self.the_listing_and_the_state_match_the_model()
            self.each_socket_carries_the_filter_the_model_says()
            for pair in self.pairs.values():
                for s in STREAMS:
                    pair.ends(s)[0].sendall(b"y")
                    pair.sent[s] += 1
                    self._deliver(pair, s)
        finally:
            for pair in self.pairs.values():
                pair.client.close()
                pair.server.close()
            self.px.close()
            self.upstream.close()

    # -- the model's selection --

    def _selected(self, only: list[int] | None, peer: str | None) -> list[Pair]:
        return [
            p
            for p in self.pairs.values()
            if (only is None or p.id in only) and (peer is None or p.peer == peer)
        ]

    def _streams(self, stream: str) -> tuple[str, ...]:
        return STREAMS if stream == "both" else (stream,)

    def _new_for(self, peer: str) -> dict[str, str]:
        state = dict(self.new)
        for selector, faults in self.partitions.items():
            if selector is None or selector == peer:
                for s in STREAMS:
                    if ORDER[faults[s]] > ORDER[state[s]]:
                        state[s] = faults[s]
        return state

    def _thaw_model(self, streams: tuple[str, ...], only: Any, peer: str | None) -> None:
        for pair in self._selected(only, peer):
            for s in streams:
                pair.condition[s] = "open"
                pair.loss[s] = 0.0
                pair.both_ways[s] = False
        if only is None:
            if peer is None:
                for s in streams:
                    self.new[s] = "open"
            for selector in [peer] if peer is not None else list(self.partitions):
                if selector in self.partitions:
                    for s in streams:
                        self.partitions[selector][s] = "open"
                    if set(self.partitions[selector].values()) == {"open"}:
                        del self.partitions[selector]

    def _only(self, data: st.DataObject) -> list[int] | None:
        ids = sorted(self.pairs)
        if not ids:
            return None
        return data.draw(st.one_of(st.none(), st.lists(st.sampled_from(ids), max_size=2)))

    # -- rules --

    @precondition(lambda self: len(self.pairs) < MAX_LIVE)
    @rule(peer=st.sampled_from(PEERS))
    def connect(self, peer: str) -> None:
        if None in self.partitions or peer in self.partitions:
            return  # its SYNs are dropped: the connect would hang (proven elsewhere)
        client = socket.socket()
        client.bind((peer, 0))
        client.settimeout(ARRIVAL_BOUND_S)
        client.connect(self.px.proxy.address)
        server, _ = self.upstream.accept()
        server.settimeout(ARRIVAL_BOUND_S)
        me = f"{peer}:{client.getsockname()[1]}"
        listed = self.px.call_sync(self.px.proxy.connections)
        (cid,) = [c.id for c in listed if c.peer == me]
        pair = Pair(client, server, cid, peer)
        pair.condition = self._new_for(peer)
        self.pairs[cid] = pair

    @rule(stream=stream_choices, include_new=st.booleans(), data=st.data())
    def freeze(self, stream: str, include_new: bool, data: st.DataObject) -> None:
        only = None if include_new else self._only(data)
        peer = None if include_new else data.draw(selectors)
        self.px.call(self.px.proxy.freeze, stream, include_new=include_new, only=only, peer=peer)
        for pair in self._selected(only, peer):
            for s in self._streams(stream):
                if pair.condition[s] == "open":
                    pair.condition[s] = "frozen"
        if include_new:
            for s in self._streams(stream):
                if self.new[s] == "open":
                    self.new[s] = "frozen"

    @rule(include_new=st.booleans(), data=st.data())
    def blackhole(self, include_new: bool, data: st.DataObject) -> None:
        only = None if include_new else self._only(data)
        peer = None if include_new else data.draw(selectors)
        self.px.call(self.px.proxy.blackhole, include_new=include_new, only=only, peer=peer)
        for pair in self._selected(only, peer):
            pair.condition = dict.fromkeys(STREAMS, "blackholed")
        if include_new:
            self.new = dict.fromkeys(STREAMS, "blackholed")

    @rule(percent=st.sampled_from([5.0, 30.0]), stream=stream_choices, data=st.data())
    def loss(self, percent: float, stream: str, data: st.DataObject) -> None:
        only, peer = self._only(data), data.draw(selectors)
        self.px.call(self.px.proxy.loss, percent, stream, only=only, peer=peer)
        for pair in self._selected(only, peer):
            for s in self._streams(stream):
                pair.loss[s] = percent / 100
                pair.both_ways[s] = False

    @rule(percent=st.sampled_from([5.0, 30.0]), data=st.data())
    def loss_both_ways(self, percent: float, data: st.DataObject) -> None:
        only, peer = self._only(data), data.draw(selectors)
        self.px.call(self.px.proxy.loss, percent, only=only, peer=peer, both_ways=True)
        for pair in self._selected(only, peer):
            pair.loss = dict.fromkeys(STREAMS, percent / 100)
            pair.both_ways = dict.fromkeys(STREAMS, True)
            pair.on_hop = True

    @rule(peer=selectors)
    def partition(self, peer: str | None) -> None:
        self.px.call(self.px.proxy.partition, peer=peer)
        for pair in self._selected(None, peer):
            pair.condition = dict.fromkeys(STREAMS, "blackholed")
        self.partitions[peer] = dict.fromkeys(STREAMS, "blackholed")

    @rule(stream=stream_choices, data=st.data())
    def thaw(self, stream: str, data: st.DataObject) -> None:
        only, peer = self._only(data), data.draw(selectors)
        self.px.call(self.px.proxy.thaw, stream, only=only, peer=peer)
        self._thaw_model(self._streams(stream), only, peer)

    @precondition(lambda self: bool(self.pairs))
    @rule(data=st.data())
    def sever(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.pairs)))
        assert self.px.call(self.px.proxy.sever, only=[cid]) == 1
        pair = self.pairs.pop(cid)
        pair.client.close()
        pair.server.close()

    # -- the checks --

    @invariant()
    def the_listing_and_the_state_match_the_model(self) -> None:
        if not hasattr(self, "px"):
            return
        listed = {c.id: c for c in self.px.call_sync(self.px.proxy.connections)}
        for pair in self.pairs.values():
            info = listed[pair.id]
            assert info.state == label(pair.condition["upstream"], pair.condition["downstream"])
            loss = {s: pair.loss[s] * 100 for s in STREAMS if pair.loss[s]} or None
            assert info.loss == loss
            both = sorted(s for s in STREAMS if pair.loss[s] and pair.both_ways[s]) or None
            assert info.loss_both_ways == both
            assert info.on_hop == pair.on_hop
        state = self.px.call_sync(lambda: self.px.proxy.state)
        assert state["frozen_new"] == sorted(s for s in STREAMS if self.new[s] == "frozen")
        assert state["blackhole_new"] == ("blackholed" in self.new.values())
        assert state["partitioned"] == ["*"] * (None in self.partitions) + sorted(
            p for p in self.partitions if p is not None
        )

    @invariant()
    def each_socket_carries_the_filter_the_model_says(self) -> None:
        if not hasattr(self, "px"):
            return
        conns = self.px.proxy._connections
        for pair in self.pairs.values():
            conn = conns[pair.id]
            got = (filter_length(conn.client), filter_length(conn.server))
            assert got == pair.filters(), f"conn {pair.id}: filters {got}, model {pair.filters()}"
            hop = None if conn.hop is None else {filter_length(e) for e in (conn.hop.a, conn.hop.b)}
            want = pair.hop_filter()
            assert hop == (None if want is None else {want}), f"conn {pair.id}: hop {hop}"

    @invariant()
    def bytes_cross_open_streams_and_not_closed_ones(self) -> None:
        if not hasattr(self, "px"):
            return
        for pair in self.pairs.values():
            if pair.filters() != (0, 0) or pair.hop_filter():
                # A filter drops data or the ACKs that clock it (a blackholed client's
                # ACKs, with Nagle holding the next write): what crosses then moves on
                # the retransmission timer, not now. Teardown checks it all arrives.
                continue
            for s in STREAMS:
                src, _ = pair.ends(s)
                src.sendall(b"x")
                pair.sent[s] += 1
                if pair.condition[s] == "open":
                    self._deliver(pair, s)
                else:
                    self._held(pair, s)

    def _deliver(self, pair: Pair, stream: str) -> None:
        _, dst = pair.ends(stream)
        while pair.received[stream] < pair.sent[stream]:
            try:
                got = dst.recv(65536)
            except TimeoutError:
                raise AssertionError(
                    f"conn {pair.id} {stream}: {pair.received[stream]} of "
                    f"{pair.sent[stream]} bytes arrived on an open stream"
                ) from None
            assert got, f"conn {pair.id} {stream}: EOF on an open stream"
            pair.received[stream] += len(got)

    def _held(self, pair: Pair, stream: str) -> None:
        conn = self.px.proxy._connections[pair.id]
        index = STREAMS.index(stream)
        before = self.px.call_sync(conn.link.counts)[index]
        self.px.call_sync(self.px.proxy._plane.settle)
        after = self.px.call_sync(conn.link.counts)[index]
        assert after == before, f"conn {pair.id} {stream}: {after - before} bytes crossed"


@pytest.mark.parametrize("plane", available_planes())
def test_any_sequence_of_faults_ends_where_the_model_says(plane: str) -> None:
    machine = type(f"FaultSequences_{plane}", (FaultSequences,), {"plane": plane})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("FAULTNET_SEQUENCE_EXAMPLES", "25")),
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
