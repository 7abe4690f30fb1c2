"""HTTP/1.1 request-level toxics: each request judged on its own by a rule, and one
thing done to it, on top of :mod:`faultnet.protocols.http` (h11).

Every type here matches requests with the same attributes:

* ``method``: ``""`` any, else a comma-separated list (``"GET,HEAD"``), any case;
* ``path``: a glob on the target's path, query left out (``"/api/*"``; ``*`` crosses
  ``/``); ``""`` any;
* ``header``: ``""`` any; ``"Name"`` the header is present; ``"Name: glob"`` its value
  matches;
* ``percent``: 0-100, the share of matching requests faulted, drawn per request from the
  proxy's seed and the request's number among those this toxic matched (so the same
  seed and the same requests fault the same ones, however they spread over
  connections);
* ``count``: at most this many requests faulted (0: no limit), the first ones drawn:
  ``count=2`` fails the first two requests, for retry tests.

One ``http_fault`` record per faulted request goes to the event log (method, path,
action and its figures). Requests no rule faults cross byte-identical. Each type sees
both streams of a connection (``both_streams``), whatever its ``stream`` says.
"""

from __future__ import annotations

import fnmatch
import random
from typing import Any, ClassVar, cast

import h11
import trio

from faultnet.protocols.http import (
    Answer,
    Plan,
    Send,
    Session,
    answer_bytes,
    parse_header_lines,
    rewrite_head,
)
from faultnet.seeds import derive_seed
from faultnet.toxics._attributes import Attribute, AttributeToxic, TextAttribute
from faultnet.toxics.base import ToxicContext
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = [
    "HttpAbort",
    "HttpDelay",
    "HttpHeader",
    "HttpHold",
    "HttpReset",
    "HttpSlowBody",
    "HttpToxic",
    "HttpTruncate",
]


def _header_rule(text: str) -> None:
    """A rule's ``header``: ``Name`` alone matches its presence; ``Name: glob`` must be a
    header line (ValueError otherwise)."""
    if ":" in text:
        parse_header_lines(text)


RULE = (
    TextAttribute("method", "", "HTTP methods matched, comma-separated; empty: any"),
    TextAttribute("path", "", "glob on the request path (query excluded); empty: any"),
    TextAttribute(
        "header",
        "",
        "'Name' (present) or 'Name: glob' (value); empty: any",
        parse=_header_rule,
    ),
    Attribute("percent", 100, "percent of matching requests faulted, drawn per request", 0, 100),
    Attribute("count", 0, "most requests faulted (the first drawn); 0: no limit"),
)


class HttpToxic(AttributeToxic):
    """Base of the HTTP toxics: the rule (:data:`RULE`) and the per-connection session.
    A subclass adds its attributes and :meth:`plan`."""

    both_streams = True
    layer = 1
    ATTRIBUTES: ClassVar[tuple[Attribute | TextAttribute, ...]] = RULE
    method: str
    path: str
    header: str
    percent: int
    count: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Requests this toxic matched, and faulted, over every connection.
        self.matched = 0
        self.faulted = 0

    def plan(self, request: h11.Request) -> Plan:
        """What to do to *request*, which the rule picked."""
        raise NotImplementedError

    def matches(self, request: h11.Request) -> bool:
        """Whether the rule's method, path and header match *request* (not percent)."""
        method = request.method.decode("latin-1").upper()
        if self.method and method not in {
            m.strip().upper() for m in self.method.split(",") if m.strip()
        }:
            return False
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        if self.path and not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.header:
            name, sep, glob = self.header.partition(":")
            key, glob = name.strip().lower().encode("latin-1"), glob.strip()
            values = [v.decode("latin-1") for k, v in request.headers if k == key]
            if not values or (sep and not any(fnmatch.fnmatchcase(v, glob) for v in values)):
                return False
        return True

    def decide(self, request: h11.Request, seed: int) -> Plan | None:
        """The plan for *request*, or None to pass it: the rule, then the draw, then
        the count."""
        if not self.matches(request):
            return None
        index = self.matched
        self.matched += 1
        if self.count and self.faulted >= self.count:
            return None
        if self.percent < 100:
            draw = random.Random(derive_seed(seed, self.name, "request", index)).random()
            if draw * 100 >= self.percent:
                return None
        self.faulted += 1
        return self.plan(request)

    def _session(self, ctx: ToxicContext) -> Session:
        session: Session | None = ctx.state.get("http")
        if session is None:
            link = cast(ToxicStage, ctx)
            up, down = link.on("upstream"), link.on("downstream")
            assert up is not None and down is not None, "an HTTP toxic sees both streams"
            seed = link.seed
            session = Session(up, down, lambda r: self.decide(r, seed), link.log_event)
            ctx.state["http"] = session
        return session

    async def on_chunk(self, ctx: ToxicContext, data: bytes, t_read: float) -> None:
        session = self._session(ctx)
        if ctx.stream == "upstream":
            await session.upstream(data, t_read)
        else:
            await session.downstream(data, t_read)

    async def on_eof(self, ctx: ToxicContext) -> None:
        session = self._session(ctx)
        if ctx.stream == "upstream":
            await session.upstream_eof()
        else:
            await session.downstream_eof()


