"""DNS over TCP: the UDP proxy's ``dns`` faults on the TCP proxy, as one toxic type.

``dns`` reads the client's queries (2-byte length-prefixed frames, RFC 1035 4.2.2,
:mod:`faultnet.protocols.dns_tcp`) and judges each with the same decider as the UDP
proxy's ``dns`` row (:mod:`faultnet.protocols.dns`: its table says what each action
does): ``servfail``, ``nxdomain``, ``refused`` answer at once, the server never asked;
``drop`` forwards nothing (the client's read times out; queries after it on the
connection still cross); ``delay`` forwards the query ``delay_ms`` late, and with it
every query sent after it on that connection (a TCP stream keeps its order); ``truncate``
and ``rewrite`` change the answer on its way back. The attributes are the UDP row's
arguments: ``action``, ``qname`` (glob), ``qtype``, ``percent`` (drawn per query from the
proxy's seed, the name, type and id), ``count``, ``delay_ms``, ``address``.

One type with an ``action`` attribute rather than a type per action (``dns_servfail``,
``dns_drop``...): the UDP row is one mode with an ``action`` argument, so a rule reads
the same on both transports; the actions share every other attribute; and a switch of
action is a live update of one toxic, not a remove and an add.

One ``dns_fault`` record per faulted query. Frames no rule faults cross byte-identical;
the bytes of a frame not yet whole wait for its rest (a stream's last, incomplete frame
is passed on at its end). The toxic sees both streams (``both_streams``), whatever its
``stream`` says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, cast

import trio

from faultnet.protocols.dns import ACTIONS, QTYPES, DnsFaults, DnsRule
from faultnet.protocols.dns_tcp import DnsTcpSession
from faultnet.toxics._attributes import Attribute, AttributeToxic, TextAttribute
from faultnet.toxics._protocol import drawn_attributes
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = ["Dns"]


def _address(text: str) -> None:
    if text:
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"address must be an IPv4 or IPv6 address, not {text!r}") from None


@register
class Dns(AttributeToxic):
    """DNS faults on the queries a client sends over TCP (see the module docstring):
    the queries matching ``qname`` and ``qtype``, ``percent`` of them, the first
    ``count`` (0: all), meet ``action``."""

    type = "dns"
    both_streams = True
    layer = 1
    ATTRIBUTES = (
        TextAttribute("action", "servfail", "what is done to a matching query", choices=ACTIONS),
        TextAttribute("qname", "*", "a glob on the query name, any case, trailing dot or not"),
        TextAttribute("qtype", "any", "the query type matched", choices=QTYPES),
        *drawn_attributes("query", "queries"),
        Attribute(
            "delay_ms", 0, "how late a delayed query is forwarded, in milliseconds (action delay)"
        ),
        TextAttribute("address", "", "the address a rewritten answer gives", parse=_address),
    )
    action: str
    qname: str
    qtype: str
    percent: int
    count: int
    delay_ms: int
    address: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The decider shared by every connection (the rule, its counts, the answers
        #: awaited); its seed is the proxy's, set at a connection's first bytes.
        self.faults = DnsFaults()
        super().__init__(*args, **kwargs)

    def check_update(self, attributes: Any) -> dict[str, Any]:
        """The checked *attributes*; ValueError when the rule they make with the values
        in force is refused (``delay`` without ``delay_ms``, ``delay_ms`` without
        ``delay``, ``rewrite`` without ``address``...)."""
        checked = self.check_attributes(attributes)
        DnsRule(**{**self.attributes(), **checked})
        return checked

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Merge *attributes*, all or nothing (refused as :meth:`check_update` says)."""
        rule = DnsRule(**{**self.attributes(), **self.check_attributes(attributes)})
        old = self.faults.rules[0] if self.faults.rules else None
        if old is not None:
            rule.matched, rule.faulted = old.matched, old.faulted
        super().update(attributes)
        self.faults.rules[:] = [rule]

    def _session(self, ctx: ToxicContext) -> DnsTcpSession:
        session: DnsTcpSession | None = ctx.state.get("dns")
        if session is None:
            stage = cast(ToxicStage, ctx)
            self.faults.seed = stage.seed
            session = ctx.state["dns"] = DnsTcpSession(self.faults, stage.conn_id)
        return session

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        session = self._session(ctx)
        stage = cast(ToxicStage, ctx)
        if ctx.stream == "downstream":
            out = session.answers(data)
            if out:
                await ctx.forward(out, t_read)
            return
        for decision, query in session.queries(data):
            if decision.fault is not None:
                stage.log_event("dns_fault", **decision.to_event())
            if decision.verdict == "answer":
                client = stage.on("downstream")
                assert client is not None, "a dns toxic sees both streams"
                await client.inject(decision.reply)
            elif decision.verdict == "forward":
                if decision.delay_s:
                    # In this stream's task: the queries after it wait too, in order.
                    await trio.sleep(decision.delay_s)
                    t_read = trio.current_time()
                await ctx.forward(query, t_read)

    async def on_eof(self, ctx: ToxicContext) -> None:
        rest = self._session(ctx).rest(ctx.stream)
        if rest:
            await ctx.forward(rest, trio.current_time())
        await ctx.forward_eof()
