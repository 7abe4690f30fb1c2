"""The thread data plane: one OS thread forwards every connection's bytes (pure Python).

It implements :mod:`faultnet.planes`' interface; what follows is how.

Theory of operation
-------------------

Per message, trio's scheduler costs ~12 us of CPU (run loop, task switches,
rescheduling); a plain-Python epoll loop forwards a 64-byte round trip for socat's ~19 us
(issue 14). So the bytes move on one OS thread that owns a private, level-triggered epoll
with persistent registrations, and trio only hears about what it must act on.

**The gate under a lock.** Each direction of a connection is a :class:`Lane` with an
``open`` flag (its gate) and a byte counter. The thread reads the gate and makes the
byte-moving syscall (recv, send, splice, shutdown) while holding the plane's one
``lock``, and counts what moved before letting go. Every fault operation (freeze, thaw,
end, toxic handover) takes the same lock. So when :meth:`Link.freeze` returns, the thread
is not inside a syscall for that lane, and it will look at the gate before its next one:
the freeze is total, and the counter is final, the instant it returns. (Measured: with
the gate check skipped, or without the lock, 128-828 bytes crossed a frozen link in the
stress test, tests/faultnet/test_freeze_stress.py.) The lock is held for one socket's
work at a time, bounded by :data:`_FAIR_OPS` syscalls, so a fault waits microseconds.

**Reads.** A small read is copied through one reused 64 KiB buffer and written at once
(readv + write on the descriptors: 2 syscalls per message, no bytes allocated but the
held remainder; the common case is inlined in the thread's loop, see ``_forward``). A read
that fills the buffer means a burst: the lane switches to splice through a pipe lent for
the burst, until a splice comes back short. What ``dst`` does not take is held in the
lane (copied bytes, or bytes left in the pipe) and the lane waits for EPOLLOUT on ``dst``
instead of reading: back-pressure, at most one read's worth held per lane.

**Interest.** A socket's interest is EPOLLIN while the lane reading it may read (gate
open, nothing held, no EOF yet) and EPOLLOUT while the lane writing to it holds bytes.
It is recomputed, under the lock, after every change the thread makes and by thaw; a
socket with no interest is unregistered (level-triggered EPOLLHUP on a socket we are not
reading would spin). Freeze only closes gates: a frozen socket leaves the interest set
when the thread is next woken for it. A lane parked by a freeze is re-armed
synchronously by thaw: :meth:`Link.thaw` registers its interest again before it returns.

**Toward trio.** The thread never touches a trio object. It appends events (a peer
reset, the connection finished, chunks read for a toxic chain, held bytes drained) to an
outbox under the lock and, once per epoll batch, asks trio to deliver them with
``TrioToken.run_sync_soon``; delivery calls each link's ``on_event(kind, stream)`` in the
trio thread. Half-close state is plain attributes trio reads directly; the byte counters
are read under the lock (:meth:`Link.counts`), so they cover every byte sent.

**Not waiting for the thread.** :meth:`Plane.add` moves what already arrived on a new
connection in the calling thread, and :meth:`Plane.settle` (which faults call before
counting connections) handles, in the calling thread and under the lock, whatever epoll
reports ready now. Under load the thread's wake-up can come milliseconds late; without
these a probe closed just before a fault was still counted (10 of 30 runs of
test_fault_modes_through_the_api; trio's pumps, which run in trio's own loop, 0 of 12).

**Toxics.** A lane with a toxic chain is handed to trio (:meth:`Link.to_trio`): the
thread still reads it (gate first, under the lock) into the lane's inbox, each chunk
stamped with the time it was read, up to :data:`_INBOX_BYTES`, and trio's one task for that lane runs the chain and writes
with :meth:`Link.offer` (gate, then send, under the lock; what the socket does not take
is handed to the thread). No reader task and no channel per chunk. When the lane's
chain is empty again, trio hands it back (:meth:`Link.to_plane`) once it has taken
every chunk: the thread forwards it by itself again, through the common case.

**Setting up.** :meth:`Plane.add` may take the upstream socket while its
non-blocking connect is under way (``connect_timeout=``). On loopback the handshake is
done before ``connect()`` returns, so ``add`` looks at the socket's TCP state and, when
it is established (or the connect already failed), goes on at once in the calling
thread; otherwise the link waits, reading nothing, for EPOLLOUT on the upstream socket
(then SO_ERROR says how the connect ended) or for its deadline, whichever comes first.
A failed or timed-out connect ends the link with an UPSTREAM_FAILED event. So no trio
task exists per connection: trio accepts, starts the connect and hears back only when
the link ends. (Measured under churn, connect + one round trip + close: the trio
thread's CPU per connection 460-530 us with a task that awaited trio's connect, 290-330
us without; scripts/bench churn, connections/s, 1.0-1.1x socat's -> 1.35-1.66x.)

**What a message costs (measured, issue 14).** Three syscalls a message (epoll_wait, readv,
write; socat makes nine, six of them failing recvfrom). callgrind: ~16,600 user-space
instructions per 64-byte round trip, ~12,000 of them inside the three calls' C wrappers,
each paying ~1,000 for CPython to release and retake the GIL around its syscall; the
loop's own Python ~4,600; socat ~3,400. On one CPU that comes out at socat's CPU per
round trip, and an added RTT 0.96-1.24x socat's from run to run. Measured against it in
the same runs: a thread per direction blocking in readv, 0.98-1.18x (this plane
1.03-1.10x); this plane under CPython 3.13, 1.01-1.03x (under 3.11 0.99-1.00x). A
scratch forwarding loop in C under the same kind of lock: 0.72-0.75x (this plane
0.99-1.14x). What stands between this loop and a clear lead is the interpreter.

**Rerouting.** :meth:`Link.reroute` (the internal hop of two-way loss) swaps a live
link's server socket for another under the lock: the old one leaves the epoll and the
fd table, the new one takes its place in both lanes, and what it already holds moves at
once, as in :meth:`Plane.add`.

**Descriptors.** Only the trio side closes sockets, and only after :meth:`Link.end`
(which unregisters them under the lock) or the ``done`` event; the thread forgets a
link's descriptors before either, so it never makes a syscall on a reused number.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

from faultnet.planes import (
    CHUNKS,
    DONE,
    DRAINED,
    ERROR,
    RESET,
    UPSTREAM_FAILED,
    LinkBase,
    Pipelines,
    Stage,
    Words,
    freeze_each,
    thaw_each,
)
from faultnet.planes._pipes import SPLICE_CHUNK, PipePool
from faultnet.sockopts import tcp_state

if TYPE_CHECKING:
    import trio

__all__ = ["AVAILABLE", "Lane", "Link", "Plane"]

#: Bytes per copied read; a read that fills it starts a splice burst.
COPY_CHUNK = 64 * 1024
#: Syscalls one socket may make per epoll wake-up before the others get a turn (level
#: triggered: it is offered again at the next poll).
_FAIR_OPS = 16
#: Bytes a toxic lane's reader may run ahead of trio's chain, each chunk costing its
#: length plus _CHUNK_COST (the native plane's bound: see INBOX_BYTES in _native.c).
_INBOX_BYTES = 1024 * 1024
_CHUNK_COST = 64
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_MAX_EVENTS = 256

#: The interface is faultnet.planes'; this plane always runs (pure Python).
AVAILABLE = True

#: tcpi_state of a socket whose connect is still waiting for the SYN-ACK.
_TCP_SYN_SENT = 2


class _Failed(Exception):
    """A syscall failed in a way only a reset can pass on."""


class _Stopped(Exception):
    """:meth:`Plane.stop` woke the thread: it returns."""


class Lane:
    """One direction of one link: bytes from ``src`` to ``dst``.

    Every field is written under the plane's lock; trio may read ``eof_forwarded``
    without it (one attribute read). ``bytes`` lags the send that moved them until the
    thread has the GIL again: read it with :meth:`Link.counts`.
    """

    __slots__ = (
        "burst",
        "bytes",
        "dst",
        "dst_fd",
        "eof_forwarded",
        "eof_pending",
        "eof_read",
        "held",
        "inbox",
        "inbox_bytes",
        "notified",
        "open",
        "pipe",
        "piped",
        "src",
        "src_fd",
        "stream",
        "to_trio",
        "waiting",
    )

    def __init__(self, stream: str, src: socket.socket, dst: socket.socket) -> None:
        self.stream = stream
        self.src = src
        self.dst = dst
        #: The descriptors the thread reads and writes (os.readv/os.write/os.splice).
        self.src_fd = src.fileno()
        self.dst_fd = dst.fileno()
        self.open = True
        #: Bytes written to dst: what crossed the proxy.
        self.bytes = 0
        self.held: memoryview | None = None
        self.pipe: tuple[int, int] | None = None
        self.piped = 0
        self.burst = False
        self.eof_read = False
        #: The EOF must be forwarded once what is held has been written.
        self.eof_pending = False
        self.eof_forwarded = False
        self.to_trio = False
        #: Chunks read for trio, each with the time.monotonic() (CLOCK_MONOTONIC) of its
        #: read, and their cost against _INBOX_BYTES.
        self.inbox: deque[tuple[bytes, float]] = deque()
        self.inbox_bytes = 0
        self.notified = False
        self.waiting = False

    def wants_read(self) -> bool:
        if not self.open or self.eof_read or self.held is not None or self.piped:
            return False
        return not self.to_trio or self.inbox_bytes < _INBOX_BYTES

    def wants_write(self) -> bool:
        return self.open and (self.held is not None or self.piped > 0)


class Link(LinkBase["Plane", Lane]):
    """One connection in the plane: two lanes, ``upstream`` (client to server) and
    ``downstream``. Made by :meth:`Plane.add`; every method acts under the lock and
    returns at once."""

    # Each starts as the class's, and is set on the link (under the lock) when it changes.
    #: The upstream connect is under way: nothing is read, the upstream socket waits
    #: for EPOLLOUT (see "Setting up" in the module docstring).
    connecting = False
    ended = False
    errno = 0

    def _lanes_of(self, fd: int) -> tuple[Lane, Lane]:
        """(the lane reading fd, the lane writing to it)."""
        up, down = self.lanes["upstream"], self.lanes["downstream"]
        return (up, down) if fd == self.fds[0] else (down, up)

    # -- fault operations (trio thread) --

    def freeze(self, streams: Iterable[str]) -> None:
        """Close the gates: total on return (no syscall of these lanes is in progress
        and none starts; their counters are final).

        Only flags change here: the thread takes a frozen socket out of its interest the
        next time it is woken for it (one wasted wake-up per socket that turns readable
        while frozen), so a freeze of thousands of idle connections makes no syscall.
        """
        with self.plane.lock:
            for s in streams:
                self.lanes[s].open = False

    def thaw(self, streams: Iterable[str]) -> None:
        """Open the gates and re-arm the parked lanes before returning."""
        with self.plane.lock:
            for s in streams:
                lane = self.lanes[s]
                lane.open = True
                if self.ended:
                    continue
                try:
                    self.plane._maybe_eof(self, lane)  # an EOF due once nothing is held
                except _Failed as exc:
                    self.plane._fail(self, lane, exc.args[0])
            self.plane._rearm(self)

    def end(self) -> bool:
        """Take the link out of the plane (the caller then closes its sockets). False if
        it had already ended."""
        with self.plane.lock:
            return self.plane._end(self)

    def counts(self) -> tuple[int, int]:
        """Bytes forwarded (upstream, downstream), under the lock: every byte a peer
        can have read is counted. (Read without it, a client that had its echo could
        see the downstream count still 0: the thread had sent but not yet counted, its
        GIL turn to come.)"""
        with self.plane.lock:
            return self.lanes["upstream"].bytes, self.lanes["downstream"].bytes

    def eof_forwarded(self, stream: str) -> bool:
        return self.lanes[stream].eof_forwarded

    def on_toxic_path(self, stream: str) -> bool:
        return self.lanes[stream].to_trio

    def holding(self, stream: str) -> bool:
        """Whether *stream* holds bytes read and not yet written (under the lock)."""
        with self.plane.lock:
            lane = self.lanes[stream]
            return lane.held is not None or lane.piped > 0 or bool(lane.inbox)

    # -- the toxic path (trio thread) --

    def to_trio(self, stream: str) -> None:
        """From now on bytes read on *stream* go to trio's chain (:meth:`take`), and
        trio writes them with :meth:`offer`. Bytes already read keep going out."""
        with self.plane.lock:
            self.lanes[stream].to_trio = True

    def to_plane(self, stream: str) -> bool:
        """Back from trio to the thread: False (nothing changed) while chunks read for
        trio wait in the inbox (take them first); else the lane forwards by itself again
        at once: what trio's last offer left held goes out first, then what the socket
        has, moved here as :meth:`Plane.add` does (the thread may not be woken for it)."""
        with self.plane.lock:
            lane = self.lanes[stream]
            if lane.inbox:
                return False
            lane.to_trio = lane.waiting = lane.notified = False
            if not self.ended and not self.connecting:
                self.plane._service([lane.src_fd])
            return True

    def set_stages(
        self, stream: str, stages: Sequence[Stage], words: Sequence[int | None] = ()
    ) -> bool:
        """This plane compiles no stage: False for any, so the chain stays in trio."""
        return not stages

    def stage_words(self, stream: str) -> list[int | None]:
        return []

    def take(self, stream: str) -> list[bytes]:
        """The chunks read for trio so far (b"" is the EOF), and re-arm the reader."""
        return [data for data, _ in self.take_timed(stream)]

    def take_timed(self, stream: str) -> list[tuple[bytes, float]]:
        """As :meth:`take`, each chunk with the CLOCK_MONOTONIC time the thread read it."""
        with self.plane.lock:
            lane = self.lanes[stream]
            chunks = list(lane.inbox)
            lane.inbox.clear()
            lane.inbox_bytes = 0
            lane.notified = False
            if chunks and not self.ended:
                self.plane._rearm(self)
            return chunks

    def offer(self, stream: str, data: bytes | memoryview) -> bool:
        """Write *data* to the lane's ``dst`` (gate first, under the lock); what the
        socket does not take is handed to the thread. False (nothing done) while the gate
        is closed or earlier bytes are still held, copied or in the lane's pipe (a lane
        that was bursting by splice when it was handed over): wait for thaw or DRAINED,
        offer again.
        Raises ConnectionError if the link has ended or the write failed."""
        with self.plane.lock:
            lane = self.lanes[stream]
            if self.ended:
                raise ConnectionResetError(self.errno or errno.EBADF, "link ended")
            if not lane.open or lane.held is not None or lane.piped:
                lane.waiting = True
                return False
            try:
                self.plane._send(lane, memoryview(data))
            except _Failed as exc:
                self.plane._fail(self, lane, exc.args[0])
                raise ConnectionResetError(self.errno, os.strerror(self.errno)) from None
            lane.waiting = lane.held is not None
            self.plane._rearm(self)
            return True

    def offer_eof(self, stream: str) -> bool:
        """Forward the EOF after what is held (a FIN, the other way kept open). False
        while the gate is closed: wait for thaw and offer again."""
        with self.plane.lock:
            lane = self.lanes[stream]
            if self.ended or lane.eof_forwarded:
                return True
            if not lane.open:
                lane.waiting = True
                return False
            lane.eof_pending = True
            try:
                self.plane._maybe_eof(self, lane)
            except _Failed as exc:
                self.plane._fail(self, lane, exc.args[0])
            return True

    def reroute(self, sock: socket.socket) -> int | None:
        """Relay through *sock* in place of the server's socket (see
        :meth:`faultnet.planes.Link.reroute`): under the lock, so the thread is not
        mid-syscall on either; what *sock* has already moves now, here."""
        with self.plane.lock:
            if self.ended or self.connecting:
                return None
            written = self.lanes["upstream"].bytes
            self.plane._reroute(self, sock)
            return written


class Plane:
    """The forwarding thread, its epoll, and the lock every fault operation takes.

    ``start(token)`` from trio (events are delivered through *token*), ``stop()`` to
    end the thread; links still in the plane are left to their owners to end.
    """

    name = "thread"
    #: It compiles no stage: every chain runs in trio.
    stages: frozenset[str] = frozenset()

    def __init__(self, splice: bool = True) -> None:
        self.lock = threading.Lock()
        self._pipes = PipePool()
        self._splice = splice and hasattr(os, "splice")
        self._ep = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep.register(self._wake, _IN)
        #: fd -> (its link, the lane reading it, the lane writing to it)
        self._fds: dict[int, tuple[Link, Lane, Lane]] = {}
        self._mask: dict[int, int] = {}
        self._buf = bytearray(COPY_CHUNK)
        self._bufs = [self._buf]  # os.readv's list of buffers
        self._view = memoryview(self._buf)
        self._outbox: list[tuple[Link, str, str | None]] = []
        #: (deadline, ticket, link) of the links still connecting (a link that stopped
        #: connecting stays until its deadline comes up, and is skipped then).
        self._deadlines: list[tuple[float, int, Link]] = []
        self._ticket = itertools.count()
        self._scheduled = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self, token: object) -> None:
        """Start the thread; events reach trio through *token* (``trio.lowlevel.
        current_trio_token()``)."""
        self._token = cast("trio.lowlevel.TrioToken", token)
        self._thread = threading.Thread(target=self._run, name="faultnet-dataplane", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (at its next wake-up, which this causes) and wait for it.
        Links still in the plane stay their owners' to end (no syscall is made for them
        any more)."""
        self._stopping = True
        os.eventfd_write(self._wake, 1)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._ep.close()
        os.close(self._wake)
        self._pipes.close()

    def add(
        self,
        client: socket.socket,
        server: socket.socket,
        on_event: Callable[[str, str | None], None],
        frozen: Iterable[str] = (),
        to_trio: Iterable[str] = (),
        connect_timeout: float | None = None,
    ) -> Link:
        """Start forwarding between two non-blocking sockets. *frozen* lanes start with
        their gate closed, *to_trio* lanes on the toxic path.

        With *connect_timeout* (seconds), *server*'s connect is still under way (it
        returned EINPROGRESS): forwarding starts once it completes; if it fails, or has
        not completed within the timeout, the link ends with UPSTREAM_FAILED (errno
        ETIMEDOUT for the timeout). Without it, both sockets are connected."""
        link = Link(self, client, server, on_event, Lane)
        with self.lock:
            for s in frozen:
                link.lanes[s].open = False
            for s in to_trio:
                link.lanes[s].to_trio = True
            for fd in link.fds:
                self._fds[fd] = (link, *link._lanes_of(fd))
                self._mask[fd] = 0
            if connect_timeout is not None:
                link.connecting = True
                try:
                    # Loopback: the handshake is over before connect() returns.
                    state = tcp_state(server)
                except OSError:
                    state = 0
                if state == _TCP_SYN_SENT:
                    deadline = time.monotonic() + connect_timeout
                    heapq.heappush(self._deadlines, (deadline, next(self._ticket), link))
                    self._rearm(link)
                    os.eventfd_write(self._wake, 1)  # the thread's poll must time out
                    return link
                self._connected(link)
            else:
                # What already arrived moves now, in this thread: a client that sent its
                # request (or its FIN) while the upstream connect was under way is served
                # without waiting for the thread's wake-up (2 recv()s returning EAGAIN).
                self._service(link.fds)
                self._rearm(link)
        return link

    def freeze(self, links: list[Link], streams: Iterable[str]) -> tuple[int, int]:
        """Each link's :meth:`Link.freeze`, then its counts, summed (a lock per link:
        the lock is not reentrant, and the stress test's breakage replaces
        ``Link.freeze``)."""
        return freeze_each(links, streams)

    def thaw(self, links: list[Link], streams: Iterable[str]) -> None:
        """Each link's :meth:`Link.thaw` (a lock per link, as :meth:`freeze`)."""
        thaw_each(links, streams)

    def set_stages(
        self, links: list[Link], stream: str, pipelines: Pipelines, words: Words
    ) -> None:
        """No pipeline but the empty one (see :meth:`faultnet.planes.Plane.set_stages`)."""
        for forms in pipelines:
            if forms:
                raise ValueError(f"the thread plane runs no {forms[0][0]!r} stage")

    def settle(self) -> None:
        """Move, in the calling thread, whatever is ready now (one epoll_wait that does
        not wait). Faults call it before counting connections, so a connection whose
        last FIN already sits in a socket is seen ended, as a trio task would have
        seen it by then (the thread's wake-up can come later under load)."""
        with self.lock:
            self._service([fd for fd, _ in self._ep.poll(0, _MAX_EVENTS)])

    # -- under the lock --

    def _rearm(self, link: Link) -> None:
        if link.ended:
            return
        for fd in link.fds:
            reading, writing = link._lanes_of(fd)
            if link.connecting:  # only the upstream socket, for its connect's outcome
                mask = _OUT if fd == link.fds[1] else 0
            else:
                mask = (_IN if reading.wants_read() else 0) | (_OUT if writing.wants_write() else 0)
            old = self._mask[fd]
            if mask == old:
                continue
            if not old:
                self._ep.register(fd, mask)
            elif not mask:
                self._ep.unregister(fd)
            else:
                self._ep.modify(fd, mask)
            self._mask[fd] = mask

    def _reroute(self, link: Link, sock: socket.socket) -> None:
        """:meth:`Link.reroute` (lock held): the server's socket leaves the epoll and the
        table untouched, *sock* takes its place in both lanes."""
        old, fd = link.fds[1], sock.fileno()
        if self._mask.pop(old, 0):
            self._ep.unregister(old)
        self._fds.pop(old, None)
        up, down = link.lanes["upstream"], link.lanes["downstream"]
        up.dst, up.dst_fd = sock, fd
        down.src, down.src_fd = sock, fd
        down.burst = False  # the former socket's burst: what it piped still goes out
        link.fds = (link.fds[0], fd)
        self._fds[fd] = (link, down, up)
        self._mask[fd] = 0
        if up.eof_forwarded:  # its peer must see the FIN the server's socket was sent
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    self._fail(link, up, exc.errno)
                    return
        self._service((fd, link.fds[0]))
        self._rearm(link)

    def _end(self, link: Link) -> bool:
        if link.ended:
            return False
        link.ended = True
        for fd in link.fds:
            if self._mask.pop(fd, 0) and not self._ep.closed:  # closed: stop() was called
                self._ep.unregister(fd)
            self._fds.pop(fd, None)
        for lane in link.lanes.values():
            if lane.pipe is not None:
                self._pipes.discard(lane.pipe)
                lane.pipe = None
                lane.piped = 0
        return True

    def _post(self, link: Link, kind: str, stream: str | None) -> None:
        self._outbox.append((link, kind, stream))
        if not self._scheduled:
            self._scheduled = True
            try:
                assert self._token is not None  # started: see start()
                self._token.run_sync_soon(self._deliver)
            except Exception:  # trio.RunFinishedError: nobody is left to tell
                self._outbox.clear()

    def _fail(self, link: Link, lane: Lane, err: int | None) -> None:
        if self._end(link):
            link.errno = err or errno.ECONNRESET
            self._post(link, RESET, lane.stream)

    def _send(self, lane: Lane, view: memoryview) -> None:
        """Send what dst takes of *view* (gate checked by the caller); hold the rest."""
        try:
            n = os.write(lane.dst_fd, view)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            raise _Failed(exc.errno) from None
        lane.bytes += n
        if n < len(view):
            # Held bytes must outlive the shared buffer: copy them out.
            lane.held = memoryview(bytes(view[n:]))
        else:
            lane.held = None

    def _flush(self, link: Link, lane: Lane) -> None:
        """Write what the lane holds (gate open, lock held)."""
        if lane.held is not None:
            self._send(lane, lane.held)
        elif lane.piped:
            assert lane.pipe is not None
            try:
                m = os.splice(lane.pipe[0], lane.dst_fd, lane.piped, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                return
            except OSError as exc:
                raise _Failed(exc.errno) from None
            lane.bytes += m
            lane.piped -= m
            if not lane.piped:
                self._pipes.give(lane.pipe)
                lane.pipe = None
        if lane.held is None and not lane.piped:
            if lane.to_trio and lane.waiting:
                lane.waiting = False
                self._post(link, DRAINED, lane.stream)
            self._maybe_eof(link, lane)

    def _maybe_eof(self, link: Link, lane: Lane) -> None:
        if not lane.eof_pending or lane.held is not None or lane.piped or not lane.open:
            return
        # The flag first: trio reads it without the lock, and a peer that has read the
        # FIN must find it set (shutdown releases the GIL, so trio can run in between).
        lane.eof_forwarded = True
        try:
            lane.dst.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                lane.eof_forwarded = False  # no FIN went out
                raise _Failed(exc.errno) from None
        lane.eof_pending = False
        other = link.lanes["downstream" if lane.stream == "upstream" else "upstream"]
        if other.eof_forwarded and self._end(link):
            self._post(link, DONE, None)

    def _connected(self, link: Link) -> None:
        """The upstream connect of a connecting link has ended: start forwarding (what
        the client already sent moves now), or end the link with UPSTREAM_FAILED."""
        server = link.lanes["downstream"].src
        try:
            err = server.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except OSError as exc:
            err = exc.errno or errno.EBADF
        if err:
            self._upstream_failed(link, err)
            return
        link.connecting = False
        self._service(link.fds[:1])
        self._rearm(link)

    def _upstream_failed(self, link: Link, err: int) -> None:
        if self._end(link):
            link.errno = err
            self._post(link, UPSTREAM_FAILED, None)

    def _expire(self) -> float:
        """End the links whose connect is past its deadline; return the seconds until
        the next deadline (-1: none)."""
        now = time.monotonic()
        heap = self._deadlines
        while heap:
            deadline, _, link = heap[0]
            if link.connecting and not link.ended and deadline > now:
                return deadline - now
            heapq.heappop(heap)
            if link.connecting and not link.ended:
                self._upstream_failed(link, errno.ETIMEDOUT)
        return -1

    def _read(self, link: Link, lane: Lane) -> None:
        """Move what src has (gate open, nothing held, lock held)."""
        for _ in range(_FAIR_OPS):
            if lane.burst and not lane.to_trio:
                if not self._splice_once(link, lane):
                    return
                continue
            try:
                n = os.readv(lane.src_fd, self._bufs)
            except BlockingIOError:
                return
            except OSError as exc:
                raise _Failed(exc.errno) from None
            if not (self._for_trio if lane.to_trio else self._took)(link, lane, n):
                return

    def _for_trio(self, link: Link, lane: Lane, n: int) -> bool:
        """Queue the *n* bytes just read (0: the EOF) for trio's toxic chain. True if the
        socket may have more to read now."""
        # Stamped here, in the thread, at the read: the latency toxic counts from it.
        lane.inbox.append((bytes(self._view[:n]), time.monotonic()))
        lane.inbox_bytes += n + _CHUNK_COST
        if not lane.notified:
            lane.notified = True
            self._post(link, CHUNKS, lane.stream)
        if not n:
            lane.eof_read = True
            return False
        return n == COPY_CHUNK and lane.inbox_bytes < _INBOX_BYTES

    def _took(self, link: Link, lane: Lane, n: int) -> bool:
        """Pass on the *n* bytes just read into the buffer (0: the EOF). True if the
        socket may have more to read now."""
        if not n:
            lane.eof_read = lane.eof_pending = True
            self._maybe_eof(link, lane)
            return False
        self._send(lane, self._view[:n])
        if lane.held is not None:
            return False
        if n < COPY_CHUNK:
            return False  # a short read: the socket is almost surely empty
        lane.burst = self._splice
        return True

    def _splice_once(self, link: Link, lane: Lane) -> bool:
        """One splice in and out. True while the burst goes on."""
        if lane.pipe is None:
            try:
                lane.pipe = self._pipes.take()
            except OSError:  # out of descriptors: copy instead
                lane.burst = False
                return True
        r, w = lane.pipe
        try:
            n = os.splice(lane.src_fd, w, SPLICE_CHUNK, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            n = -1
        except OSError as exc:
            raise _Failed(exc.errno) from None
        if n <= 0:
            self._pipes.give(lane.pipe)
            lane.pipe = None
            lane.burst = False
            if n == 0:
                lane.eof_read = lane.eof_pending = True
                self._maybe_eof(link, lane)
            return False
        lane.piped = n
        self._flush(link, lane)
        if lane.piped:
            return False  # dst is full: wait for EPOLLOUT
        if n < SPLICE_CHUNK:
            lane.burst = False
            return False
        return True

    # -- the thread --

    def _run(self) -> None:
        """The thread's body: forward until :meth:`stop` wakes it."""
        try:
            self._forward()
        except _Stopped:
            return

    def _forward(self) -> None:
        # Per message, this loop is all the Python that runs: the common case (one small
        # read, written at once) is inlined here with every name a local or a slot, and
        # anything else goes to _handle. Measured (callgrind, 64-byte round trips through
        # the plane, the client's own work taken out): 24,200 instructions per round trip
        # when the common case sat two calls down on the socket methods, 16,600 now; on
        # one CPU the proxy's added RTT fell 0.8-1.6 us (~8 %) in the same runs. What is
        # not the common case (a wake-up, a failed or short write, connects' deadlines)
        # is a call away, so the loop stays within one function's bound (issue 37)
        # without adding a call to a message's path.
        ep, wake, fds, handle = self._ep, self._wake, self._fds, self._handle
        acquire, release = self.lock.acquire, self.lock.release
        readv, write, bufs, view = os.readv, os.write, self._bufs, self._view
        timeout = None
        while True:
            # epoll.poll retries EINTR itself (PEP 475), and this thread runs no signal
            # handler: it raises no InterruptedError.
            events = ep.poll(timeout, _MAX_EVENTS)
            for fd, _ in events:
                if fd == wake:
                    self._woken()
                    continue
                acquire()
                try:
                    entry = fds.get(fd)
                    if entry is None:
                        continue
                    link, reading, writing = entry
                    if not (
                        reading.open  # the gate, read under the lock
                        and reading.held is None
                        and writing.held is None
                        and not (reading.piped or writing.piped or reading.eof_read)
                        and not (reading.to_trio or reading.burst or link.connecting)
                    ):
                        handle(entry)
                        continue
                    # Nothing held either way before or after: the interest of both
                    # sockets stays as it is. os.readv/os.write, not the socket methods:
                    # the same syscalls without recv_into's keyword-argument parsing.
                    try:
                        n = readv(reading.src_fd, bufs)
                    except OSError as exc:
                        self._read_failed(link, reading, exc)
                        continue
                    if not 0 < n < COPY_CHUNK:  # an EOF or a full buffer
                        self._after_read(link, reading, n)
                        continue
                    try:
                        m = write(reading.dst_fd, view[:n])
                    except OSError as exc:
                        self._write_failed(link, reading, n, exc)
                        continue
                    reading.bytes += m
                    if m != n:
                        self._hold(link, reading, m, n)
                except Exception as exc:  # a bug: contained to its connection
                    self._contain(link, exc)
                finally:
                    release()
            timeout = self._next_timeout() if self._deadlines else None

    def _woken(self) -> None:
        """The wake-up eventfd fired: :meth:`stop` was called (raise :class:`_Stopped`),
        or :meth:`add` wants the poll's timeout computed again (the loop does that).

        The counter is read before the flag is looked at: :meth:`stop` sets the flag and
        then writes, so a stop whose flag this look misses wrote after the read and the
        poll wakes again. The other order lost a stop that came between the look and the
        read (its write consumed, the thread back in a poll with no timeout, the join
        waiting forever: a test's 120 s timeout under stress-ng)."""
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        if self._stopping:
            raise _Stopped

    def _next_timeout(self) -> float | None:
        """End the connects past their deadline; the poll's timeout until the next one
        (None: wait for an event only)."""
        with self.lock:
            left = self._expire()
        return left if left >= 0 else None

    def _read_failed(self, link: Link, lane: Lane, exc: OSError) -> None:
        """The common case's read failed (lock held): nothing to read after all, or a
        reset to pass on."""
        if not isinstance(exc, BlockingIOError):
            self._fail(link, lane, exc.errno)

    def _write_failed(self, link: Link, lane: Lane, n: int, exc: OSError) -> None:
        """The common case's write of the *n* bytes read failed (lock held): dst is
        full (hold them all), or a reset to pass on."""
        if isinstance(exc, BlockingIOError):
            self._hold(link, lane, 0, n)
        else:
            self._fail(link, lane, exc.errno)

    def _hold(self, link: Link, lane: Lane, m: int, n: int) -> None:
        """The common case wrote *m* of the *n* bytes in the buffer: hold the rest, and
        wait for dst instead of reading (lock held)."""
        lane.held = memoryview(bytes(self._view[m:n]))
        self._rearm(link)

    def _contain(self, link: Link, exc: Exception) -> None:
        """A bug met while handling *link*: end it with an ERROR event (lock held)."""
        if self._end(link):
            link.error = exc
            self._post(link, ERROR, None)

    def _service(self, fds: Iterable[int]) -> None:
        """Handle each ready fd (lock held)."""
        for fd in fds:
            entry = self._fds.get(fd)
            if entry is not None:
                try:
                    self._handle(entry)
                except Exception as exc:
                    self._contain(entry[0], exc)

    def _after_read(self, link: Link, lane: Lane, n: int) -> None:
        """The read of *n* bytes into the buffer (0: the EOF) that the common case does
        not cover: pass them on, and go on reading if the socket may have more."""
        try:
            self._took(link, lane, n)
        except _Failed as exc:
            self._fail(link, lane, exc.args[0])
            return
        self._read_on(link, lane)

    def _handle(self, entry: tuple[Link, Lane, Lane]) -> None:
        """One ready socket, in general: *reading* reads it, *writing* writes to it
        (lock held). Its connect's outcome, held bytes to write, then what to read."""
        link, reading, writing = entry
        if link.connecting:
            self._connected(link)
            return
        if writing.wants_write():
            try:
                self._flush(link, writing)
            except _Failed as exc:
                self._fail(link, writing, exc.args[0])
                return
        self._read_on(link, reading)

    def _read_on(self, link: Link, lane: Lane) -> None:
        """Read *lane* while it may (its link still in the plane), then re-arm the link's
        interest; a failed syscall fails the lane instead (lock held)."""
        try:
            if not link.ended and lane.wants_read():
                self._read(link, lane)
        except _Failed as exc:
            self._fail(link, lane, exc.args[0])
            return
        self._rearm(link)

    def _deliver(self) -> None:
        """In the trio thread: hand the batch of events to their links."""
        with self.lock:
            batch, self._outbox = self._outbox, []
            self._scheduled = False
        for link, kind, stream in batch:
            link.on_event(kind, stream)
