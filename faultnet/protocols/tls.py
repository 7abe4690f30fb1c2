"""TLS: termination with a throwaway CA, re-origination towards the upstream, and the
record framing the handshake faults read; both ends pure (sans-I/O).

The CA is made once per process, at first use, with trustme (from the trio project: a
CA and leaf certificates in memory, no openssl calls), and its certificate written to a
private temporary file (:func:`ca_cert_path`) that clients are pointed at
(``curl --cacert``, ``httpx.AsyncClient(verify=...)``); the file is removed at exit.
Nothing about it is secret beyond the process: it signs only for the names asked.

Theory of operation
-------------------

Both ends run :class:`ssl.SSLObject` over memory BIOs, which is sans-I/O already, so
each end is a pure session as :mod:`faultnet.protocols.http`'s is: events in (records
or plaintext on a stream, an end of stream, a sent write), commands out (that module's
:class:`~faultnet.protocols.http.Inject`, :class:`~faultnet.protocols.http.Eof`,
:class:`~faultnet.protocols.http.Hold`, :class:`~faultnet.protocols.http.Resume`,
:class:`~faultnet.protocols.http.Close`, :class:`~faultnet.protocols.http.Reset`, and
here :class:`Ask` and :class:`Settled`). :class:`Terminator` is the client's TLS server
(ciphertext from the client in, plaintext on to the layers inside it),
:class:`Originator` the upstream's TLS client.

**One writer per stream, no lock.** An end's records towards its peer are made by both
streams' tasks (the handshake by the reader, application data by the writer) and must
leave in the order they were made. Each stream an end writes has an outbox: the first
event that fills it gets an :class:`Inject` and the stream is *busy* until whoever
carries that command out calls :meth:`_End.sent`, which hands over what came meanwhile
(in order) or frees the stream. So exactly one task writes a stream at a time, and the
order is the order the SSLObject made the bytes. A stream's outbox past
:data:`MAX_EARLY` holds the stream the event came on (:class:`Hold`, then
:class:`Resume`): bytes are not read faster than they leave.

**Negotiation.** The terminator reads the client's ClientHello first
(:func:`read_client_hello`: its SNI and ALPN list) and, before answering it, asks the
upstream (:class:`Ask`): an originator on the same connection makes its own ClientHello
with that server name and that ALPN list, shakes hands, and says what the upstream chose
(:class:`Settled`); only then is the client's ClientHello fed to the terminator's
SSLObject, with a leaf made for the name the client asked and the upstream's ALPN
choice, so the client gets what the server behind agreed to (``h2`` included). Without
an originator the terminator settles by itself. An upstream that failed is answered to
the client: an HTTP client gets a ``502 Bad Gateway`` naming the reason, any other a
``handshake_failure`` alert.

Every state and transition of an end is in :data:`TRANSITIONS`.
"""

from __future__ import annotations

import atexit
import enum
import functools
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import h11

from faultnet.protocols._states import step
from faultnet.protocols.http import (
    DOWN,
    MAX_HEAD,
    UP,
    Close,
    Eof,
    Hold,
    Inject,
    Reset,
    Resume,
    answer_bytes,
)

if TYPE_CHECKING:
    import trustme

__all__ = [
    "HANDSHAKE",
    "LEAVES",
    "MAX_EARLY",
    "Ask",
    "Hello",
    "Originator",
    "Settled",
    "State",
    "TRANSITIONS",
    "TlsCommand",
    "Terminator",
    "ca_cert_path",
    "ca_cert_pem",
    "client_context",
    "client_hello_end",
    "leaf_context",
    "read_client_hello",
]

#: The TLS record type of a handshake message (RFC 8446 5.1).
HANDSHAKE = 22

#: The most bytes an end keeps for a stream that cannot go on yet (plaintext before the
#: handshake is done, records behind the upstream's answer, a busy stream's outbox);
#: past it the stream they came on is held, unread (issue 33: a server that speaks
#: first cost +621 MB in 2 s without a bound).
MAX_EARLY = 64 * 1024

