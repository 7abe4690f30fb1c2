"""TLS toxics: termination (so the HTTP toxics see requests inside HTTPS),
re-origination towards the upstream, and faults on the handshake itself.

* ``tls_terminate`` (layer 0, outermost): the proxy is the client's TLS server, with a
  leaf issued by this process's throwaway CA (trustme) for the name the client asked
  (SNI), or for ``hostnames`` when it asked none (an IP address); the CA certificate's
  path is the read-only attribute ``ca_cert``, for ``curl --cacert`` and
  ``httpx.AsyncClient(verify=...)``. ALPN: with ``tls_originate`` the client's list is
  offered to the upstream and the client is answered with what the upstream chose
  (``h2``, ``http/1.1``); ``alpn`` (comma-separated) narrows the list, and without
  ``tls_originate`` is what this end picks from (empty: nothing, HTTP/1.1). What was
  negotiated is :func:`negotiated_alpn` to the layers inside (an HTTP/2 session).
  A clean end of the stream to the client is a close_notify, then a FIN.
* ``tls_originate`` (layer 2, innermost): the proxy is the upstream's TLS client,
  verifying it against the system's CAs (``ca`` ``""``), a PEM file (``ca`` a path), or
  not at all (``ca`` ``"none"``); SNI and the name checked are ``server_name``, or, when
  it is empty, the name the client asked ``tls_terminate`` for. ``cert`` and ``key``
  (PEM files; ``key`` empty when ``cert`` holds it) are a client certificate for an
  upstream that asks for one (mTLS). An upstream that fails the handshake (its
  certificate not verified, no client certificate it accepts...) is one ``tls_failed``
  event naming why, and the client gets a ``502 Bad Gateway`` whose body says why if it
  speaks HTTP/1 (a ``handshake_failure`` alert if it offered only ``h2``).
* ``tls_handshake``: without terminating anything, the client's ClientHello reaches the
  server and then ``action`` ``stall`` delivers nothing more either way (the client's
  handshake hangs until its own timeout) or ``reset`` resets the connection (RST both
  ways) when the server's first handshake bytes come back.

A connection the toxic is added to after its handshake is not re-read: add TLS toxics
before the clients connect. The ends themselves are pure sessions
(:mod:`faultnet.protocols.tls`); :func:`_carry_out` does what they say.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import trio

from faultnet.protocols.http import Eof, Hold, Inject
from faultnet.protocols.tls import (
    Ask,
    Originator,
    Settled,
    Terminator,
    TlsCommand,
    ca_cert_path,
    client_context,
    client_hello_end,
)
from faultnet.toxics._attributes import AttributeToxic, TextAttribute
from faultnet.toxics._protocol import end_or_wake
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = ["TlsHandshake", "TlsOriginate", "TlsTerminate", "negotiated_alpn"]


def _links(ctx: ToxicContext) -> tuple[ToxicStage, ToxicStage]:
    link = cast(ToxicStage, ctx)
    up, down = link.on("upstream"), link.on("downstream")
    assert up is not None and down is not None, "a TLS toxic sees both streams"
    return up, down


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _stage_of(ctx: ToxicContext, kind: type[_TlsEnd]) -> ToxicStage | None:
    """The upstream stage of the *kind* toxic on *ctx*'s connection, if it has one."""
    host = cast(ToxicStage, ctx).host
    if host is None:
        return None
    return next((s for s in host.chain("upstream").stages if isinstance(s.toxic, kind)), None)


def negotiated_alpn(ctx: ToxicContext) -> str | None:
    """The protocol the client's TLS negotiated by ALPN on *ctx*'s connection (``h2``,
    ``http/1.1``), once ``tls_terminate``'s handshake with it is done; None without
    termination, before then, or when none was. A session over the plaintext (a layer
    inside ``tls_terminate``) reads it on its first bytes, which come after the
    handshake, to know whether it reads HTTP/2."""
    stage = _stage_of(ctx, TlsTerminate)
    end = stage.state.get("tls") if stage is not None else None
    return end.alpn if isinstance(end, Terminator) else None


