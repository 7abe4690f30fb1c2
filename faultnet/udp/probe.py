"""One UDP datagram out, the first reply classified.

``udp_probe(addr, timeout)`` sends exactly one datagram from a fresh socket connected to
*addr* and says what came back:

* ``answered`` -- a datagram arrived within *timeout* (its size and whether it echoed
  the probe are reported: an echo server proves the payload crossed intact);
* ``refused`` -- ECONNREFUSED: an ICMP port unreachable came back, nothing listens (on
  loopback within a millisecond);
* ``silent`` -- nothing at all within *timeout*: the datagram, or its answer, was dropped
  or held somewhere, or the service ignores it.

UDP has no handshake, so ``silent`` is all a dropped datagram ever looks like: a probe
cannot tell a dead route from a service that does not answer this payload. Send a
payload the service answers (``payload=``, e.g. a DNS query) when it is not an echo.
Other errors (unreachable, bad address) raise :class:`OSError`.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import trio

from faultnet.addresses import format_address
from faultnet.probe import Outcome

__all__ = ["UdpProbeKind", "UdpProbeResult", "udp_probe"]


class UdpProbeKind(StrEnum):
    ANSWERED = "answered"
    REFUSED = "refused"
    SILENT = "silent"


@dataclass(frozen=True)
class UdpProbeResult(Outcome[UdpProbeKind]):
    sent_bytes: int
    #: The first reply (``None`` unless answered).
    reply: bytes | None = None
    #: The reply is exactly what was sent (an echo server proves an intact crossing).
    echoed: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        if self.reply is not None:
            text += f" ({len(self.reply)} bytes{', an echo' if self.echoed else ''})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "address": format_address(self.address),
            "elapsed_s": self.elapsed_s,
            "sent_bytes": self.sent_bytes,
            "reply_bytes": None if self.reply is None else len(self.reply),
            "echoed": self.echoed,
        }


def probe_payload() -> bytes:
    """The default probe payload: recognisable, and unique so a late reply to an earlier
    probe is never taken for this one's."""
    return b"faultnet udp probe " + os.urandom(8).hex().encode()


async def udp_probe(
    address: tuple[str, int], timeout: float = 1.0, payload: bytes | None = None
) -> UdpProbeResult:
    """Send one datagram to *address*, wait at most *timeout* seconds for the first
    reply, and classify. A reply that is not an echo of *payload* still counts as
    ``answered`` (with ``echoed`` False)."""
    host, port = address
    data = probe_payload() if payload is None else payload
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_DGRAM)
    start = time.perf_counter()
    try:
        await sock.connect((host, port))
        start = time.perf_counter()
        with trio.move_on_after(timeout):
            try:
                await sock.send(data)
                reply = await sock.recv(65536)
            except ConnectionRefusedError:
                return UdpProbeResult(
                    UdpProbeKind.REFUSED, address, time.perf_counter() - start, len(data)
                )
            return UdpProbeResult(
                UdpProbeKind.ANSWERED,
                address,
                time.perf_counter() - start,
                len(data),
                reply,
                echoed=reply == data,
            )
        return UdpProbeResult(UdpProbeKind.SILENT, address, time.perf_counter() - start, len(data))
    finally:
        sock.close()