# -- abort and hold: the request never reaches the server ------------------------------


class _AbortPlan(Plan):
    action = "abort"

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.status, self.body, self.headers = status, body, headers
        self.detail = {"status": status}

    def answer(self, request: h11.Request) -> Answer:
        data = answer_bytes(self.status, self.body, self.headers, request.method == b"HEAD")
        return Answer(data)


@register
class HttpAbort(HttpToxic):
    """Answer a matching request with ``status`` (``body``, ``headers``: newline-separated
    ``Name: value`` lines) at once; the server never sees it. The answer keeps the
    connection open (keep-alive and pipelined requests go on, in order), except when the
    client waits for ``100 Continue``: then it says nothing of the body it did not read,
    and the connection closes after the answer."""

    type = "http_abort"
    ATTRIBUTES = (
        *RULE,
        Attribute("status", 503, "the status code answered", 100, 999),
        TextAttribute("body", "", "the body answered (UTF-8)"),
        TextAttribute(
            "headers", "", "headers answered: 'Name: value' lines", parse=parse_header_lines
        ),
    )
    status: int
    body: str
    headers: str

    def plan(self, request: h11.Request) -> Plan:
        return _AbortPlan(self.status, self.body.encode(), parse_header_lines(self.headers))


class _HoldPlan(Plan):
    action = "hold"
    hold = True


@register
class HttpHold(HttpToxic):
    """Never answer a matching request: it is not forwarded, and neither is anything the
    client sends after it on that connection (its FIN included), so the client waits
    until its own timeout. Responses to earlier requests still arrive."""

    type = "http_hold"
    ATTRIBUTES = RULE

    def plan(self, request: h11.Request) -> Plan:
        return _HoldPlan()


# -- the response: delayed, slowed, cut ------------------------------------------------


class _DelayPlan(Plan):
    action = "delay"

    def __init__(self, seconds: float, before_body: bool) -> None:
        self.seconds, self.before_body = seconds, before_body
        self.detail = {
            "delay_ms": round(seconds * 1000),
            "before": "body" if before_body else "headers",
        }
        self._waited = False

    async def response_head(self, send: Send, head: bytes) -> None:
        if not self.before_body:
            await send.sleep(self.seconds)
        await send(head)

    async def response_body(self, send: Send, data: bytes) -> None:
        if self.before_body and not self._waited:
            self._waited = True
            await send.sleep(self.seconds)
        await send(data)


@register
class HttpDelay(HttpToxic):
    """Hold a matching request's response ``delay`` ms before its headers leave, or
    (``before`` = ``body``) send the headers at once and hold the body ``delay`` ms. The
    time runs from when the response's head (or first body byte) reached the proxy."""

    type = "http_delay"
    ATTRIBUTES = (
        *RULE,
        Attribute("delay", 0, "time the response is held, in milliseconds"),
        TextAttribute(
            "before", "headers", "'headers' or 'body': what the delay holds", ("headers", "body")
        ),
    )
    delay: int
    before: str

    def plan(self, request: h11.Request) -> Plan:
        return _DelayPlan(self.delay / 1000, self.before == "body")