#: The most leaf certificates kept, one per (names, ALPN choice): the names are the
#: client's to choose (SNI), so the cache is bounded; an evicted one is issued again.
LEAVES = 256

#: The largest first record read as a ClientHello (2^14 of plaintext, RFC 8446 5.1,
#: plus the header): a longer one is not parsed, and the handshake fails as it will.
MAX_HELLO_RECORD = 5 + 2**14

_lock = threading.Lock()
_ca: trustme.CA | None = None
_ca_path: str | None = None


# -- the throwaway CA and its leaves ---------------------------------------------------


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


@functools.lru_cache(maxsize=LEAVES)
def leaf_context(names: tuple[str, ...], alpn: str | None = None) -> ssl.SSLContext:
    """A TLS server context with a leaf the throwaway CA issued for *names*, answering
    ALPN with *alpn* when the client offers it (None: no ALPN answered). Cached, at most
    :data:`LEAVES`: a context is never changed once made, so connections share it."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    throwaway_ca().issue_cert(*names).configure_cert(ctx)
    if alpn is not None:
        ctx.set_alpn_protocols([alpn])
    return ctx


@functools.cache
def _refusing_context() -> ssl.SSLContext:
    """A server context that ends every handshake with a ``handshake_failure`` alert
    (the SNI callback's answer: OpenSSL sends the alert a real server would)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    throwaway_ca().issue_cert("faultnet.invalid").configure_cert(ctx)
    ctx.sni_callback = lambda obj, name, ctx: ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
    return ctx


def client_context(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext:
    """A TLS client context: *ca* ``""`` verifies against the system's CAs, ``"none"``
    verifies nothing, anything else is a PEM file of CAs to verify against; *cert* (and
    *key*, if not in *cert*) a client certificate to present (mTLS). OSError
    (ssl.SSLError included) if a file does not load."""
    if ca == "none":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=ca or None)
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


# -- the ClientHello -------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """What a ClientHello asks: the server name (SNI, RFC 6066 3) and the application
    protocols offered, in the client's order (ALPN, RFC 7301)."""

    server_name: str | None = None
    alpn: tuple[str, ...] = ()


def client_hello_end(data: bytes) -> int | None:
    """Where the first handshake flight's first record ends in *data* (the bytes a
    client sent first), or None if it has not all arrived; -1 if *data* is not TLS."""
    if len(data) < 5:
        return None
    if data[0] != HANDSHAKE:
        return -1
    end = 5 + int.from_bytes(data[3:5], "big")
    return end if len(data) >= end else None


class _Reader:
    """A cursor over bytes; IndexError past the end (the caller's "not a hello")."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise IndexError(n)
        got, self.at = self.data[self.at : self.at + n], self.at + n
        return got

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> _Reader:
        return _Reader(self.take(self.number(length_bytes)))

    def more(self) -> bool:
        return self.at < len(self.data)


def read_client_hello(record: bytes) -> Hello:
    """The SNI and ALPN list of the ClientHello in *record* (one whole TLS record, as
    :func:`client_hello_end` delimits it); an empty :class:`Hello` for anything else.

    Python's ssl parses the same message but shows neither the ALPN list nor the SNI
    before it answers, and the answer must wait for the upstream's; so the two
    extensions are read here, as mitmproxy reads them (RFC 8446 4.1.2, RFC 6066 3, RFC
    7301 3.1), within the one record (at most :data:`MAX_HELLO_RECORD` bytes). A
    conformance test holds it against the names and protocols ssl itself sends."""
    try:
        body = _Reader(record[5:MAX_HELLO_RECORD])
        if body.number(1) != 1:  # client_hello
            return Hello()
        hello = body.vector(3)
        hello.take(2 + 32)  # legacy_version, random
        hello.vector(1), hello.vector(2), hello.vector(1)  # session id, suites, compression
        extensions = hello.vector(2)
        name: str | None = None
        alpn: tuple[str, ...] = ()
        while extensions.more():
            kind, ext = extensions.number(2), extensions.vector(2)
            if kind == 0:  # server_name: a list of (type, name); type 0 is host_name
                names = ext.vector(2)
                while names.more():
                    if names.number(1) == 0:
                        name = names.vector(2).data.decode("ascii", "replace")
                    else:
                        names.vector(2)
            elif kind == 16:  # application_layer_protocol_negotiation
                protocols = ext.vector(2)
                found = []
                while protocols.more():
                    found.append(protocols.vector(1).data.decode("ascii", "replace"))
                alpn = tuple(found)
        return Hello(name, alpn)
    except IndexError:
        return Hello()


def bad_gateway(reason: str, head_only: bool = False) -> bytes:
    """The 502 an HTTP client is answered with when the upstream's TLS failed."""
    body = f"faultnet: the upstream's TLS handshake failed: {reason}\n".encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Connection", "close")]
    return answer_bytes(502, body, headers, head_only=head_only)


def _reason(exc: ssl.SSLError) -> str:
    verify = getattr(exc, "verify_message", None)
    reason = str(exc.reason or exc)
    return f"{reason}: {verify}" if verify else reason


# -- commands (beyond faultnet.protocols.http's) ---------------------------------------


@dataclass(frozen=True)
class Ask:
    """The terminator read the client's ClientHello: the upstream's end is to shake
    hands with this server name and these protocols, then :class:`Settled` it."""

    hello: Hello


@dataclass(frozen=True)
class Settled:
    """The upstream's handshake ended: the protocol it chose (None: none), or, *reason*
    set, why it failed. For :meth:`Terminator.settled`."""

    alpn: str | None
    reason: str | None = None


TlsCommand = Inject | Eof | Hold | Resume | Close | Reset | Ask | Settled

RESET = Reset()


# -- the states, all in one place ------------------------------------------------------


class State(enum.Enum):
    """Where an end stands."""

    HELLO = "hello"  # the terminator awaits the client's ClientHello
    ASKING = "asking"  # it awaits the upstream's answer; the ClientHello is kept
    IDLE = "idle"  # the originator awaits its server name and protocols
    SHAKING = "shaking"  # the handshake is under way
    OPEN = "open"  # records and plaintext cross
    REFUSING = "refusing"  # the upstream failed: the client's first request gets a 502
    CLOSED = "closed"  # failed, or closed: nothing more crosses


class Ev(enum.Enum):
    HELLO = "client hello read"
    SETTLED = "upstream settled"
    REFUSED = "upstream failed"
    START = "start"
    DONE = "handshake done"
    ENDED = "ended"


#: (state, event) -> next state. A pair not here is a bug (KeyError).
TRANSITIONS: dict[tuple[State, Ev], State] = {
    (State.HELLO, Ev.HELLO): State.ASKING,
    (State.ASKING, Ev.SETTLED): State.SHAKING,
    (State.ASKING, Ev.REFUSED): State.SHAKING,  # shaking hands to answer the refusal
    (State.IDLE, Ev.START): State.SHAKING,
    (State.SHAKING, Ev.DONE): State.OPEN,
    (State.SHAKING, Ev.REFUSED): State.REFUSING,  # done, with the upstream failed
    (State.OPEN, Ev.REFUSED): State.REFUSING,  # the server refused before answering
    **{(s, Ev.ENDED): State.CLOSED for s in State},
}


# -- an end ----------------------------------------------------------------------------


@dataclass
class _Outbox:
    """What waits to be written on one stream, and whether a write of it is out."""

    data: bytearray = field(default_factory=bytearray)
    eof: bool = False
    final: Close | Reset | None = None
    busy: bool = False


Log = Callable[..., None]


class _End:
    """One SSLObject over memory BIOs: records on one stream, plaintext on the other.

    *records_out* is the stream this end's records leave on, *plain_out* the stream its
    plaintext goes on; events come on the other two (see :class:`Terminator`)."""

    def __init__(self, records_out: str, plain_out: str, state: State, log: Log) -> None:
        self.records_out, self.plain_out = records_out, plain_out
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj: ssl.SSLObject | None = None
        self.state = state
        self.log_event = log
        self._box = {UP: _Outbox(), DOWN: _Outbox()}
        self._held: set[str] = set()  # streams told to Hold until a Resume
        self._early = bytearray()  # plaintext waiting for the handshake
        self._early_eof = False  # ... and the end of its stream
        self._plain_ended = False
        self._cmds: list[TlsCommand] = []
        #: The server name of the handshake (the client's SNI, or the one sent).
        self.name: str | None = None
        #: Why the upstream failed, once it did: the client's first request gets a 502.
        self.refusal: str | None = None
        self._request = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)

    @property
    def alpn(self) -> str | None:
        """The protocol this end's handshake negotiated by ALPN (None before it is done,
        or when none was): what a session over the plaintext speaks (``h2``...)."""
        if self.obj is None or self.state is not State.OPEN:
            return None
        return self.obj.selected_alpn_protocol()

    # -- the outboxes --

    def sent(self, stream: str) -> list[TlsCommand]:
        """The :class:`Inject` or :class:`Eof` on *stream* was carried out: what came
        for the stream meanwhile, or nothing (the stream is free)."""
        self._box[stream].busy = False
        self._drain(stream)
        self._release()
        return self._take()

    def _send(
        self,
        stream: str,
        data: bytes = b"",
        eof: bool = False,
        final: Close | Reset | None = None,
    ) -> None:
        box = self._box[stream]
        box.data += data
        box.eof |= eof
        box.final = box.final or final
        self._drain(stream)

    def _drain(self, stream: str) -> None:
        box = self._box[stream]
        if box.busy:
            return
        if box.data:
            box.busy = True
            self._cmds.append(Inject(stream, bytes(box.data)))
            box.data.clear()
        elif box.eof:
            box.busy, box.eof = True, False
            self._cmds.append(Eof(stream))
        elif box.final is not None:
            self._cmds.append(box.final)
            box.final = None

    def _over(self) -> bool:
        """Whether more waits here than the bound allows."""
        return len(self._early) > MAX_EARLY or any(
            len(box.data) > MAX_EARLY for box in self._box.values()
        )

    def _hold(self, stream: str) -> None:
        """Hold *stream* (the one the event came on) while more waits than the bound."""
        if self._over() and stream not in self._held:
            self._held.add(stream)
            self._cmds.append(Hold(stream, None))

    def _release(self) -> None:
        """Resume the held streams once what waits is within the bound."""
        if not self._over():
            self._cmds.extend(Resume(held) for held in sorted(self._held))
            self._held.clear()

    def _take(self) -> list[TlsCommand]:
        # Holds last: the task carries out the rest, then waits.
        cmds, self._cmds = self._cmds, []
        return [c for c in cmds if not isinstance(c, Hold)] + [
            c for c in cmds if isinstance(c, Hold)
        ]

    def _go(self, event: Ev) -> None:
        self.state = step(TRANSITIONS, self.state, event)

    # -- the SSLObject --

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self._send(self.records_out, data)

    def _shake(self) -> bool:
        """Drive the handshake on; True once it is done. ssl.SSLError on failure."""
        assert self.obj is not None
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.log_event(
            "tls_handshake",
            version=self.obj.version(),
            alpn=self.obj.selected_alpn_protocol(),
            server_name=self.name,
        )
        return True

    def _read_plain(self) -> tuple[bytes, bool]:
        """The plaintext the records fed so far make, and whether close_notify came."""
        assert self.obj is not None
        plain = bytearray()
        while True:
            try:
                got = self.obj.read(65536)
            except ssl.SSLWantReadError:
                return bytes(plain), False
            except ssl.SSLZeroReturnError:
                return bytes(plain), True
            if not got:  # close_notify (CPython reads it as b"", again and again)
                return bytes(plain), True
            plain += got

    def _opened(self) -> None:
        """The handshake is done: what waited for it goes first."""
        assert self.obj is not None
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self.obj.write(early)
        self._flush()
        if self._early_eof:
            self._close_notify()
        self._release()

    def _close_notify(self) -> None:
        """Say close_notify, then end the records' stream (a clean close, RFC 8446 6.1)."""
        assert self.obj is not None
        try:
            self.obj.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass  # sent; the peer's own close_notify is not awaited
        self._flush()
        self._send(self.records_out, eof=True)

    def _fail(self, reason: str, final: Close | Reset | None = RESET) -> None:
        self.log_event("tls_failed", reason=reason)
        self._early.clear()
        self._go(Ev.ENDED)
        self._flush()  # the alert, if one was made
        if final is not None:
            self._send(self.records_out, final=final)

    def _records(self, data: bytes) -> None:
        """Records for the open (or refusing) SSLObject; plaintext made goes on."""
        assert self.obj is not None
        self.incoming.write(data)
        plain, ended = self._read_plain()
        self._flush()
        self._plain(plain, ended)

    def _plain(self, plain: bytes, ended: bool) -> None:
        if plain:
            self._send(self.plain_out, plain)
        if ended and not self._plain_ended:
            self._plain_ended = True
            self._send(self.plain_out, eof=True)

    def _write(self, stream: str, data: bytes) -> None:
        """Plaintext to send on as records."""
        if self.state is State.OPEN:
            assert self.obj is not None
            self.obj.write(data)
            self._flush()
        elif self.state is not State.CLOSED and self.state is not State.REFUSING:
            self._early += data
        self._hold(stream)

    def _judge(self, plain: bytes, ended: bool) -> tuple[bool, h11.Request | None]:
        """Read the client's first request while refusing: (decided, the request or
        None when what came is not HTTP/1). Undecided while its head is incomplete."""
        if plain:
            self._request.receive_data(plain)
        if ended:
            self._request.receive_data(b"")
        try:
            event = self._request.next_event()
        except h11.RemoteProtocolError:
            return True, None
        if event is h11.NEED_DATA:
            return False, None
        return True, event if isinstance(event, h11.Request) else None

    def _records_ended(self) -> None:
        """The peer's records ended (a FIN): the plaintext ends with them."""
        if self.state is State.OPEN:
            self._plain(b"", True)