async def _carry_out(
    stage: ToxicStage, end: Terminator | Originator, commands: list[TlsCommand]
) -> None:
    """Do what *end* said, in order, in the task of *stage*'s stream: a write, then what
    the end hands over once it is done (:meth:`~faultnet.protocols.tls._End.sent`); a
    :class:`Hold` waits (the stream is not read meanwhile) for its :class:`Resume`. An
    :class:`Ask` goes to the connection's ``tls_originate`` (or the terminator settles
    alone), a :class:`Settled` back to its ``tls_terminate``."""
    wake: dict[str, trio.Event] = stage.state.setdefault("tls_wake", {})
    queue: deque[TlsCommand] = deque()
    hold: Hold | None = None

    def take(more: list[TlsCommand]) -> None:
        # A Hold's event is made as the command comes, before any checkpoint, so a
        # Resume another task carries out meanwhile is not lost.
        for cmd in more:
            if isinstance(cmd, Hold):
                wake.setdefault(cmd.stream, trio.Event())
        queue.extend(more)

    take(commands)
    while queue:
        cmd = queue.popleft()
        if isinstance(cmd, Inject | Eof):
            target = stage.on(cmd.stream)
            assert target is not None
            await (target.inject(cmd.data) if isinstance(cmd, Inject) else target.inject_eof())
            take(end.sent(cmd.stream))
        elif (ended := await end_or_wake(stage, wake, cmd)) is not None:
            if ended:
                return
        elif isinstance(cmd, Ask):
            await _ask(stage, cast(Terminator, end), cmd)
        elif isinstance(cmd, Settled):
            await _settle(stage, cmd)
        else:
            assert isinstance(cmd, Hold)
            hold = cmd
    if hold is not None and hold.stream in wake:
        await wake[hold.stream].wait()


async def _ask(stage: ToxicStage, end: Terminator, ask: Ask) -> None:
    """The terminator read the ClientHello: the originator shakes hands for it."""
    other = _stage_of(stage, TlsOriginate)
    if other is None:
        return await _carry_out(stage, end, end.settled(end.choose()))
    originate = cast(TlsOriginate, other.toxic)
    origin = originate.end_of(other)
    await _carry_out(other, origin, origin.start(ask.hello, end.offer()))


async def _settle(stage: ToxicStage, settled: Settled) -> None:
    """The originator's handshake ended: the terminator answers its client."""
    other = _stage_of(stage, TlsTerminate)
    end = other.state.get("tls") if other is not None else None
    if other is not None and isinstance(end, Terminator):
        await _carry_out(other, end, end.settled(settled.alpn, settled.reason))


class _TlsEnd(AttributeToxic):
    """A TLS end the proxy plays on a connection: the bytes of one stream are TLS
    records, the other's plain bytes."""

    both_streams = True
    #: The stream whose bytes are TLS records (the other stream's are plain).
    records_on: ClassVar[str]

    def end_of(self, ctx: ToxicContext) -> Terminator | Originator:
        """The connection's TLS end, made on its first use."""
        raise NotImplementedError

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        end = self.end_of(ctx)
        records = ctx.stream == self.records_on
        commands = end.records_in(data) if records else end.plain_in(data)
        await _carry_out(cast(ToxicStage, ctx), end, commands)

    async def on_eof(self, ctx: ToxicContext) -> None:
        end = self.end_of(ctx)
        commands = end.records_eof() if ctx.stream == self.records_on else end.plain_eof()
        await _carry_out(cast(ToxicStage, ctx), end, commands)


@register
class TlsTerminate(_TlsEnd):
    """Terminate the client's TLS with a leaf from the throwaway CA for the name asked."""

    type = "tls_terminate"
    layer = 0
    records_on = "upstream"  # the client's records, from its side
    ATTRIBUTES = (
        TextAttribute(
            "hostnames", "localhost,127.0.0.1,::1", "names the leaf is for when no SNI came"
        ),
        TextAttribute(
            "alpn", "", "protocols accepted (ALPN), comma-separated; '' the upstream's choice"
        ),
        TextAttribute("ca_cert", "", "read only: the PEM file of the CA that signed it"),
    )
    hostnames: str
    alpn: str
    ca_cert: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ca_cert = ca_cert_path()

    def update(self, attributes: Mapping[str, Any]) -> None:
        super().update({k: v for k, v in attributes.items() if k != "ca_cert"})

    def end_of(self, ctx: ToxicContext) -> Terminator:
        end: Terminator | None = ctx.state.get("tls")
        if end is None:
            log = cast(ToxicStage, ctx).log_event
            end = ctx.state["tls"] = Terminator(_names(self.hostnames), _names(self.alpn), log)
        return end


