"""Socket options behind the fault modes (Linux), each measured in
``shared/reference/linux-faults.md``.

All functions take a plain or trio socket (anything with ``fileno()`` and
``setsockopt``) and act at once; none blocks.
"""

from __future__ import annotations

import ctypes
import fcntl
import resource
import socket
import struct
import termios
from collections.abc import Callable
from typing import Any, Protocol, overload

__all__ = [
    "TCP_STATES",
    "UNSENT_BOUND",
    "FilterDrops",
    "attach_drop_all",
    "bound_unsent",
    "flush_ack",
    "detach_filter",
    "filter_length",
    "raise_fd_limit",
    "set_keepalive",
    "set_linger_reset",
    "set_nodelay",
    "set_user_timeout",
    "socket_drops",
    "tcp_retransmits",
    "tcp_retransmits_needed",
    "tcp_segs_in",
    "tcp_state",
    "tcp_unacked",
    "unread_bytes",
]

SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
# One classic BPF instruction, BPF_RET|BPF_K with k=0: "accept 0 bytes", i.e. drop every
# packet. Unprivileged. On a listener it drops SYNs; on a connected socket it drops the
# peer's data AND ACKs, so the peer's TCP sees a dead route.
_DROP_ALL = struct.pack("HBBI", 0x06, 0, 0, 0)
_DROP_ALL_BUF = ctypes.create_string_buffer(_DROP_ALL, len(_DROP_ALL))
# struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padded to 16).
_FPROG = struct.pack("HxxxxxxQ", 1, ctypes.addressof(_DROP_ALL_BUF))

#: ``tcpi_state`` values (include/net/tcp_states.h) that matter here.
TCP_STATES = {1: "ESTABLISHED", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 4: "FIN_WAIT1"}


class _Sock(Protocol):
    def fileno(self) -> int: ...
    def setsockopt(self, level: int, opt: int, value: int | bytes, /) -> None: ...
    # Overloaded as socket.socket's is (no buflen: an int), so a plain socket fits.
    @overload
    def getsockopt(self, level: int, opt: int, /) -> int: ...
    @overload
    def getsockopt(self, level: int, opt: int, _buflen: int, /) -> bytes: ...


def attach_drop_all(sock: _Sock) -> None:
    """Drop every packet that reaches *sock* from now on (until :func:`detach_filter`)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _FPROG)


def detach_filter(sock: _Sock) -> None:
    """Remove the filter; ENOENT (none attached) is not an error."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    except OSError as exc:
        if exc.errno != 2:
            raise


def filter_length(sock: _Sock) -> int:
    """Instructions in the classic BPF filter on *sock* (0: none). Read with
    SO_GET_FILTER (the same number as SO_ATTACH_FILTER): given a buffer, the kernel
    returns as its length the filter's instruction count."""
    # 1024 bytes: Python's cap on getsockopt's buffer, room for 128 instructions.
    return len(sock.getsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, 1024))


def set_linger_reset(sock: _Sock) -> None:
    """Make the next ``close()`` send RST instead of FIN (SO_LINGER on, 0 s)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def set_nodelay(sock: _Sock) -> None:
    """Send each write at once (``TCP_NODELAY``): no Nagle, on both of a connection's
    proxy sockets. A toxic that splits a message into several writes (slicer, the HTTP
    toxics' partial writes) otherwise holds every piece after the first until the peer
    ACKs it, and a peer waiting for the rest of the message delays that ACK (~40 ms on
    Linux). Measured: request/response round trips of 1000 bytes through a slicer of
    100-byte pieces, median 44.0 ms per request with Nagle on the client socket, 0.25 ms
    without; with no toxic, or a latency toxic (one write per chunk), no difference."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_keepalive(sock: _Sock, idle_s: int, interval_s: int, count: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def set_user_timeout(sock: _Sock, ms: int) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)


def tcp_state(sock: _Sock) -> int:
    """The kernel's ``tcpi_state`` for *sock* (1 = ESTABLISHED, 8 = CLOSE_WAIT, ...)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


#: ``SO_MEMINFO`` (55): nine u32 counters; index 8 (SK_MEMINFO_DROPS) is ``sk_drops``.
_SO_MEMINFO = 55
#: Offsets in ``struct tcp_info`` (linux/tcp.h): ``tcpi_total_retrans`` (u32), and
#: ``tcpi_dsack_dups`` (u32, Linux 4.19 on), the retransmits the peer reported by D-SACK
#: as ones it already had.
_TCPI_TOTAL_RETRANS = 100
_TCPI_DSACK_DUPS = 216


def tcp_retransmits(sock: _Sock) -> int:
    """The segments *sock* itself has retransmitted (``tcpi_total_retrans``), the
    spurious ones included (see tcp_retransmits_needed)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_TOTAL_RETRANS + 4)
    return int(struct.unpack_from("I", info, _TCPI_TOTAL_RETRANS)[0])


