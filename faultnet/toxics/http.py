"""HTTP/1.1 request-level toxics: each request judged on its own by a rule, and one
thing done to it, on top of :mod:`faultnet.protocols.http` (h11).

Every type here matches requests with the same attributes:

* ``method``: ``""`` any, else a comma-separated list (``"GET,HEAD"``), any case;
* ``path``: a glob on the target's path, query left out (``"/api/*"``; ``*`` crosses
  ``/``); ``""`` any;
* ``header``: ``""`` any; ``"Name"`` the header is present; ``"Name: glob"`` its value
  matches;
* ``percent``: 0-100, the share of matching requests faulted, drawn per request from the
  proxy's seed, the toxic's name and the request's identity (:func:`request_identity`:
  its method, its target, and its ``X-Request-Id`` if it has one, else its ordinal on
  its connection). Only the client decides an identity, never the arrival order, so the
  same seed faults the same requests however concurrent clients interleave (issue 33:
  the draw followed arrival, so another interleaving faulted other requests). Two
  requests with one identity share their fate;
* ``count``: at most this many requests faulted (0: no limit), the first ones drawn:
  ``count=2`` fails the first two requests, for retry tests. Which ones are first is
  the arrival order's to say;
* ``client_faults``: 1 lets a matching request pick its own fault by a header (as
  Envoy's ``x-envoy-fault-*-request`` headers do), instead of this toxic's:
  ``X-Faultnet-Abort-Request: 503`` (a status, 200-599) answers it with that status,
  ``X-Faultnet-Reset-Request`` (any value) resets the connection when it comes, and
  ``X-Faultnet-Delay-Request: 250`` (ms, 0-3,600,000) holds the request that long
  before the server sees any of it (as Envoy's does; the client's stream is not read
  meanwhile, so a client that gives up is noticed only after the time). One fault a request, the first of abort, reset, delay it names; a value not
  understood faults nothing. ``percent`` and ``count`` do not apply to them. The
  headers are removed before the request goes upstream. 0 (the default): they are
  ordinary headers, passed on.

One ``http_fault`` record per faulted request goes to the event log (method, path,
action and its figures; ``by`` = ``header`` for a fault the client picked) when the
fault takes effect: an abort, hold, reset or request delay when the request comes, a
response's fault when its response does. Requests no rule faults cross byte-identical.
Each type sees both streams of a connection (``both_streams``), whatever its ``stream``
says.

HTTP/2 and gRPC: a connection that opens with the HTTP/2 preface (h2c with prior
knowledge, or HTTP/2 inside ``tls_terminate``) runs the HTTP/2 session
(:mod:`faultnet.protocols.http2`) instead, with the same rule on each stream's request
(``method`` and ``path`` are ``:method`` and ``:path``: a gRPC call is ``POST
/pkg.Service/Method``; ``header`` sees ``host`` from ``:authority``), the same seeded
``percent`` (a stream's ordinal counts the requests on its connection) and ``count``.
``http_abort`` answers with a HEADERS frame (``:status``, END_STREAM; ``body`` as DATA),
``http_hold`` never forwards the stream, ``http_delay`` and ``http_slow_body`` act on
its response's frames; ``grpc_status``, ``http2_reset`` and ``http2_goaway``
(:mod:`faultnet.toxics.grpc`, :mod:`faultnet.toxics.http2`) fault HTTP/2 only.
``http_truncate``, ``http_reset``, ``http_header`` and ``client_faults`` have no HTTP/2
form: such a toxic passes HTTP/2 untouched. A request an HTTP/2 toxic does not fault
crosses byte-identical.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Sequence
from typing import ClassVar, Protocol

import h11

from faultnet.protocols.http import (
    Answer,
    Close,
    Plan,
    Reset,
    Session,
    parse_header_lines,
    rewrite_head,
)
from faultnet.protocols.http2 import Session as Http2Session
from faultnet.protocols.http2 import StreamPlan
from faultnet.protocols.http_front import Front
from faultnet.toxics._attributes import Attribute, TextAttribute
from faultnet.toxics._protocol import ProtocolToxic, TimedSession, carry_out, drawn_attributes
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
    "RULE",
    "RULE_H2",
    "RequestHead",
    "TimedSession",
    "carry_out",
    "client_plan",
    "request_identity",
]


class RequestHead(Protocol):
    """What a rule reads of a request, HTTP/1.1's (``h11.Request``) or HTTP/2's
    (:class:`faultnet.protocols.http2.H2Request`): header names in lower case."""

    @property
    def method(self) -> bytes: ...

    @property
    def target(self) -> bytes: ...

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]: ...


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
    *drawn_attributes("request", "requests"),
    Attribute(
        "client_faults", 0, "a flag (0 or 1): X-Faultnet-*-Request headers pick the fault", 0, 1
    ),
)

#: The rule of the HTTP/2-only types: ``client_faults`` is HTTP/1.1's.
RULE_H2 = tuple(a for a in RULE if a.name != "client_faults")

#: How a cut ends the connection (``http_truncate``'s FIN, ``http_reset``'s RST).
Cut = type[Close] | type[Reset]

#: The request headers a client picks its fault with (``client_faults``), lower case.
ABORT_HEADER = "x-faultnet-abort-request"
RESET_HEADER = "x-faultnet-reset-request"
DELAY_HEADER = "x-faultnet-delay-request"
FAULT_HEADERS = frozenset({ABORT_HEADER, RESET_HEADER, DELAY_HEADER})


def _number(value: str | None, low: int, high: int) -> int | None:
    # isascii: str.isdigit takes "\xb2" (a superscript two, in latin-1), int() does not.
    if value is None or not (value.strip().isascii() and value.strip().isdigit()):
        return None
    number = int(value)
    return number if low <= number <= high else None


def client_plan(request: h11.Request) -> Plan | None:
    """The fault *request*'s own headers pick (see ``client_faults``), with a rewrite
    of its head that removes them; None if it carries none of them."""
    found: dict[str, str] = {}
    for key, value in request.headers:
        name = key.decode("latin-1")
        if name in FAULT_HEADERS:
            found.setdefault(name, value.decode("latin-1"))
    if not found:
        return None

    def strip(head: bytes) -> bytes:
        return rewrite_head(head, [], set(FAULT_HEADERS))

    status = _number(found.get(ABORT_HEADER), 200, 599)
    if status is not None:
        return Plan("abort", {"status": status, "by": "header"}, answer=Answer(status))
    if RESET_HEADER in found:
        return Plan("reset", {"bytes": None, "by": "header"}, reset=True)
    delay = _number(found.get(DELAY_HEADER), 0, 3_600_000)
    if delay:
        detail: dict[str, object] = {"delay_ms": delay, "before": "request", "by": "header"}
        return Plan("delay", detail, request_head=strip, delay_request=delay / 1000)
    return Plan(request_head=strip)


def request_identity(request: RequestHead, ordinal: int) -> tuple[str, str, str]:
    """What a seeded draw knows *request* by: its method, its target (as sent), and its
    first ``X-Request-Id`` value, or, with none, ``#`` and *ordinal*, its place (from 0)
    among the requests on its connection. All of it is the client's to choose."""
    ids = [v for k, v in request.headers if k == b"x-request-id"]
    key = "id=" + ids[0].decode("latin-1") if ids else f"#{ordinal}"
    return request.method.decode("latin-1"), request.target.decode("latin-1"), key