class Terminator(_End):
    """The client's TLS server: records come from the client on ``upstream`` and go back
    on ``downstream``; plaintext goes on ``upstream``, to the layers inside, and comes
    back on ``downstream``.

    *names* are the leaf's names for a client that sends no SNI (an IP address); *alpn*
    the protocols this end accepts, in its order (empty: whatever the upstream chose,
    and, with no upstream TLS, none)."""

    def __init__(self, names: tuple[str, ...], alpn: tuple[str, ...], log: Log) -> None:
        super().__init__(DOWN, UP, State.HELLO, log)
        self.names, self.accepts = names, alpn
        self.hello = Hello()
        self._kept = bytearray()  # the client's records until the upstream settles

    # -- events in --

    def records_in(self, data: bytes) -> list[TlsCommand]:
        """Records from the client."""
        try:
            self._records_in(data)
        except ssl.SSLError as exc:
            self._fail(_reason(exc))
        return self._take()

    def plain_in(self, data: bytes) -> list[TlsCommand]:
        """Plaintext from inside, for the client."""
        try:
            self._write(DOWN, data)
        except ssl.SSLError as exc:
            self._fail(_reason(exc))
        return self._take()

    def records_eof(self) -> list[TlsCommand]:
        """The client's FIN."""
        self._records_ended()
        if self.state is State.REFUSING:
            self._refuse(b"", True)
        elif self.state in (State.HELLO, State.ASKING):
            self._go(Ev.ENDED)
            self._send(UP, eof=True)
        return self._take()

    def plain_eof(self) -> list[TlsCommand]:
        """The end of what goes to the client: close_notify, then a FIN."""
        if self.state is State.OPEN:
            self._close_notify()
        elif self.state is not State.CLOSED:
            self._early_eof = True
        return self._take()

    def settled(self, alpn: str | None, reason: str | None = None) -> list[TlsCommand]:
        """The upstream's handshake ended (:class:`Settled`): answer the ClientHello."""
        if self.state is State.ASKING:
            self._settle(alpn, reason)
            self._release()  # the client's stream, held while asking, goes on
        return self._take()

    def choose(self) -> str | None:
        """The protocol this end picks alone (no upstream TLS to ask): the first of its
        own that the client offered."""
        return next((p for p in self.accepts if p in self.hello.alpn), None)

    def offer(self) -> tuple[str, ...]:
        """The protocols to offer the upstream: the client's, less those this end does
        not accept."""
        return tuple(p for p in self.hello.alpn if not self.accepts or p in self.accepts)

    # -- internals --

    def _records_in(self, data: bytes) -> None:
        if self.state is State.HELLO:
            self._kept += data
            end = client_hello_end(bytes(self._kept[:MAX_HELLO_RECORD]))
            if end is None and len(self._kept) < MAX_HELLO_RECORD:
                return
            self._go(Ev.HELLO)
            if end is None or end < 0:  # not TLS, or no hello we read: ssl says why
                self._settle(None, None)
                return
            self.hello = read_client_hello(bytes(self._kept[:end]))
            self.name = self.hello.server_name
            self._cmds.append(Ask(self.hello))
        elif self.state is State.ASKING:
            self._kept += data
            self._hold(UP)
        elif self.state is State.SHAKING:
            self._handshake(data)
        elif self.state is State.OPEN:
            self._records(data)
        elif self.state is State.REFUSING:
            self.incoming.write(data)
            self._refuse(*self._read_plain())

    def _settle(self, alpn: str | None, reason: str | None) -> None:
        names = (self.hello.server_name,) if self.hello.server_name else self.names
        offered = self.hello.alpn
        if reason is None:
            context = leaf_context(names, alpn if alpn in offered else None)
            self._go(Ev.SETTLED)
        elif not offered or "http/1.1" in offered:  # an HTTP/1 client: a 502 says why
            context = leaf_context(names, "http/1.1" if offered else None)
            self.refusal = reason
            self._go(Ev.REFUSED)
        else:  # h2 alone (gRPC), or not HTTP: a handshake_failure alert
            context = _refusing_context()
            self.refusal = reason
            self._go(Ev.REFUSED)
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        kept, self._kept = bytes(self._kept), bytearray()
        try:
            self._handshake(kept)
        except ssl.SSLError as exc:
            if self.refusal is None:
                self._fail(_reason(exc))
            else:  # the alert was the answer; the reason was logged upstream
                self._go(Ev.ENDED)
                self._flush()
                self._send(DOWN, final=Close())

    def _over(self) -> bool:
        return len(self._kept) > MAX_EARLY or super()._over()

    def _handshake(self, data: bytes) -> None:
        assert self.obj is not None
        self.incoming.write(data)
        if not self._shake():
            self._flush()
            return
        if self.refusal is not None:
            self._go(Ev.REFUSED)
            self._flush()
            self._refuse(*self._read_plain())
            return
        self._go(Ev.DONE)
        self._opened()
        self._records(b"")

    def _refuse(self, plain: bytes, ended: bool) -> None:
        """The upstream failed: answer the client's first request with a 502 naming
        why, then close_notify and close; anything not HTTP is closed the same way."""
        assert self.refusal is not None and self.obj is not None
        decided, request = self._judge(plain, ended)
        if not decided:
            return
        if request is not None:
            self.obj.write(bad_gateway(self.refusal, head_only=request.method == b"HEAD"))
        self._go(Ev.ENDED)
        self._close_notify()
        self._send(DOWN, final=Close())