def tcp_retransmits_needed(sock: _Sock) -> int:
    """The segments *sock* retransmitted that its peer did not already have: every
    retransmit less those the peer reported (D-SACK) as duplicates. This is the count
    that says loss was in force. The rest are spurious: on loopback segments can reach
    the receiver out of order (the same transfers counted reordering in
    ``tcpi_reord_seen``), and a sender that takes the gap for a loss resends.

    Measured through the proxy, 16 MiB transfers: with no loss at all, up to 66
    retransmits in one transfer, all reported back as duplicates but for one segment (a
    tail-loss probe) in 2 of 240 transfers; at 5 % loss, 7 to 21 retransmits, 0 or 1 of them
    duplicates. So judge loss with a small margin. A kernel before 4.19 has no D-SACK
    count: there this is every retransmit."""
    size = _TCPI_DSACK_DUPS + 4
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, size)
    total = int(struct.unpack_from("I", info, _TCPI_TOTAL_RETRANS)[0])
    if len(info) < size:
        return total
    return max(0, total - int(struct.unpack_from("I", info, _TCPI_DSACK_DUPS)[0]))


def socket_drops(sock: _Sock) -> int:
    """Segments the kernel dropped on their way into *sock* (``sk_drops``): those a
    socket filter refused, any dropped for want of buffer (rare on loopback), and the
    copies TCP discards as old data (a retransmission of what *sock* already had: its
    ACK was lost). A data segment a filter dropped is one the sender must retransmit."""
    mem = sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, 9 * 4)
    return int(struct.unpack_from("9I", mem)[8])


#: ``tcpi_segs_in`` (u32 at offset 140): every segment the socket took in, bare ACKs,
#: duplicates and probes included.
_TCPI_SEGS_IN = 140


def tcp_segs_in(sock: _Sock) -> int:
    """Segments *sock* has taken in (``tcpi_segs_in``): what a peer sent that arrived,
    whatever it carried. A dead route's far end takes in none."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_SEGS_IN + 4)
    return int(struct.unpack_from("I", info, _TCPI_SEGS_IN)[0])


#: ``tcpi_unacked`` (u32 at offset 24 of ``struct tcp_info``): segments sent and not yet
#: acknowledged by the peer, the ones the kernel would retransmit.
_TCPI_UNACKED = 24


def tcp_unacked(sock: _Sock) -> int:
    """Segments *sock* has sent that its peer has not acknowledged (``tcpi_unacked``):
    what the kernel retransmits if the peer's ACKs stop coming."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_UNACKED + 4)
    return int(struct.unpack_from("I", info, _TCPI_UNACKED)[0])


def unread_bytes(sock: _Sock) -> int:
    """Bytes the kernel has received on *sock* (and acknowledged) that nobody has read yet
    (``SIOCINQ``, which is ``FIONREAD``); 0 for a socket that is gone."""
    try:
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):  # closed (EBADF, or fileno -1)
        return 0
    return int(struct.unpack("i", got)[0])


def flush_ack(sock: _Sock) -> None:
    """Send at once an ACK *sock* owes its peer and has delayed (``TCP_QUICKACK``); the
    kernel does it when the receive queue is empty (else the ACK keeps its timer).
    Errors (a socket already closed or reset) are ignored: there is nothing to flush."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    except OSError:
        pass


#: The most a proxy socket holds unsent (``TCP_NOTSENT_LOWAT``): what a client can still
#: read after a freeze beyond its own receive queue. Without it the kernel let 3.9 MB per
#: connection through (12 slow readers behind a flooding server, the send queue grown to
#: its autotuned size); with it, at most this plus one write (the freeze-leak test).
UNSENT_BOUND = 128 * 1024
_TCP_NOTSENT_LOWAT = 25


def bound_unsent(sock: _Sock, nbytes: int = UNSENT_BOUND) -> None:
    """Let *sock* take writes only while less than *nbytes* of what it holds is unsent
    (``TCP_NOTSENT_LOWAT``; epoll reports it writable below half of that). Bytes in
    flight are not counted: the peer's receive window bounds those."""
    sock.setsockopt(socket.IPPROTO_TCP, _TCP_NOTSENT_LOWAT, nbytes)


class FilterDrops:
    """The segments a socket's filters dropped: ``sk_drops`` counted only while one of
    faultnet's filters is on it (:meth:`attached` .. :meth:`detached`).

    The kernel's one counter also takes drops for want of receive buffer (a gRPC
    connection with no fault at all showed 1 and 5 over 16 MB) and the duplicates TCP
    discards (see :func:`socket_drops`); counting only the windows a filter is in force
    keeps those out of a connection that had no fault, though those that happen under a
    filter are counted with it (under loss, a retransmission whose original arrived but
    whose ACK the filter dropped). *read* is :func:`socket_drops` (replaceable in
    tests)."""

    def __init__(self, read: Callable[[Any], int] | None = None) -> None:
        self._read = read or socket_drops
        self._total = 0
        self._since: int | None = None

    def attached(self, sock: Any) -> None:
        """A filter is on *sock* from now (a no-op if one already was)."""
        if self._since is None:
            self._since = self._read(sock)

    def detached(self, sock: Any) -> None:
        """No filter is on *sock* from now: what it dropped meanwhile is kept."""
        if self._since is not None:
            try:
                self._total += self._read(sock) - self._since
            except OSError:  # closed: the count up to here stands
                pass
            self._since = None

    def count(self, sock: Any) -> int:
        """The filters' drops so far (OSError if *sock* is closed while counting)."""
        if self._since is None:
            return self._total
        return self._total + self._read(sock) - self._since