class HttpToxic(ProtocolToxic):
    """Base of the HTTP toxics: the rule (:data:`RULE`) and the per-connection session.
    A subclass adds its attributes and :meth:`plan`."""

    session_key = "http"
    ATTRIBUTES: ClassVar[tuple[Attribute | TextAttribute, ...]] = RULE
    method: str
    path: str
    header: str
    client_faults: int
    #: Whether the type faults HTTP/1.1 requests (:meth:`plan`), and HTTP/2 ones
    #: (:meth:`plan_h2`); a type without a form for one passes that one untouched.
    http1: ClassVar[bool] = True
    http2: ClassVar[bool] = False

    def plan(self, request: h11.Request) -> Plan:
        """What to do to *request*, which the rule picked."""
        raise NotImplementedError

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        """What to do to an HTTP/2 stream whose request the rule picked (``http2``)."""
        raise NotImplementedError

    def matches(self, request: RequestHead) -> bool:
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

    def decide(self, request: h11.Request, seed: int, ordinal: int = 0) -> Plan | None:
        """The plan for *request*, the *ordinal*-th (from 0) on its connection, or None
        to pass it: the rule, then the client's own fault (``client_faults``), then the
        count, then the draw."""
        if not self.http1 or not self.matches(request):
            return None
        if self.client_faults:
            chosen = client_plan(request)
            if chosen is not None:
                return chosen
        return self.plan(request) if self._drawn_request(request, seed, ordinal) else None

    def decide_h2(self, request: RequestHead, seed: int, ordinal: int) -> StreamPlan | None:
        """:meth:`decide` for an HTTP/2 stream's request (no ``client_faults``)."""
        if not self.http2 or not self.matches(request):
            return None
        return self.plan_h2(request) if self._drawn_request(request, seed, ordinal) else None

    def _drawn_request(self, request: RequestHead, seed: int, ordinal: int) -> bool:
        """Whether a request the rule matched is faulted: the count, then the draw."""
        return self._drawn(seed, "request", lambda: request_identity(request, ordinal))

    def new_session(self, stage: ToxicStage) -> Front:
        seed, log = stage.seed, stage.log_event
        ordinals = itertools.count()  # every request on this connection, in order

        def http1() -> Session:
            return Session(lambda r: self.decide(r, seed, next(ordinals)), log)

        def http2() -> Http2Session:
            return Http2Session(lambda r: self.decide_h2(r, seed, next(ordinals)), log)

        return Front(http1, http2)