class _SlowBodyPlan(Plan):
    action = "slow_body"

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.detail = {"rate": rate}
        self._start: float | None = None
        self._sent = 0

    async def response_body(self, send: Send, data: bytes) -> None:
        if self._start is None:
            self._start = trio.current_time()
        # About 20 writes a second: smooth enough for a client's progress, few enough
        # not to cost the proxy.
        piece = max(1, self.rate // 20)
        for i in range(0, len(data), piece):
            await send.sleep_until(self._start + self._sent / self.rate)
            chunk = data[i : i + piece]
            await send(chunk)
            self._sent += len(chunk)


@register
class HttpSlowBody(HttpToxic):
    """Send a matching request's response body at ``rate`` bytes per second (the head at
    once; the body's wire bytes, chunked framing included, paced from its first byte)."""

    type = "http_slow_body"
    ATTRIBUTES = (*RULE, Attribute("rate", 1000, "body bytes per second", 1))
    rate: int

    def plan(self, request: h11.Request) -> Plan:
        return _SlowBodyPlan(self.rate)


class _CutPlan(Plan):
    def __init__(self, action: str, limit: int) -> None:
        self.action = action
        self.detail = {"bytes": limit}
        self._left = limit

    async def _cut(self, send: Send) -> None:
        await (send.reset() if self.action == "reset" else send.close())

    async def response_head(self, send: Send, head: bytes) -> None:
        await send(head)
        if self._left <= 0:
            await self._cut(send)

    async def response_body(self, send: Send, data: bytes) -> None:
        if self._left <= 0:
            return
        await send(data[: self._left])
        self._left -= len(data)
        if self._left <= 0:
            await self._cut(send)


@register
class HttpTruncate(HttpToxic):
    """Send a matching request's response head and the first ``bytes`` bytes of its
    body (wire bytes), then close the connection (FIN both ways): the client reads a
    body shorter than its Content-Length, or a chunked body without its last chunk. A
    body no longer than ``bytes`` minus its framing passes whole (a FIN still follows
    its last byte when it reaches exactly ``bytes``)."""

    type = "http_truncate"
    ATTRIBUTES = (*RULE, Attribute("bytes", 0, "body bytes sent before the connection closes"))
    bytes: int

    def plan(self, request: h11.Request) -> Plan:
        return _CutPlan("truncate", self.bytes)


@register
class HttpReset(HttpToxic):
    """As ``http_truncate``, but the connection is reset (RST both ways: the client sees
    ECONNRESET mid-body) after ``bytes`` body bytes."""

    type = "http_reset"
    ATTRIBUTES = (*RULE, Attribute("bytes", 0, "body bytes sent before the connection is reset"))
    bytes: int

    def plan(self, request: h11.Request) -> Plan:
        return _CutPlan("reset", self.bytes)


# -- headers ---------------------------------------------------------------------------


class _HeaderPlan(Plan):
    action = "header"

    def __init__(self, add: list[tuple[str, str]], remove: set[str], on_request: bool) -> None:
        self.add, self.remove, self.on_request = add, remove, on_request
        self.detail = {
            "on": "request" if on_request else "response",
            "added": [n for n, _ in add],
            "removed": sorted(remove),
        }

    def rewrite_request_head(self, head: bytes) -> bytes:
        return rewrite_head(head, self.add, self.remove) if self.on_request else head

    async def response_head(self, send: Send, head: bytes) -> None:
        await send(head if self.on_request else rewrite_head(head, self.add, self.remove))


@register
class HttpHeader(HttpToxic):
    """Add headers to (``add``: ``Name: value`` lines) and remove headers from
    (``remove``: comma-separated names) a matching request's response, or (``on`` =
    ``request``) the request itself before the server reads it. Every other byte of the
    head is kept; removing ``Content-Length`` or ``Transfer-Encoding`` breaks the message
    on purpose."""

    type = "http_header"
    ATTRIBUTES = (
        *RULE,
        TextAttribute("add", "", "headers added: 'Name: value' lines", parse=parse_header_lines),
        TextAttribute("remove", "", "header names removed, comma-separated"),
        TextAttribute(
            "on",
            "response",
            "'response' or 'request': which head is changed",
            ("response", "request"),
        ),
    )
    add: str
    remove: str
    on: str

    def plan(self, request: h11.Request) -> Plan:
        remove = {n.strip().lower() for n in self.remove.split(",") if n.strip()}
        return _HeaderPlan(parse_header_lines(self.add), remove, self.on == "request")
