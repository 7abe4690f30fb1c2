"""A connection's toxic link: back to the plane's fast path when its toxics are gone.

Once a stream's chain is empty and every chunk the plane read for trio has been handed
on, the stream leaves the toxic path (:meth:`faultnet.planes.Link.to_plane`): bytes in
flight at the switch arrive intact and in order, and a half-close is still forwarded.

These tests are of the trio path, so compiled stages are off here (the native plane
would run the latency toxic itself): tests/faultnet/planes/test_compiled_stages.py has
the same switches with the stage compiled.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from faultnet.proxy import Proxy
from faultnet.proxy._toxiclink import COMPILED_STAGES_ENV
from faultnet.seeds import derive_seed
from faultnet.testing import open_link, wait_until
from faultnet.toxics import Latency, LimitData
from tests.faultnet.sockets import carried, read_exactly

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

PIECE, PIECES = 1024, 300


@pytest.fixture(autouse=True)
def trio_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILED_STAGES_ENV, "0")


def pattern(n: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


def only_connection(proxy: Proxy):  # type: ignore[no-untyped-def]
    (conn,) = proxy._connections.values()
    return conn


async def test_a_stream_whose_toxics_are_removed_goes_back_to_the_plane() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        assert conn.link is not None
        proxy.add_toxic(Latency("up", "upstream", latency=20))
        proxy.add_toxic(Latency("down", "downstream", latency=20))
        assert conn.link.on_toxic_path("upstream") and conn.link.on_toxic_path("downstream")
        payload = pattern(PIECE * PIECES)
        got: list[bytes] = []

        async def receive() -> None:
            got.append(await read_exactly(server, len(payload)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for i in range(PIECES):
                await client.send_all(payload[i * PIECE : (i + 1) * PIECE])
                if i == PIECES // 3:  # bytes before, in the chain, and after the switch
                    proxy.remove_toxic("up")
                await trio.sleep(0.0005)
        assert got[0] == payload, "bytes lost or reordered across the switch"

        def back_on_plane() -> bool:
            assert conn.link is not None
            return not conn.link.on_toxic_path("upstream")

        await wait_until(back_on_plane, 5, what="the upstream lane back on the plane")
        assert not conn.toxic_links["upstream"].running
        # The other stream keeps its toxic: still on the toxic path, still delayed.
        assert conn.link.on_toxic_path("downstream")
        assert await carried(server, client, b"back") >= 0.020
        # On the plane again: more bytes, then the half-close, forwarded.
        await client.send_all(b"after")
        assert await read_exactly(server, 5) == b"after"
        await client.send_eof()
        with trio.fail_after(10):
            assert await server.receive_some(10) == b""
        # The other way still open, and its toxic can go too.
        proxy.remove_toxic("down")

        def down_on_plane() -> bool:
            assert conn.link is not None
            return not conn.link.on_toxic_path("downstream")

        await wait_until(down_on_plane, 5, what="the downstream lane back on the plane")
        await server.send_all(b"last")
        assert await read_exactly(client, 4) == b"last"


async def test_a_toxic_added_again_puts_the_stream_back_on_the_toxic_path() -> None:
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        assert conn.link is not None
        for round_ in range(3):
            proxy.add_toxic(Latency("lat", "upstream", latency=30))
            assert await carried(client, server, b"x%d" % round_) >= 0.030
            proxy.remove_toxic("lat")

            def back_on_plane() -> bool:
                assert conn.link is not None
                return not conn.link.on_toxic_path("upstream")

            await wait_until(back_on_plane, 5, what="the lane back on the plane")
            await client.send_all(b"y%d" % round_)
            assert await read_exactly(server, 2) == b"y%d" % round_


async def test_a_latency_toxic_on_idle_connections_starts_no_task_until_bytes() -> None:
    """Adding a byte toxic without a task of its own (latency) to idle connections
    spawns nothing (the add's cost with 9,000 connections was two trio tasks each:
    issue 36 item 3); the first chunk starts the chain's task, and removing the toxic
    from a stream no chunk reached puts it back on the plane at once."""
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        assert conn.link is not None and proxy._nursery is not None
        await trio.testing.wait_all_tasks_blocked()
        tasks = len(proxy._nursery.child_tasks)
        proxy.add_toxic(Latency("lat", "downstream", latency=30))
        proxy.add_toxic(Latency("idle", "upstream", latency=30))
        await trio.testing.wait_all_tasks_blocked()
        assert len(proxy._nursery.child_tasks) == tasks, "a task started for idle toxics"
        assert not conn.toxic_links["downstream"].running
        assert conn.link.on_toxic_path("downstream") and conn.link.on_toxic_path("upstream")
        # Removed from a stream no byte reached: back on the plane when it returns.
        proxy.remove_toxic("idle")
        assert not conn.link.on_toxic_path("upstream")
        await client.send_all(b"fast")
        assert await read_exactly(server, 4) == b"fast"
        # The first chunk for trio starts the chain: the toxic is in force.
        assert await carried(server, client, b"late") >= 0.030
        assert conn.toxic_links["downstream"].running


async def test_a_sure_toxics_rng_is_made_at_first_use_with_the_same_numbers() -> None:
    """At toxicity 1 the decision's draw is not made at the add (seeding an rng was
    ~11 us a connection) but replayed at the stage's first use: the numbers a toxic
    draws are those of the seed derived from (server seed, connection, toxic name)."""
    async with open_link(seed=1234) as (proxy, _client, _server):
        conn = only_connection(proxy)
        proxy.add_toxic(Latency("sure", "downstream", latency=1))
        stage = conn.stages["sure"]
        assert stage is not None and stage._rng is None, "seeded at the add"
        expected = random.Random(derive_seed(1234, conn.id, "sure"))
        expected.random()  # the draw that decided the toxic applies
        assert [stage.rng.random() for _ in range(3)] == [expected.random() for _ in range(3)]


class StepsOf(trio.abc.Instrument):
    """Counts the steps trio runs of the tasks in *tasks* (a set filled as they start)."""

    def __init__(self) -> None:
        self.tasks: set[trio.lowlevel.Task] = set()
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task in self.tasks:
            self.steps += 1


async def test_a_chunk_that_goes_out_in_one_write_costs_its_task_one_step() -> None:
    """The chain's task defers the checkpoint after its one write (issue 34): woken by
    the plane, it writes the chunk and waits for the next in one step of trio's loop
    (two before: the checkpoint after the write was one more pass per chunk, ~10 % of
    a postgres toxic's instructions per pgbench -S query). Its fairness is test_no_stall's."""
    async with open_link() as (proxy, client, server):
        conn = only_connection(proxy)
        proxy.add_toxic(LimitData("pass", "upstream", bytes=2**50))  # forwards in one write
        assert await carried(client, server, b"warm") >= 0
        link = conn.toxic_links["upstream"]
        assert link.running and link._runner is not None
        counter = StepsOf()
        counter.tasks.add(link._runner)
        trio.lowlevel.add_instrument(counter)
        try:
            for i in range(50):
                await carried(client, server, b"m%02d" % i)
        finally:
            trio.lowlevel.remove_instrument(counter)
        # Measured: 50 in each of 8 runs at load 9; 91-92 with the checkpoint after the write.
        assert counter.steps <= 60, f"{counter.steps} steps of the chain's task for 50 chunks"