class Originator(_End):
    """The upstream's TLS client: plaintext from the layers outside (``upstream``) goes
    to the server as records (``upstream``); records from the server (``downstream``)
    come back decrypted (``downstream``).

    *wrap* makes the SSLObject for a server name and ALPN list. *server_name* overrides
    the name the client asked (SNI and the name checked); None takes the client's.
    *asked*: a terminator waits for :class:`Settled` (set by :meth:`start`)."""

    def __init__(
        self,
        wrap: Callable[[ssl.MemoryBIO, ssl.MemoryBIO, str | None, tuple[str, ...]], ssl.SSLObject],
        server_name: str | None,
        log: Log,
    ) -> None:
        super().__init__(UP, DOWN, State.IDLE, log)
        self.wrap, self.server_name = wrap, server_name
        self.asked = False
        # The client's first plaintext, until the server's first comes back (at most
        # MAX_HEAD): TLS 1.3 ends the client's handshake before the server has judged
        # its certificate, so a refusal (mTLS) can come after it, and still be a 502.
        self._first = bytearray()
        self._answered = False

    # -- events in --

    def start(self, hello: Hello | None, alpn: tuple[str, ...] = ()) -> list[TlsCommand]:
        """Shake hands with the server for *hello*'s name (unless overridden), offering
        *alpn*; with a *hello* a terminator waits for :class:`Settled`."""
        if self.state is State.IDLE:
            self.asked = hello is not None
            name = self.name = self.server_name or (hello.server_name if hello else None)
            self.obj = self.wrap(self.incoming, self.outgoing, name, alpn)
            self._go(Ev.START)
            self._step(b"")
        return self._take()

    def records_in(self, data: bytes) -> list[TlsCommand]:
        """Records from the server."""
        if self.state is State.SHAKING:
            self._step(data)
        elif self.state is State.OPEN:
            try:
                self._records(data)
            except ssl.SSLError as exc:
                if self._answered:
                    self._fail(_reason(exc))
                else:  # refused before any answer: as a failed handshake
                    self._failed(_reason(exc))
        return self._take()

    def plain_in(self, data: bytes) -> list[TlsCommand]:
        """Plaintext from outside, for the server; the first starts the handshake when
        no terminator asked for it."""
        if self.state is State.IDLE:
            self.start(None)
        if self.state is State.REFUSING:
            self._refuse(data, False)
            return self._take()
        if not self._answered and len(self._first) < MAX_HEAD:
            self._first += data[: MAX_HEAD - len(self._first)]
        try:
            self._write(UP, data)
        except ssl.SSLError as exc:
            self._fail(_reason(exc))
        return self._take()

    def records_eof(self) -> list[TlsCommand]:
        """The server's FIN: before its handshake, or before any answer to a request
        that came (as nginx's "upstream prematurely closed"), a failure."""
        if self.state is State.SHAKING:
            self._failed("the upstream closed the connection during the TLS handshake")
        elif self.state is State.OPEN and not (self._answered or self._plain_ended):
            self._failed("the upstream closed the connection before answering")
            return self._take()
        self._records_ended()
        return self._take()

    def plain_eof(self) -> list[TlsCommand]:
        """The end of what goes to the server: close_notify, then a FIN."""
        if self.state is State.OPEN:
            self._close_notify()
        elif self.state is State.REFUSING:
            self._refuse(b"", True)
        elif self.state in (State.SHAKING, State.IDLE):
            self._early_eof = True
        return self._take()

    # -- internals --

    def _step(self, data: bytes) -> None:
        self.incoming.write(data)
        try:
            if not self._shake():
                self._flush()
                return
        except ssl.SSLError as exc:
            self._failed(_reason(exc))
            return
        self._go(Ev.DONE)
        assert self.obj is not None
        if self.asked:
            self._cmds.append(Settled(self.obj.selected_alpn_protocol()))
        self._opened()
        self._records(b"")

    def _plain(self, plain: bytes, ended: bool) -> None:
        if plain:
            self._answered = True
            self._first.clear()
        super()._plain(plain, ended)

    def _failed(self, reason: str) -> None:
        """The handshake failed, or the server refused before any answer: a terminator
        that waits answers its client; otherwise the client's first request (come or
        to come) is answered 502, and anything not HTTP/1 reset."""
        if self.asked and self.state is State.SHAKING:
            self._fail(reason, final=None)
            self._cmds.append(Settled(None, reason))
            return
        self.log_event("tls_failed", reason=reason)
        self.refusal = reason
        self._go(Ev.REFUSED)
        self._refuse(bytes(self._first), False)

    def _refuse(self, plain: bytes, ended: bool) -> None:
        assert self.refusal is not None
        decided, request = self._judge(plain, ended)
        if not decided:
            return
        self._go(Ev.ENDED)
        if request is None:
            self._send(UP, final=Reset())
        else:
            answer = bad_gateway(self.refusal, request.method == b"HEAD")
            self._send(DOWN, answer, eof=True, final=Close())
