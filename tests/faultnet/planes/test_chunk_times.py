"""The toxic path's plane side, on every plane: each chunk carries the time the plane
read it, the inbox is bounded in bytes, and a lane goes back to the plane
(:meth:`faultnet.planes.Link.to_plane`) only once trio has taken every chunk.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from faultnet import planes
from faultnet.sockopts import unread_bytes
from faultnet.testing import wait_until
from tests.faultnet.sockets import recv_exactly


@pytest.fixture(params=planes.available_planes())
def plane_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Rig:
    """A plane link between two loopback connections; the ends the test drives."""

    def __init__(self, plane: planes.Plane) -> None:
        self.plane = plane
        self.link: planes.Link
        self.app_client: socket.socket
        self.app_server: socket.socket
        #: The plane's socket that the client's bytes arrive in.
        self.client: socket.socket
        self.chunks = trio.Event()

    def on_event(self, kind: str, stream: str | None) -> None:
        if kind == planes.CHUNKS:
            self.chunks.set()

    async def next_chunks(self) -> None:
        with trio.fail_after(10):
            await self.chunks.wait()
        self.chunks = trio.Event()


def _unsent(sock: socket.socket) -> int:
    """Bytes *sock* has sent that its peer's kernel has not taken (``SIOCOUTQ``)."""
    got = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("i", got)[0])


def _tcp_pair(lst: socket.socket) -> tuple[socket.socket, socket.socket]:
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    return a, b


@asynccontextmanager
async def open_rig(name: str, to_trio: list[str]) -> AsyncIterator[Rig]:
    plane = planes.make_plane(name)
    plane.start(trio.lowlevel.current_trio_token())
    rig = Rig(plane)
    with socket.create_server(("127.0.0.1", 0)) as lst:
        rig.app_client, client = _tcp_pair(lst)
        rig.client = client
        server, rig.app_server = _tcp_pair(lst)
    for s in (client, server):
        s.setblocking(False)
    rig.app_server.settimeout(10)
    try:
        rig.link = plane.add(client, server, rig.on_event, to_trio=to_trio)
        yield rig
    finally:
        rig.link.end()
        plane.stop()
        for s in (client, server, rig.app_client, rig.app_server):
            s.close()


async def test_each_chunk_carries_the_monotonic_time_it_was_read(plane_name: str) -> None:
    async with open_rig(plane_name, ["upstream"]) as rig:
        stamps = []
        for i in range(3):
            before = time.monotonic()
            rig.app_client.sendall(b"m%d" % i)
            await rig.next_chunks()
            ((data, t_read),) = rig.link.take_timed("upstream")
            assert data == b"m%d" % i
            assert before <= t_read <= time.monotonic()
            stamps.append(t_read)
            await trio.sleep(0.01)
        # Read 10 ms apart, stamped 10 ms apart: not the time they were taken.
        assert all(b - a >= 0.009 for a, b in zip(stamps, stamps[1:], strict=False))


async def test_the_inbox_holds_many_small_chunks_and_a_bounded_number_of_bytes(
    plane_name: str,
) -> None:
    async with open_rig(plane_name, ["upstream"]) as rig:
        # 40 small messages, each read on its own (the former cap was 16 chunks).
        for i in range(40):
            rig.app_client.sendall(b"%03d" % i)
            await wait_until(lambda: unread_bytes(rig.client) == 0, 10, what="the plane's read")
        taken = rig.link.take_timed("upstream")
        assert b"".join(d for d, _ in taken) == b"".join(b"%03d" % i for i in range(40))
        assert len(taken) == 40
        # More than the bound, never taken: the plane stops reading (bytes wait unread in
        # its socket) with at most 1 MiB and one read's worth in the inbox.
        rig.app_client.setblocking(False)
        sent = 0
        with trio.fail_after(10):
            while sent < 3 << 20:
                try:
                    sent += rig.app_client.send(b"x" * 65536)
                except BlockingIOError:
                    await trio.sleep(0.001)

        # What the plane has read: sent, less what is still in either kernel. Bytes
        # unread in its socket alone do not say it stopped: under load (stress-ng on
        # both CPUs) its thread had not read at all yet, and the inbox held 0.
        def read_by_plane() -> int:
            return sent - _unsent(rig.app_client) - unread_bytes(rig.client)

        bound = 1 << 20
        await wait_until(
            lambda: read_by_plane() >= bound - 65536, 10, what="the plane to fill its inbox"
        )
        # Whatever it would read now, it reads here (one pass in this thread): a plane
        # with no bound empties its socket.
        rig.plane.settle()
        assert unread_bytes(rig.client) > 0, "the plane read on past its bound"
        held = sum(len(d) for d, _ in rig.link.take_timed("upstream"))
        assert bound - 65536 <= held <= bound + 65536


async def test_to_plane_waits_for_trio_to_take_every_chunk(plane_name: str) -> None:
    async with open_rig(plane_name, ["upstream"]) as rig:
        rig.app_client.sendall(b"first")
        await rig.next_chunks()
        assert not rig.link.to_plane("upstream"), "left chunks trio never took"
        assert rig.link.on_toxic_path("upstream")
        ((data, _),) = rig.link.take_timed("upstream")
        assert rig.link.offer("upstream", data)
        assert rig.link.to_plane("upstream")
        assert not rig.link.on_toxic_path("upstream")
        rig.app_client.sendall(b"second")  # forwarded by the plane alone now
        got = await trio.to_thread.run_sync(recv_exactly, rig.app_server, 11)
        assert got == b"firstsecond"
        assert rig.link.take_timed("upstream") == []
