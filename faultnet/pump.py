"""Moving bytes one way through a connection: the gate, and the splice and copy pumps.

Every syscall that moves bytes (recv, send, splice, shutdown) is preceded, with no
checkpoint in between, by a look at the direction's :class:`Gate`. trio runs one task at a
time, so when a fault call closes a gate every pump is parked at an ``await``; the next
thing each does on waking is look at the gate. That is why ``freeze`` is total the moment
it returns: no byte is moved after it, even by a sender streaming flat out. Bytes already
handed to the kernel before the freeze (the socket's send queue) still drain; bytes read
but not yet written (in a splice pipe or the copy path's queue) are held, and delivered in
order on thaw.

Nothing is moved by cancellation: pumps are stopped only while parked at an ``await``,
never in the middle of a partial write, because raw non-blocking syscalls report exactly
how much they moved.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from faultnet.proxy import Connection

__all__ = ["Gate", "PipePool", "StreamClosed", "StreamReset"]

#: Bytes per read on the copy path. 256 KiB reads measured ~1.6x the throughput of
#: 64 KiB through trio (reference/linux-faults.md); larger ones allocate more per small read.
CHUNK = 256 * 1024
#: Bytes per splice, and the pipe size asked for (pipe-max-size is 1 MiB by default).
#: 1 MiB measured 0.30-0.35 s of proxy CPU per GiB against 0.37-0.42 for 256 KiB.
SPLICE_CHUNK = 1024 * 1024
#: Yield to other tasks after this many consecutive syscalls without a wait.
_FAIRNESS = 16
#: Chunks the copy path's reader may run ahead of its writer (toxics pipeline on it).
_COPY_QUEUE = 16
_F_SETPIPE_SZ = 1031
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class StreamReset(Exception):
    """The peer reset the connection (or it failed in a way only a reset can pass on)."""


class StreamClosed(Exception):
    """The socket was closed under the pump by a fault (sever/reset)."""


class Gate:
    """A flag a pump looks at before every byte-moving syscall.

    ``close()`` and ``open()`` act at once and never block. ``wait_open()`` returns at
    once, without a checkpoint, while the gate is open. The wake-up event is made only
    when a task actually waits (closing 10,000 gates for one freeze made 10,000 events:
    half of a 5,000-connection freeze's 48 ms).
    """

    __slots__ = ("_event", "_open")

    def __init__(self) -> None:
        self._open = True
        self._event: trio.Event | None = None

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        self._open = False

    def open(self) -> None:
        self._open = True
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait_open(self) -> None:
        while not self._open:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()


class PipePool:
    """Pipes for splice, lent only while a direction has bytes in flight.

    An idle connection holds no pipe: a pump takes one when its socket turns readable and
    gives it back once the pipe is drained and the socket has nothing more to read.
    """

    def __init__(self, size: int = SPLICE_CHUNK, keep: int = 64) -> None:
        self._size = size
        self._keep = keep
        self._free: list[tuple[int, int]] = []

    def take(self) -> tuple[int, int]:
        if self._free:
            return self._free.pop()
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(w, _F_SETPIPE_SZ, self._size)
        except OSError:  # capped by /proc/sys/fs/pipe-max-size: keep the default
            pass
        return r, w

    def give(self, pipe: tuple[int, int]) -> None:
        if len(self._free) < self._keep:
            self._free.append(pipe)
        else:
            os.close(pipe[0])
            os.close(pipe[1])

    def discard(self, pipe: tuple[int, int]) -> None:
        """Close a pipe that may still hold bytes (its connection is being torn down)."""
        os.close(pipe[0])
        os.close(pipe[1])

    def close(self) -> None:
        for pipe in self._free:
            self.discard(pipe)
        self._free.clear()


_RESET_ERRNOS = {errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT, errno.EHOSTUNREACH}


def _classify(exc: OSError) -> Exception:
    if exc.errno == errno.EBADF:
        return StreamClosed()
    return StreamReset(exc)


class Direction:
    """One way through a connection: from ``src`` to ``dst``.

    ``stream`` is Toxiproxy's name: ``"upstream"`` (client to server) or ``"downstream"``.
    """

    def __init__(
        self, conn: Connection, stream: str, src: socket.socket, dst: socket.socket, gate: Gate
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.src = src
        self.dst = dst
        self.gate = gate
        #: Bytes written to ``dst`` (what crossed the proxy).
        self.bytes = 0
        self.eof_forwarded = False
        self._ops = 0

    # -- byte-moving primitives: gate first, then the syscall, no checkpoint between --

    async def _fair(self) -> None:
        self._ops += 1
        if self._ops >= _FAIRNESS:
            self._ops = 0
            await trio.lowlevel.checkpoint()

    async def recv(self) -> bytes:
        """Read what ``src`` has, up to CHUNK bytes (b"" at EOF). Raises StreamReset."""
        buf = self.conn.proxy._recv_buf
        while True:
            await self.gate.wait_open()
            try:
                # Into the proxy's one buffer, then copy out what came. recv(CHUNK) allocates
                # CHUNK bytes per call: measured 18.3 us per 64-byte read against 4.5, and
                # 121 us per 200 KB read against 16. No await between the read and the
                # copy, so tasks never share the buffer.
                data = bytes(buf[: self.src.recv_into(buf)])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.src)
                continue
            except OSError as exc:
                raise _classify(exc) from exc
            await self._fair()
            return data

    async def send_all(self, data: bytes | memoryview) -> None:
        """Write all of *data* to ``dst``, counting what crossed. Raises StreamReset."""
        view = memoryview(data)
        while view:
            await self.gate.wait_open()
            try:
                n = self.dst.send(view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.dst)
                continue
            except OSError as exc:
                raise _classify(exc) from exc
            self.bytes += n
            view = view[n:]
            await self._fair()

    async def send_eof(self) -> None:
        """Forward the end of this stream as a FIN, keeping the other direction open."""
        await self.gate.wait_open()
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise _classify(exc) from exc
        self.eof_forwarded = True

    # -- pumps --

    async def run(self, splice: bool, pool: PipePool) -> None:
        """Forward until EOF has been passed on. Raises StreamReset/StreamClosed."""
        # The connection may have been ended (sockets closed, scope cancelled) before this
        # task first ran; trio's wait_readable registers the fd before it looks at
        # cancellation, so it would fail on the closed fd instead of raising Cancelled.
        await trio.lowlevel.checkpoint_if_cancelled()
        if splice and not self.conn.wants_copy(self.stream):
            if await self._splice(pool):
                return
        await self._copy()

    async def _splice(self, pool: PipePool) -> bool:
        """Zero-copy forwarding. True at EOF; False when this direction must move to the
        copy path (a toxic applies, or no descriptor is left for a pipe)."""
        src, dst = self.src.fileno(), self.dst.fileno()
        while True:
            if self.conn.wants_copy(self.stream):
                return False
            await trio.lowlevel.wait_readable(self.src)
            # A frozen direction takes no pipe: its bytes wait in the kernel. (Taking one
            # first cost 4 descriptors per frozen connection and ran a 5,000-connection
            # freeze out of descriptors.)
            await self.gate.wait_open()
            if self.conn.wants_copy(self.stream):
                return False  # a toxic arrived while parked: these bytes go through it
            try:
                pipe = pool.take()
            except OSError as exc:
                self.conn.proxy.log.write(
                    "splice_fallback",
                    conn=self.conn.id,
                    stream=self.stream,
                    reason=exc.strerror or str(exc),
                )
                return False
            drained = False
            try:
                while True:
                    await self.gate.wait_open()
                    try:
                        n = os.splice(src, pipe[1], SPLICE_CHUNK, flags=_SPLICE_FLAGS)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        raise _classify(exc) from exc
                    if n == 0:
                        drained = True
                        await self.send_eof()
                        return True
                    filled = n
                    while n:
                        await self.gate.wait_open()
                        try:
                            m = os.splice(pipe[0], dst, n, flags=_SPLICE_FLAGS)
                        except BlockingIOError:
                            await trio.lowlevel.wait_writable(self.dst)
                            continue
                        except OSError as exc:
                            raise _classify(exc) from exc
                        self.bytes += m
                        n -= m
                    if filled < SPLICE_CHUNK:
                        # A short read almost always means the socket is empty: wait for
                        # readability instead of paying a splice that returns EAGAIN
                        # (measured: 98 -> 86 us of proxy CPU per 64-byte round trip).
                        break
                    await self._fair()
                drained = True
            finally:
                (pool.give if drained else pool.discard)(pipe)

    async def _copy(self) -> None:
        """Copy path: a reader task feeds chunks, stamped with the time they were read,
        to this task, which passes each through the stream's toxic chain."""
        send, receive = trio.open_memory_channel[tuple[bytes, float]](_COPY_QUEUE)
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                async with send:
                    while data := await self.recv():
                        await send.send((data, trio.current_time()))

            nursery.start_soon(reader)
            async with receive:
                async for data, t_read in receive:
                    await self._through_chain(0, self.conn.chain(self.stream), data, t_read)
            while True:
                changed = self.conn.chain_changed  # taken before offering: no lost wakeup
                await self._eof_through_chain(0, self.conn.chain(self.stream))
                if self.eof_forwarded:
                    break
                # A toxic held the EOF (timeout does): offer it again whenever the chain
                # changes, so removing that toxic lets the FIN through.
                await changed.wait()

    async def _through_chain(
        self, i: int, chain: list[ChainLink], data: bytes, t_read: float
    ) -> None:
        if i == len(chain):
            await self.send_all(data)
        else:
            await chain[i].toxic.on_chunk(chain[i].context(self, i, chain), data, t_read)

    async def _eof_through_chain(self, i: int, chain: list[ChainLink]) -> None:
        if i == len(chain):
            await self.send_eof()
        else:
            await chain[i].toxic.on_eof(chain[i].context(self, i, chain))


class ChainLink:
    """One toxic applied to one connection and stream: its context for the toxic."""

    def __init__(
        self,
        toxic: object,
        conn_id: int,
        stream: str,
        rng: object,
        close: Callable[[], Awaitable[None]],
        reset: Callable[[], Awaitable[None]],
    ) -> None:
        from faultnet.toxics.base import Toxic

        assert isinstance(toxic, Toxic)
        self.toxic = toxic
        self.conn_id = conn_id
        self.stream = stream
        self.rng = rng
        self.state: dict[str, object] = {}
        self._close = close
        self._reset = reset
        self._where: tuple[Direction, int, list[ChainLink]] | None = None

    def context(self, direction: Direction, i: int, chain: list[ChainLink]) -> ChainLink:
        self._where = (direction, i, chain)
        return self

    # The ToxicContext protocol.
    async def forward(self, data: bytes, t_read: float) -> None:
        assert self._where is not None
        d, i, chain = self._where
        await d._through_chain(i + 1, chain, data, t_read)

    async def forward_eof(self) -> None:
        assert self._where is not None
        d, i, chain = self._where
        await d._eof_through_chain(i + 1, chain)

    async def close(self) -> None:
        await self._close()

    async def reset(self) -> None:
        await self._reset()
