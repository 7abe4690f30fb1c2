"""TLS toxics: termination (so the HTTP toxics see requests inside HTTPS),
re-origination towards the upstream, and faults on the handshake itself.

* ``tls_terminate`` (layer 0, outermost): the proxy is the client's TLS server, with a
  certificate for ``hostnames`` issued by this process's throwaway CA (trustme); the CA
  certificate's path is the read-only attribute ``ca_cert``, for ``curl --cacert`` and
  ``httpx.AsyncClient(verify=...)``. Without ``tls_originate`` the upstream gets plain
  bytes.
* ``tls_originate`` (layer 2, innermost): the proxy is the upstream's TLS client,
  verifying it against the system's CAs (``ca`` ``""``), a PEM file (``ca`` a path), or
  not at all (``ca`` ``"none"``), with SNI and the name checked from ``server_name``.
* ``tls_handshake``: without terminating anything, the client's ClientHello reaches the
  server and then ``action`` ``stall`` delivers nothing more either way (the client's
  handshake hangs until its own timeout) or ``reset`` resets the connection (RST both
  ways) when the server's first handshake bytes come back.

A connection the toxic is added to after its handshake is not re-read: add TLS toxics
before the clients connect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, cast

from faultnet.protocols.tls import (
    Originator,
    Terminator,
    ca_cert_path,
    client_context,
    client_hello_end,
    server_context,
)
from faultnet.toxics._attributes import AttributeToxic, TextAttribute
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = ["TlsHandshake", "TlsOriginate", "TlsTerminate"]


def _links(ctx: ToxicContext) -> tuple[ToxicStage, ToxicStage]:
    link = cast(ToxicStage, ctx)
    up, down = link.on("upstream"), link.on("downstream")
    assert up is not None and down is not None, "a TLS toxic sees both streams"
    return up, down


class _TlsEnd(AttributeToxic):
    """A TLS end the proxy plays on a connection: the bytes of one stream are TLS
    records, the other's plain bytes."""

    both_streams = True
    #: The stream whose bytes are TLS records (the other stream's are plain).
    records_on: ClassVar[str]

    def _end(self, ctx: ToxicContext) -> Terminator | Originator:
        """The connection's TLS end, made on its first bytes."""
        raise NotImplementedError

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        end = self._end(ctx)
        await (end.records_in(data) if ctx.stream == self.records_on else end.plain_in(data))

    async def on_eof(self, ctx: ToxicContext) -> None:
        end = self._end(ctx)
        await (end.records_eof() if ctx.stream == self.records_on else end.plain_eof())


@register
class TlsTerminate(_TlsEnd):
    """Terminate the client's TLS with a certificate from the throwaway CA."""

    type = "tls_terminate"
    layer = 0
    records_on = "upstream"  # the client's records, from its side
    ATTRIBUTES = (
        TextAttribute("hostnames", "localhost,127.0.0.1,::1", "names the certificate is for"),
        TextAttribute("ca_cert", "", "read only: the PEM file of the CA that signed it"),
    )
    hostnames: str
    ca_cert: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ca_cert = ca_cert_path()
        self._ctx = server_context(self._names())

    def _names(self) -> list[str]:
        return [n.strip() for n in self.hostnames.split(",") if n.strip()]

    def update(self, attributes: Mapping[str, Any]) -> None:
        attributes = {k: v for k, v in attributes.items() if k != "ca_cert"}
        super().update(attributes)
        if "hostnames" in attributes and hasattr(self, "_ctx"):
            self._ctx = server_context(self._names())  # for connections from now on

    def _end(self, ctx: ToxicContext) -> Terminator:
        end: Terminator | None = ctx.state.get("tls")
        if end is None:
            up, down = _links(ctx)
            end = ctx.state["tls"] = Terminator(self._ctx, up, down, up.log_event)
        return end


def _loadable_ca(ca: str) -> None:
    """A ``ca`` naming a file must load: a missing or malformed one is refused when the
    toxic is made (ValueError, the API's 400), not when a connection needs it."""
    if ca and ca != "none":
        try:
            client_context(ca)
        except OSError as exc:  # ssl.SSLError included: the API's 400, not a 500
            raise ValueError(f"attribute ca: cannot load {ca!r}: {exc}") from None


@register
class TlsOriginate(_TlsEnd):
    """Speak TLS to the upstream, verifying it as ``ca`` says."""

    type = "tls_originate"
    layer = 2
    records_on = "downstream"  # the upstream's records, from its side
    ATTRIBUTES = (
        TextAttribute(
            "ca",
            "",
            "'' the system's CAs, 'none' no check, or a PEM file's path",
            parse=_loadable_ca,
        ),
        TextAttribute("server_name", "", "the name sent (SNI) and checked; '' none"),
    )
    ca: str
    server_name: str

    def _end(self, ctx: ToxicContext) -> Originator:
        end: Originator | None = ctx.state.get("tls")
        if end is None:
            up, down = _links(ctx)
            name = self.server_name or None
            context = client_context(self.ca)
            if name is None:
                context.check_hostname = False
            end = ctx.state["tls"] = Originator(context, name, up, down, up.log_event)
        return end


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
