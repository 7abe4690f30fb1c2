"""Which HTTP a connection speaks, read from its first bytes, and the session that
runs it: :class:`faultnet.protocols.http.Session` (HTTP/1.1) or
:class:`faultnet.protocols.http2.Session` (HTTP/2, gRPC).

A client that speaks HTTP/2 sends the preface (``PRI * HTTP/2.0``...) before anything
else, whether in plain TCP (h2c with prior knowledge) or inside TLS once ALPN chose
``h2``: so the front reads the first bytes and needs no word from a TLS layer. (The seam
for TLS: ``tls_terminate`` must offer ``h2`` in its ALPN for a client to speak HTTP/2
through it; the bytes it hands on then begin with the preface, and this front takes
them.) An h2c upgrade (``Upgrade: h2c`` over HTTP/1.1) stays with the HTTP/1.1 session,
which passes what follows the 101 as opaque bytes.

Pure, as the sessions are: events in, commands out. Until the client's first bytes say
which, the front keeps them (fewer than the preface's 24), and a server that speaks
first is held (its first read kept, its stream not read) if what it sent begins as an
HTTP/2 server's SETTINGS; anything else a server says first makes it HTTP/1.1.
"""

from __future__ import annotations

from collections.abc import Callable

from faultnet.protocols import http, http2
from faultnet.protocols.http import DOWN, UP, Command, Hold, Resume

__all__ = ["Front"]


class Front:
    """One connection's HTTP session, chosen by its first bytes (see the module
    docstring). *http1* and *http2* make the session when the choice is made."""

    def __init__(
        self, http1: Callable[[], http.Session], http2_: Callable[[], http2.Session]
    ) -> None:
        self._make = (http1, http2_)
        self.session: http.Session | http2.Session | None = None
        self._up = b""  # the client's first bytes, while they may be the preface
        self._down = b""  # a server's first read, held until the client says

    def receive(self, stream: str, data: bytes, now: float) -> list[Command]:
        """Bytes read on *stream* at trio time *now*."""
        if self.session is not None:
            return self.session.receive(stream, data, now)
        if stream == UP:
            self._up += data
            seen = http2.is_preface(self._up)
            return [] if seen is None else self._start(seen, now)
        if http2.is_server_preface(data) and not self._down:
            self._down = data
            return [Hold(DOWN, None)]
        cmds = self._start(False, now)
        return cmds + self._session().receive(DOWN, data, now)

    def receive_eof(self, stream: str, now: float) -> list[Command]:
        """The end of *stream*."""
        cmds = self._start(False, now) if self.session is None else []
        return cmds + self._session().receive_eof(stream, now)

    def timer(self, stream: str, now: float) -> list[Command]:
        """A :class:`Hold` of *stream* came due (or was resumed)."""
        session = self._session()
        if stream == DOWN and self._down:
            data, self._down = self._down, b""
            return session.receive(DOWN, data, now)
        return session.timer(stream, now)

    def _session(self) -> http.Session | http2.Session:
        assert self.session is not None, "the front has chosen no session yet"
        return self.session

    def _start(self, h2: bool, now: float) -> list[Command]:
        session = self.session = self._make[1]() if h2 else self._make[0]()
        cmds: list[Command] = []
        if self._up:
            data, self._up = self._up, b""
            cmds += session.receive(UP, data, now)
        if self._down:
            cmds.append(Resume(DOWN))  # its kept read goes in at its timer
        return cmds