# -- abort and hold: the request never reaches the server ------------------------------


@register
class HttpAbort(HttpToxic):
    """Answer a matching request with ``status`` (``body``, ``headers``: newline-separated
    ``Name: value`` lines) at once; the server never sees it. The answer keeps the
    connection open (keep-alive and pipelined requests go on, in order), except when the
    client will send no other request (HTTP/1.0 without keep-alive, ``Connection:
    close``) or waits for ``100 Continue`` (the body it did not send would read as a
    request): then the answer says ``Connection: close`` and the connection closes after
    it. A 1xx, 204 or 304 answer carries no body, whatever ``body`` says."""

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
    http2 = True

    def plan(self, request: h11.Request) -> Plan:
        answer = Answer(self.status, self.body.encode(), parse_header_lines(self.headers))
        return Plan("abort", {"status": self.status}, answer=answer)

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        headers = [(":status", str(self.status))]
        headers += [(n.lower(), v) for n, v in parse_header_lines(self.headers)]
        body = self.body.encode()
        return StreamPlan("abort", {"status": self.status}, answer=headers, body=body)


@register
class HttpHold(HttpToxic):
    """Never answer a matching request: it is not forwarded, and neither is anything the
    client sends after it on that connection (its FIN included), so the client waits
    until its own timeout. Responses to earlier requests still arrive, and so does the
    server's FIN; once client and server have both gone, the connection ends."""

    type = "http_hold"
    ATTRIBUTES = RULE
    http2 = True

    def plan(self, request: h11.Request) -> Plan:
        return Plan("hold", hold=True)

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        return StreamPlan("hold", hold=True)


# -- the response: delayed, slowed, cut ------------------------------------------------


@register
class HttpDelay(HttpToxic):
    """Hold a matching request's response ``delay`` ms before its headers leave, or
    (``before`` = ``body``) send the headers at once and hold the body ``delay`` ms. The
    time runs from when the response's head (or first body byte) reached the proxy.

    ``before`` = ``request`` holds the request instead, ``delay`` ms from when its head
    reached the proxy, before the server sees any of it (a slow route or queue in front
    of the server, where the response-side delays are a slow server): the client's
    stream is not read meanwhile, so what it sent behind the request on that connection
    waits too, in order, and a client that gives up is noticed only after the time."""

    type = "http_delay"
    ATTRIBUTES = (
        *RULE,
        Attribute("delay", 0, "time held, in milliseconds"),
        TextAttribute(
            "before",
            "headers",
            "'headers' or 'body' (of the response) or 'request': what the delay holds",
            ("headers", "body", "request"),
        ),
    )
    delay: int
    before: str
    http2 = True

    def plan(self, request: h11.Request) -> Plan:
        detail: dict[str, object] = {"delay_ms": self.delay, "before": self.before}
        if self.before == "request":
            return Plan("delay", detail, delay_request=self.delay / 1000)
        return Plan("delay", detail, delay=self.delay / 1000, delay_body=self.before == "body")

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        detail: dict[str, object] = {"delay_ms": self.delay, "before": self.before}
        body = self.before == "body"
        return StreamPlan("delay", detail, delay=self.delay / 1000, delay_body=body)


@register
class HttpSlowBody(HttpToxic):
    """Send a matching request's response body at ``rate`` bytes per second (the head at
    once; the body's wire bytes, chunked framing included, paced from its first byte)."""

    type = "http_slow_body"
    ATTRIBUTES = (*RULE, Attribute("rate", 1000, "body bytes per second", 1))
    rate: int
    http2 = True

    def plan(self, request: h11.Request) -> Plan:
        return Plan("slow_body", {"rate": self.rate}, rate=self.rate)

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        return StreamPlan("slow_body", {"rate": self.rate}, rate=self.rate)


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
    #: How the connection ends after ``bytes``, and the fault's name in the event log.
    cut: ClassVar[Cut] = Close
    action: ClassVar[str] = "truncate"

    def plan(self, request: h11.Request) -> Plan:
        return Plan(self.action, {"bytes": self.bytes}, cut=self.cut, cut_after=self.bytes)


@register
class HttpReset(HttpTruncate):
    """As ``http_truncate``, but the connection is reset (RST both ways: the client sees
    ECONNRESET mid-body) after ``bytes`` body bytes."""

    type = "http_reset"
    ATTRIBUTES = (*RULE, Attribute("bytes", 0, "body bytes sent before the connection is reset"))
    cut = Reset
    action = "reset"


# -- headers ---------------------------------------------------------------------------


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
        add = parse_header_lines(self.add)
        detail: dict[str, object] = {
            "on": self.on,
            "added": [n for n, _ in add],
            "removed": sorted(remove),
        }

        def rewrite(head: bytes) -> bytes:
            return rewrite_head(head, add, remove)

        if self.on == "request":
            return Plan("header", detail, request_head=rewrite)
        return Plan("header", detail, response_head=rewrite)
