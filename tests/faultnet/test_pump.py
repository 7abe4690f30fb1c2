"""The pump's parts on their own: the Gate, the PipePool, and a Direction driven by a
stub owner over real socket pairs (no Proxy, no Connection)."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from typing import Any

import pytest
import trio
import trio.testing

from faultnet.pump import CHUNK, SPLICE_CHUNK, Direction, Gate, PipePool

_F_GETPIPE_SZ = 1032


# -- Gate --------------------------------------------------------------------------------


async def test_an_open_gate_lets_through_without_a_checkpoint() -> None:
    gate = Gate()
    assert gate.is_open
    with trio.CancelScope() as scope:
        scope.cancel()
        await gate.wait_open()  # no checkpoint: a cancelled scope does not fire here
    assert not scope.cancelled_caught


async def test_a_closed_gate_holds_every_waiter_until_opened() -> None:
    gate = Gate()
    gate.close()
    assert not gate.is_open
    passed: list[int] = []

    async def waiter(i: int) -> None:
        await gate.wait_open()
        passed.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(waiter, i)
        await trio.testing.wait_all_tasks_blocked()
        assert passed == []
        gate.open()
    assert sorted(passed) == [0, 1, 2]


async def test_a_gate_closed_again_before_the_waiter_runs_keeps_holding_it() -> None:
    gate = Gate()
    gate.close()
    passed = trio.Event()

    async def waiter() -> None:
        await gate.wait_open()
        passed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        gate.open()
        gate.close()  # no checkpoint between: the woken waiter must see it closed
        await trio.testing.wait_all_tasks_blocked()
        assert not passed.is_set()
        gate.open()
    assert passed.is_set()


# -- PipePool ----------------------------------------------------------------------------


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def test_pipe_pool_lends_non_blocking_pipes_of_the_asked_size_and_reuses_them() -> None:
    pool = PipePool(keep=1)
    r, w = pool.take()
    try:
        assert os.get_blocking(r) is False and os.get_blocking(w) is False
        with open("/proc/sys/fs/pipe-max-size") as f:
            if int(f.read()) >= SPLICE_CHUNK:
                assert fcntl.fcntl(w, _F_GETPIPE_SZ) == SPLICE_CHUNK
        pool.give((r, w))
        assert pool.take() == (r, w)  # an idle pipe is lent again, not remade
    finally:
        pool.give((r, w))
        pool.close()
    assert _closed(r) and _closed(w)


def test_pipe_pool_keeps_at_most_keep_and_closes_the_rest() -> None:
    pool = PipePool(keep=2)
    pipes = [pool.take() for _ in range(4)]
    for pipe in pipes:
        pool.give(pipe)
    assert [_closed(fd) for pipe in pipes for fd in pipe] == [False] * 4 + [True] * 4
    pool.close()
    assert all(_closed(fd) for pipe in pipes for fd in pipe)


def test_pipe_pool_discard_closes_a_pipe_that_may_hold_bytes() -> None:
    pool = PipePool()
    r, w = pool.take()
    os.write(w, b"held")
    pool.discard((r, w))
    assert _closed(r) and _closed(w)
    pool.close()


# -- a Direction with a stub owner -------------------------------------------------------


class StubOwner:
    """The Owner protocol with no toxics: what a Direction needs, and nothing else."""

    def __init__(self) -> None:
        self.chain_changed = trio.Event()
        self.events: list[tuple[str, dict[str, Any]]] = []

    def wants_copy(self, stream: str) -> bool:
        return False

    def chain(self, stream: str) -> Any:
        class Empty:
            async def send(self, data: bytes, t_read: float, sink: Direction) -> None:
                await sink.send_all(data)

            async def send_eof(self, sink: Direction) -> None:
                await sink.send_eof()

        return Empty()

    def log_event(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):
        s.setblocking(False)
    return a, b


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_direction_forwards_stops_at_a_closed_gate_and_passes_eof(splice: bool) -> None:
    client, src = _pair()  # client -> src: what the direction reads
    dst, server = _pair()  # dst -> server: where it writes
    gate = Gate()
    d = Direction(StubOwner(), "upstream", src, dst, gate, memoryview(bytearray(CHUNK)))
    pool = PipePool()
    server_stream = trio.SocketStream(trio.socket.from_stdlib_socket(server))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.run, splice, pool)
            client.send(b"hello")
            with trio.fail_after(5):
                assert await server_stream.receive_some(64) == b"hello"
            gate.close()
            client.send(b"held")
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(BlockingIOError):
                server.recv(64)  # not one byte after the gate closed
            assert d.bytes == 5
            client.shutdown(socket.SHUT_WR)
            gate.open()
            with trio.fail_after(5):
                got = b""
                while data := await server_stream.receive_some(64):
                    got += data
            assert got == b"held" and d.eof_forwarded and d.bytes == 9
    finally:
        pool.close()
        for s in (client, src, dst):
            s.close()
        await server_stream.aclose()
