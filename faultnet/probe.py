"""One fresh connect, classified.

``probe(addr, timeout)`` makes exactly one TCP connect to *addr* and says what happened:

* ``connected`` -- the handshake completed (even if no byte will ever flow);
* ``refused`` -- ECONNREFUSED: nothing listens (typically within a millisecond);
* ``hung`` -- no answer within *timeout*: the SYN was dropped somewhere;
* ``reset`` -- the connect was reset (e.g. the listener closed with it queued).

A connect that timed out is closed at once: otherwise the kernel would finish the
handshake later, on a SYN retry, and the server would see a phantom connection.
Other errors (unreachable, bad address) raise :class:`OSError`.
"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

import trio

from faultnet.addresses import format_address

__all__ = ["Outcome", "ProbeKind", "ProbeResult", "probe"]

K = TypeVar("K", bound=StrEnum)


@dataclass(frozen=True)
class Outcome(Generic[K]):
    """What one probe saw, TCP's (:class:`ProbeResult`) or UDP's
    (:class:`faultnet.udp.probe.UdpProbeResult`): its kind, the address, and the seconds
    from the connect() call (TCP) or the send (UDP) to the outcome (the timeout, when
    nothing came)."""

    kind: K
    address: tuple[str, int]
    elapsed_s: float

    def __str__(self) -> str:
        return (
            f"{format_address(self.address)} {self.kind.value} after {self.elapsed_s * 1000:.1f} ms"
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        d["address"] = format_address(self.address)
        return d


class ProbeKind(StrEnum):
    CONNECTED = "connected"
    REFUSED = "refused"
    HUNG = "hung"
    RESET = "reset"


@dataclass(frozen=True)
class ProbeResult(Outcome[ProbeKind]):
    error: str | None = None


async def probe(
    address: tuple[str, int], timeout: float = 1.0, *, source: str | None = None
) -> ProbeResult:
    """Connect once to *address*, wait at most *timeout* seconds, and classify.
    *source*: the local address to connect from (e.g. 127.0.0.2, to be another peer)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    start = time.perf_counter()
    try:
        if source is not None:
            await sock.bind((source, 0))
        with trio.move_on_after(timeout):
            try:
                await sock.connect((host, port))
            except ConnectionRefusedError:
                return ProbeResult(ProbeKind.REFUSED, address, time.perf_counter() - start)
            except ConnectionResetError as exc:
                return ProbeResult(ProbeKind.RESET, address, time.perf_counter() - start, str(exc))
            except OSError as exc:
                if exc.errno == errno.ECONNRESET:
                    return ProbeResult(
                        ProbeKind.RESET, address, time.perf_counter() - start, str(exc)
                    )
                raise
            return ProbeResult(ProbeKind.CONNECTED, address, time.perf_counter() - start)
        return ProbeResult(ProbeKind.HUNG, address, time.perf_counter() - start)
    finally:
        sock.close()
