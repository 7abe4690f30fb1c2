"""TLS: termination with a throwaway CA, re-origination towards the upstream, and the
record framing the handshake faults read.

The CA is made once per process, at first use, with trustme (from the trio project: a
CA and leaf certificates in memory, no openssl calls), and its certificate written to a
private temporary file (:func:`ca_cert_path`) that clients are pointed at
(``curl --cacert``, ``httpx.AsyncClient(verify=...)``); the file is removed at exit.
Nothing about it is secret beyond the process: it signs only for the names asked.

Both ends run :class:`ssl.SSLObject` over memory BIOs, so TLS happens inside the toxic
chain: :class:`Terminator` is the client's TLS server (ciphertext from the client in,
plaintext on to the layers inside it), :class:`Originator` the upstream's TLS client.
Each end has one lock around "produce TLS records, then send them on", because the
records of one SSLObject are made by both streams' tasks (the handshake by the reader,
application data by the writer) and must leave in the order they were made.
"""

from __future__ import annotations

import atexit
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

if TYPE_CHECKING:
    import trustme

__all__ = [
    "HANDSHAKE",
    "MAX_EARLY",
    "Originator",
    "Terminator",
    "ca_cert_path",
    "ca_cert_pem",
    "client_hello_end",
    "throwaway_ca",
]

#: The TLS record type of a handshake message (RFC 8446 5.1).
HANDSHAKE = 22

#: The most plaintext an end keeps until its handshake is done (a server that speaks
#: first, in front of a client slow to shake hands); past it the writer waits, so the
#: stream is not read meanwhile (issue 33: +621 MB in 2 s without a bound).
MAX_EARLY = 64 * 1024

_lock = threading.Lock()
_ca: trustme.CA | None = None
_ca_path: str | None = None


def throwaway_ca() -> trustme.CA:
    """This process's CA (a ``trustme.CA``), made at first use."""
    global _ca
    with _lock:
        if _ca is None:
            import trustme

            _ca = trustme.CA(organization_name="faultnet throwaway CA")
        return _ca


def ca_cert_path() -> str:
    """The path of a PEM file holding the throwaway CA's certificate (made once)."""
    global _ca_path
    ca = throwaway_ca()
    with _lock:
        if _ca_path is None:
            where = tempfile.mkdtemp(prefix="faultnet-ca-")
            atexit.register(shutil.rmtree, where, True)
            path = os.path.join(where, "ca.pem")
            ca.cert_pem.write_to_path(path)
            _ca_path = path
        return _ca_path


def ca_cert_pem() -> str:
    """The throwaway CA's certificate, PEM-encoded (made at first use)."""
    return throwaway_ca().cert_pem.bytes().decode()


def server_context(hostnames: list[str]) -> ssl.SSLContext:
    """A TLS server context whose certificate the throwaway CA issued for *hostnames*."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    throwaway_ca().issue_cert(*hostnames).configure_cert(ctx)
    return ctx


def client_context(ca: str) -> ssl.SSLContext:
    """A TLS client context: *ca* ``""`` verifies against the system's CAs, ``"none"``
    verifies nothing, anything else is a PEM file of CAs to verify against."""
    if ca == "none":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=ca or None)


def client_hello_end(data: bytes) -> int | None:
    """Where the first handshake flight's first record ends in *data* (the bytes a
    client sent first), or None if it has not all arrived; -1 if *data* is not TLS."""
    if len(data) < 5:
        return None
    if data[0] != HANDSHAKE:
        return -1
    end = 5 + int.from_bytes(data[3:5], "big")
    return end if len(data) >= end else None


class Out(Protocol):
    """Where one stream's bytes go on (a both-stream toxic's link on that stream)."""

    async def inject(self, data: bytes, t_read: float | None = None) -> None: ...

    async def inject_eof(self) -> None: ...

    async def reset(self) -> None: ...


class _End:
    """One SSLObject over memory BIOs and the stream its records leave on."""

    def __init__(
        self,
        obj_of: Callable[[ssl.MemoryBIO, ssl.MemoryBIO], ssl.SSLObject],
        records: Out,
        plain: Out,
        log: Callable[..., None],
    ) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = obj_of(self.incoming, self.outgoing)
        self.records = records  # where TLS records go
        self.plain = plain  # where decrypted bytes go
        self.log_event = log
        self.done = False  # the handshake
        self.failed = False
        self._lock = trio.Lock()
        self._early = bytearray()  # plaintext to send once the handshake is done
        self._settled = trio.Event()  # the handshake is done, or failed

    async def _flush(self) -> None:
        async with self._lock:
            data = self.outgoing.read()
            if data:
                await self.records.inject(data)

    async def _fail(self, exc: ssl.SSLError) -> None:
        self.failed = True
        self._early = bytearray()
        self._settled.set()
        self.log_event("tls_failed", reason=str(exc.reason or exc))
        await self._flush()  # the alert, if one was made
        await self.records.reset()

    def _step(self) -> None:
        """Drive the handshake on; raises ssl.SSLError on failure."""
        if not self.done:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                return
            self.done = True
            if self._early:  # what waited for the handshake goes first
                early, self._early = bytes(self._early), bytearray()
                self.obj.write(early)
            self._settled.set()

    async def records_in(self, data: bytes) -> None:
        """TLS records arrived from the peer this end talks TLS with."""
        if self.failed:
            return
        self.incoming.write(data)
        plain = bytearray()
        eof = False
        try:
            was_done = self.done
            self._step()
            if self.done:
                if not was_done:
                    self.log_event("tls_handshake", version=self.obj.version())
                while True:
                    try:
                        got = self.obj.read(65536)
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        eof = True
                        break
                    if not got:  # close_notify (CPython reads it as b"", again and again)
                        eof = True
                        break
                    plain += got

        except ssl.SSLError as exc:
            return await self._fail(exc)
        await self._flush()
        if plain:
            await self.plain.inject(bytes(plain))
        if eof:
            await self.plain.inject_eof()

    async def plain_in(self, data: bytes) -> None:
        """Plaintext to send to the peer this end talks TLS with."""
        if self.failed:
            return
        try:
            self._step()
            if self.done:
                self.obj.write(data)
            else:
                self._early += data
        except ssl.SSLError as exc:
            return await self._fail(exc)
        await self._flush()
        if len(self._early) > MAX_EARLY:
            await self._settled.wait()  # backpressure: the handshake sends it on

    async def plain_eof(self) -> None:
        if not self.failed:
            await self.records.inject_eof()

    async def records_eof(self) -> None:
        if not self.failed:
            await self.plain.inject_eof()


class Terminator(_End):
    """The client's TLS server: records come from the client (upstream) and go back to
    it (downstream); plaintext goes on upstream, towards the layers inside."""

    def __init__(
        self, ctx: ssl.SSLContext, upstream: Out, downstream: Out, log: Callable[..., None]
    ) -> None:
        super().__init__(
            lambda i, o: ctx.wrap_bio(i, o, server_side=True), downstream, upstream, log
        )


class Originator(_End):
    """The upstream's TLS client: plaintext from the layers outside goes to the server as
    records (upstream); records from the server come back decrypted (downstream)."""

    def __init__(
        self,
        ctx: ssl.SSLContext,
        server_name: str | None,
        upstream: Out,
        downstream: Out,
        log: Callable[..., None],
    ) -> None:
        super().__init__(
            lambda i, o: ctx.wrap_bio(i, o, server_side=False, server_hostname=server_name),
            upstream,
            downstream,
            log,
        )
