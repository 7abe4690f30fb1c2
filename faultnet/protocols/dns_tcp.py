"""DNS over TCP: the 2-byte length-prefixed frames of RFC 1035 4.2.2 on one connection,
each judged by a :class:`~faultnet.protocols.dns.DnsFaults` as a UDP datagram is (no
I/O, no clock).

A :class:`DnsTcpSession` is one connection's two streams. Bytes the client sends go in
(:meth:`~DnsTcpSession.queries`); out come the whole frames among them, each with its
:class:`~faultnet.protocols.dns.Decision`: forward the frame as it came (after
``delay_s``), answer the client with ``reply`` (framed here), or drop it. Bytes the
server sends go in (:meth:`~DnsTcpSession.answers`); out come the whole frames among
them, each as the client is to get it (changed when its query was truncated or
rewritten). A frame split across reads waits for its rest; several in one read are
judged one by one, in order. What is left at the end of a stream (an incomplete frame)
is :meth:`~DnsTcpSession.rest`, to be passed on as it came.

The messages are dnspython's to read and write (in :mod:`faultnet.protocols.dns`); only
the length prefix, two bytes in network order, is framed here.
"""

from __future__ import annotations

import struct
from dataclasses import replace

from faultnet.protocols.dns import Decision, DnsFaults

__all__ = ["DnsTcpSession", "Framer", "frame"]

_PREFIX = struct.Struct("!H")


def frame(message: bytes) -> bytes:
    """*message* with its length prefix (ValueError past 65,535 bytes, which a TCP DNS
    message cannot be)."""
    if len(message) > 0xFFFF:
        raise ValueError(f"a DNS message over TCP is at most 65535 bytes, not {len(message)}")
    return _PREFIX.pack(len(message)) + message


class Framer:
    """One stream's frames: bytes in, the messages completed by them out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The messages (without their prefix) that *data* completes, in order."""
        self._buffer += data
        messages: list[bytes] = []
        at = 0
        while len(self._buffer) - at >= 2:
            (size,) = _PREFIX.unpack_from(self._buffer, at)
            if len(self._buffer) - at - 2 < size:
                break
            messages.append(bytes(self._buffer[at + 2 : at + 2 + size]))
            at += 2 + size
        del self._buffer[:at]
        return messages

    def rest(self) -> bytes:
        """The bytes of an incomplete frame (emptied)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest


class DnsTcpSession:
    """One TCP connection's DNS frames, judged by *faults*; *peer* names the connection
    among those that share *faults* (an answer pairs with its query on the same one)."""

    def __init__(self, faults: DnsFaults, peer: object) -> None:
        self.faults = faults
        self.peer = peer
        self._up = Framer()
        self._down = Framer()

    def queries(self, data: bytes) -> list[tuple[Decision, bytes]]:
        """Each whole frame from the client in *data* (prefix included) with what to do:
        ``forward`` the frame (after ``delay_s``), ``answer`` with ``reply`` (framed
        here), or ``drop`` it."""
        steps: list[tuple[Decision, bytes]] = []
        for message in self._up.feed(data):
            decision = self.faults.query(message, self.peer)
            if decision.verdict == "answer":
                decision = replace(decision, reply=frame(decision.reply))
            steps.append((decision, frame(message)))
        return steps

    def answers(self, data: bytes) -> bytes:
        """The whole frames from the server in *data*, as the client is to get them."""
        return b"".join(frame(self.faults.answer(m, self.peer)) for m in self._down.feed(data))

    def rest(self, stream: str) -> bytes:
        """What is left of *stream* (``upstream``: the client's) at its end: an
        incomplete frame, passed on as it came."""
        return (self._up if stream == "upstream" else self._down).rest()
