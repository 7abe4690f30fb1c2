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

This module knows nothing of the proxy: a :class:`Direction` gets its sockets, gate and
read buffer as arguments and asks its :class:`Owner` (the connection) for the rest.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

import trio

__all__ = ["Chain", "Direction", "Gate", "Owner", "PipePool", "StreamClosed", "StreamReset"]

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


class Chain(Protocol):
    """The toxics of one stream (:class:`faultnet.toxics.chain.ToxicChain`): a chunk or
    the end of the stream goes in, and reaches the direction's socket through them."""

    async def send(self, data: bytes, t_read: float, sink: Direction) -> None: ...

    async def send_eof(self, sink: Direction) -> None: ...


class Owner(Protocol):
    """What a :class:`Direction` asks of the connection it belongs to."""

    #: Set (and replaced) whenever the connection's toxic chains change.
    chain_changed: trio.Event

    def wants_copy(self, stream: str) -> bool:
        """True once bytes of *stream* must pass through toxics (the copy path)."""
        ...

    def chain(self, stream: str) -> Chain:
        """The toxics *stream*'s bytes go through, as of now."""
        ...

    def log_event(self, event: str, **fields: Any) -> None:
        """Record *event* in the connection's event log."""
        ...


class Direction:
    """One way through a connection: from ``src`` to ``dst``.

    ``stream`` is Toxiproxy's name: ``"upstream"`` (client to server) or ``"downstream"``.
    ``recv_buf`` is the copy path's read buffer, shared by every direction of one proxy:
    no task awaits between reading into it and copying out what came.
    """

    def __init__(
        self,
        owner: Owner,
        stream: str,
        src: socket.socket,
        dst: socket.socket,
        gate: Gate,
        recv_buf: memoryview,
    ) -> None:
        self.owner = owner
        self.stream = stream
        self.src = src
        self.dst = dst
        self.gate = gate
        self._recv_buf = recv_buf
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
        buf = self._recv_buf
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

    async def _write_some(self, write: Callable[[], int]) -> int:
        """Gate, then *write* (one syscall into ``dst``); wait while ``dst`` is full.
        Returns and counts the bytes it moved. Raises StreamReset/StreamClosed."""
        while True:
            await self.gate.wait_open()
            try:
                n = write()
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.dst)
                continue
            except OSError as exc:
                raise _classify(exc) from exc
            self.bytes += n
            return n

    async def send_all(self, data: bytes | memoryview) -> None:
        """Write all of *data* to ``dst``, counting what crossed. Raises StreamReset."""
        view = memoryview(data)
        while view:
            view = view[await self._write_some(functools.partial(self.dst.send, view)) :]
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
        if splice and not self.owner.wants_copy(self.stream):
            if await self._splice(pool):
                return
        await self._copy()

    async def _splice(self, pool: PipePool) -> bool:
        """Zero-copy forwarding. True at EOF; False when this direction must move to the
        copy path (a toxic applies, or no descriptor is left for a pipe)."""
        src, dst = self.src.fileno(), self.dst.fileno()
        while True:
            if self.owner.wants_copy(self.stream):
                return False
            await trio.lowlevel.wait_readable(self.src)
            # A frozen direction takes no pipe: its bytes wait in the kernel. (Taking one
            # first cost 4 descriptors per frozen connection and ran a 5,000-connection
            # freeze out of descriptors.)
            await self.gate.wait_open()
            if self.owner.wants_copy(self.stream):
                return False  # a toxic arrived while parked: these bytes go through it
            try:
                pipe = pool.take()
            except OSError as exc:
                self.owner.log_event(
                    "splice_fallback", stream=self.stream, reason=exc.strerror or str(exc)
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
                        n -= await self._write_some(
                            functools.partial(os.splice, pipe[0], dst, n, flags=_SPLICE_FLAGS)
                        )
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
                    await self.owner.chain(self.stream).send(data, t_read, self)
            while True:
                changed = self.owner.chain_changed  # taken before offering: no lost wakeup
                await self.owner.chain(self.stream).send_eof(self)
                if self.eof_forwarded:
                    break
                # A toxic held the EOF (timeout does): offer it again whenever the chain
                # changes, so removing that toxic lets the FIN through.
                await changed.wait()