@register
class TlsOriginate(_TlsEnd):
    """Speak TLS to the upstream, verifying it as ``ca`` says."""

    type = "tls_originate"
    layer = 2
    records_on = "downstream"  # the upstream's records, from its side
    ATTRIBUTES = (
        TextAttribute("ca", "", "'' the system's CAs, 'none' no check, or a PEM file's path"),
        TextAttribute(
            "server_name", "", "the name sent (SNI) and checked; '' the name the client asked"
        ),
        TextAttribute("cert", "", "a client certificate's PEM file (mTLS); '' none"),
        TextAttribute("key", "", "its private key's PEM file; '' in cert's file"),
    )
    ca: str
    server_name: str
    cert: str
    key: str
    _contexts: dict[bool, ssl.SSLContext]

    def check_update(self, attributes: Any) -> dict[str, Any]:
        """The checked *attributes*; ValueError (the API's 400) when the files they
        name with the values in force do not load: a CA file, a certificate, its key."""
        checked = self.check_attributes(attributes)
        _loaded({**self.attributes(), **checked})
        return checked

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Merge *attributes*, all or nothing; the context is made here, once, not per
        connection (a connection made before keeps the one it has)."""
        contexts = _loaded({**self.attributes(), **self.check_attributes(attributes)})
        super().update(attributes)
        self._contexts = contexts

    def end_of(self, ctx: ToxicContext) -> Originator:
        end: Originator | None = ctx.state.get("tls")
        if end is None:
            contexts = self._contexts

            def wrap(
                incoming: ssl.MemoryBIO,
                outgoing: ssl.MemoryBIO,
                name: str | None,
                alpn: tuple[str, ...],
            ) -> ssl.SSLObject:
                context = contexts[name is not None]
                # The list is copied into the SSLObject as it is made (SSL_new), so a
                # context shared by every connection may be set just before.
                context.set_alpn_protocols(list(alpn))
                return context.wrap_bio(incoming, outgoing, server_hostname=name)

            log = cast(ToxicStage, ctx).log_event
            end = ctx.state["tls"] = Originator(wrap, self.server_name or None, log)
        return end


def _loaded(values: Mapping[str, Any]) -> dict[bool, ssl.SSLContext]:
    """The client contexts *values* make (by whether a server name is checked), or
    ValueError naming the file that does not load: refused when the toxic is made (the
    API's 400), not when a connection needs it."""
    try:
        named = client_context(values["ca"], values["cert"], values["key"])
        anonymous = client_context(values["ca"], values["cert"], values["key"])
    except OSError as exc:  # ssl.SSLError included: the API's 400, not a 500
        which = " / ".join(
            f"{k} {values[k]!r}" for k in ("ca", "cert", "key") if values[k] not in ("", "none")
        )
        raise ValueError(f"attributes of tls_originate: cannot load {which}: {exc}") from None
    anonymous.check_hostname = False  # no name to check it against
    return {True: named, False: anonymous}


@register
class TlsHandshake(AttributeToxic):
    """Fault the handshake after the ClientHello: ``stall`` or ``reset``."""

    type = "tls_handshake"
    both_streams = True
    layer = 0
    ATTRIBUTES = (
        TextAttribute(
            "action", "stall", "'stall' or 'reset', after the ClientHello", ("stall", "reset")
        ),
    )
    action: str

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        up, down = _links(ctx)
        state = ctx.state
        if state.get("passed"):  # not TLS, or the toxic came after the handshake
            await ctx.forward(data, t_read)
            return
        if ctx.stream == "downstream":
            if not state.get("hello"):
                await ctx.forward(data, t_read)  # the server spoke first: not TLS
                return
            if not state.get("logged"):
                state["logged"] = True
                up.log_event("tls_fault", action=self.action)
            if self.action == "reset":
                await ctx.reset()
            return  # stall: the server's handshake never reaches the client
        if state.get("hello"):
            return  # stall: nothing after the ClientHello reaches the server either
        buf = state.setdefault("buf", bytearray())
        buf += data
        end = client_hello_end(bytes(buf))
        if end is None:
            return
        if end == -1:
            state["passed"] = True
        else:
            state["hello"] = True
        await ctx.forward(bytes(buf if end == -1 else buf[:end]), t_read)

    async def on_eof(self, ctx: ToxicContext) -> None:
        if ctx.state.get("hello"):
            return  # held: the stalled side hears nothing
        await ctx.forward_eof()
