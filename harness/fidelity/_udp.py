"""The UDP rows: faultnet.udp's modes held against the kernel's own, on datagrams.

The same table shape as the TCP rows (:func:`harness.fidelity._cases._row`), run by the
same runner and judged by the same checks: a client sends numbered datagrams to a UDP
echo server (a process of its own: :func:`~harness.fidelity._world.udp_echo_server`),
once straight to it under the kernel's fault (nftables on the server's port, or
SIGSTOP) and once through a :class:`~faultnet.udp.UdpProxy` in the mode.

* loss: the share of requests left unanswered (a request or its answer dropped), judged
  within the binomial bound, against nft dropping that share of datagrams both ways;
* freeze: nothing answered during the fault, everything after, in order, against
  SIGSTOP of the server (its datagrams wait in its socket, answered on SIGCONT);
* blackhole: nothing answered during the fault nor after, a new request answered,
  against nft dropping every datagram both ways.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from harness.fidelity._cases import Case, Client, Reference, Servers, Side, _row
from harness.fidelity._observe import Observation
from harness.fidelity._world import HOST

__all__ = ["UDP_CASES"]

#: The lossy requests: how many a side sends, how far apart (paced, so neither the
#: proxy's socket nor the server's ever overflows: a drop must be the fault's), and the
#: time an answer is given after the last request. 600 a side at the kernel's 36 %
#: (20 % each way) put the binomial bound on the share at 0.09
#: (harness.fidelity._observe.SHARE_Z); one-way 20 % is 0.16 away.
LOSS_REQUESTS, LOSS_SPACING_S, ANSWER_GIVEN_S = 600, 0.0005, 0.5
#: The held requests (freeze, blackhole): how many are sent during the fault, and how
#: long the client listens during it and after the undo.
HELD_REQUESTS, LISTEN_S = 10, 0.5


class _Answers:
    """A UDP client socket connected to *port*, and a thread that notes each answer's
    sequence number and arrival time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((HOST, port))
        self.sock.settimeout(0.05)
        self.seen: list[tuple[int, float]] = []
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._done.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # ECONNREFUSED from an earlier send, or closed
                if self.sock.fileno() < 0:
                    return
                continue
            self.seen.append((int(data.split(b" ")[0]), time.monotonic()))

    def send(self, seq: int) -> None:
        self.sock.send(f"{seq} request".encode())

    def since(self, first: int) -> list[int]:
        """The sequence numbers answered, from *first* on, in arrival order."""
        return [seq for seq, _ in list(self.seen) if seq >= first]

    def wait(self, first: int, count: int, bound: float) -> None:
        """Until *count* answers from *first* on, or *bound* seconds (an event with a
        bound, polled: the reader thread notes answers as they come)."""
        deadline = time.monotonic() + bound
        while len(self.since(first)) < count and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        self._done.set()
        self.sock.close()
        self._reader.join(1)


def lossy_requests(side: Side, servers: Servers) -> Observation:
    """:data:`LOSS_REQUESTS` datagrams, :data:`LOSS_SPACING_S` apart, under the fault;
    each answer given :data:`ANSWER_GIVEN_S` after the last. Counted: the unanswered."""
    c = _Answers(side.port)
    try:
        c.send(0)
        c.wait(0, 1, 2.0)  # the path works (and the proxy's session exists) first
        side.fault()
        t0 = time.monotonic()
        for i in range(1, LOSS_REQUESTS + 1):
            pause = t0 + i * LOSS_SPACING_S - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the requests' own pace
            c.send(i)
        c.wait(1, LOSS_REQUESTS, ANSWER_GIVEN_S)
        answered = len(set(c.since(1)))
    finally:
        c.close()
    return Observation(
        "some answered" if answered else "none answered",
        None,
        tries=LOSS_REQUESTS,
        counts={"unanswered": LOSS_REQUESTS - answered},
        tries_of="requests",
        seconds_of="time (not judged)",
        detail=f"{LOSS_SPACING_S * 1e6:g} us apart, answers given {ANSWER_GIVEN_S:g} s",
    )


def held_requests(side: Side, servers: Servers) -> Observation:
    """A request answered; the fault; :data:`HELD_REQUESTS` requests and
    :data:`LISTEN_S` of listening; the undo, and as long again for their answers; then
    a new request. The time: from the undo to the last of the held ones' answers."""
    c = _Answers(side.port)
    try:
        c.send(0)
        c.wait(0, 1, 2.0)
        side.fault()
        for i in range(1, HELD_REQUESTS + 1):
            c.send(i)
        c.wait(1, HELD_REQUESTS, LISTEN_S)
        during = len(c.since(1))
        side.undo()
        t0 = time.monotonic()
        c.wait(1, HELD_REQUESTS, LISTEN_S)
        after = c.since(1)
        last = max((t for seq, t in list(c.seen) if seq >= 1), default=None)
        new = HELD_REQUESTS + 1
        c.send(new)
        c.wait(new, 1, 2.0)
        fresh = "answered" if c.since(new) else "unanswered"
    finally:
        c.close()
    order = "in order" if after == sorted(after) else "out of order"
    return Observation(
        f"{during} answered during the fault; after the undo {len(after)} of"
        f" {HELD_REQUESTS}{', ' + order if after else ''}; a new request {fresh}",
        None if last is None or not after else max(0.0, last - t0),
    )


UDP_REQUESTS = Client(
    f"UDP, {LOSS_REQUESTS} requests {LOSS_SPACING_S * 1e6:g} us apart",
    "20 % both ways",
    "udp",
    lossy_requests,
)
UDP_HELD = Client(
    f"UDP, {HELD_REQUESTS} requests during the fault",
    "then the undo, and a new request",
    "udp",
    held_requests,
)


def _udp_pid(servers: Servers) -> int:
    assert servers.udp_pid is not None
    return servers.udp_pid


UDP_DEAD = Reference("nft drop of datagrams both ways", lambda kf, _: kf.drop_both_ways())
UDP_LOSS = Reference(
    "nft numgen random mod 100 < 20 drop of datagrams, both ways",
    lambda kf, _: kf.random_drop(20),
)
UDP_SIGSTOP = Reference(
    "SIGSTOP of the UDP server (an application hang)",
    lambda _, s: os.kill(_udp_pid(s), signal.SIGSTOP),
    lambda _, s: os.kill(_udp_pid(s), signal.SIGCONT),
)

# One row a pair, as CASES: the mode, faultnet's arguments, the client, the kernel's fault.
UDP_CASES: tuple[Case, ...] = (
    _row("loss", {"percent": 20}, UDP_REQUESTS, UDP_LOSS, protocol="udp"),
    _row("freeze", {}, UDP_HELD, UDP_SIGSTOP, protocol="udp"),
    _row("blackhole", {}, UDP_HELD, UDP_DEAD, protocol="udp"),
)
