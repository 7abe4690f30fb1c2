"""Two lines of the benchmark for issue 12's modes: bulk throughput and the sender's
retransmits through faultnet at 0, 1 and 5 % segment loss (``loss``), and UDP datagrams
per second through the UDP proxy against a direct baseline, in the same run.

Loss is statistical (the kernel's random cannot be seeded), so the line reports what
happened: the sender's ``tcpi_total_retrans`` for each transfer, not an assumed count.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from harness.bench._children import Child, _self_argv
from harness.bench._stream import CHILD_START_S, HOST

__all__ = ["LOSS_APPLY_S", "LOSS_PERCENTS", "UdpArms", "udp_round_trips"]

#: The loss line's levels, percent of segments dropped in each direction.
LOSS_PERCENTS = (0, 1, 5)
#: How long the loss line waits for the proxy to have accepted a transfer's connection.
LOSS_APPLY_S = 5.0
#: Datagram payload of the UDP line (a DNS-query-sized request).
UDP_PAYLOAD = 64
#: Datagrams in flight at once: enough to keep both processes busy, well inside the
#: default socket buffers (212 KiB holds ~270 small datagrams with their overhead).
UDP_WINDOW = 32
#: A datagram not echoed within this long counts as lost (its window slot is refilled).
UDP_LOST_S = 1.0


def udp_round_trips(addr: tuple[str, int], count: int) -> dict[str, Any]:
    """Echo *count* datagrams of UDP_PAYLOAD bytes through *addr*, UDP_WINDOW in flight;
    return round trips per second and how many were lost or came back altered."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(addr)
    s.settimeout(UDP_LOST_S)
    payload = os.urandom(UDP_PAYLOAD)
    sent = back = lost = altered = 0
    t0 = time.perf_counter()
    try:
        while back + lost < count:
            while sent - back - lost < UDP_WINDOW and sent < count:
                s.send(payload)
                sent += 1
            try:
                data = s.recv(2048)
            except TimeoutError:
                lost = sent - back  # everything still in flight
                continue
            back += 1
            altered += data != payload
    finally:
        s.close()
    elapsed = time.perf_counter() - t0
    return {
        "datagrams": count,
        "seconds": elapsed,
        "per_s": back / elapsed if elapsed > 0 else None,
        "lost": lost,
        "altered": altered,
    }


class UdpArms:
    """A UDP echo upstream and a faultnet UDP proxy in front of it, each its own process
    (``--role udp-echo``, ``--role udp-proxy``); ``addrs`` maps direct/faultnet."""

    def __init__(self) -> None:
        self.echo = Child(_self_argv("--role", "udp-echo"), "UDP echo")
        self.proxy: Child | None = None
        try:
            port = int(self.echo.read_json(CHILD_START_S)["port"])
            self.proxy = Child(
                _self_argv("--role", "udp-proxy", "--upstream-port", str(port)),
                "faultnet UDP proxy",
            )
            hello = self.proxy.read_json(CHILD_START_S)
        except BaseException:
            self.stop()
            raise
        self.addrs = {"direct": (HOST, port), "faultnet": (HOST, int(hello["address"][1]))}

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.echo.stop()
