"""HTTP/2's own stream and connection faults on a matching request (the HTTP toxics'
rule, :mod:`faultnet.toxics.http`), neither of which HTTP/1.1 has. HTTP/2 only: an
HTTP/1.1 request passes.

* ``http2_reset``: RST_STREAM the request's stream with ``error_code`` (h2's names:
  ``REFUSED_STREAM`` tells the client the server did nothing, so it may retry at once;
  ``CANCEL``, ``INTERNAL_ERROR``...). The server never sees the request.
* ``http2_goaway``: GOAWAY with ``error_code``, its last stream the last request
  forwarded before this one: the server "did not process" this request nor will any
  later one on the connection, and none of them is forwarded. The connection stays
  open for the streams in flight; the client opens a new one for the rest.
"""

from __future__ import annotations

from h2.errors import ErrorCodes

from faultnet.protocols.http2 import StreamPlan
from faultnet.toxics._attributes import TextAttribute
from faultnet.toxics.http import RULE_H2, HttpToxic, RequestHead
from faultnet.toxics.registry import register

__all__ = ["Http2Goaway", "Http2Reset"]

_CODES = tuple(ErrorCodes.__members__)


class _ErrorCodeToxic(HttpToxic):
    """A type whose fault is one frame carrying ``error_code``."""

    error_code: str
    http1 = False
    http2 = True

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        return self.frame({"error_code": self.error_code}, int(ErrorCodes[self.error_code]))

    def frame(self, detail: dict[str, object], code: int) -> StreamPlan:
        """The plan that sends the frame with *code*."""
        raise NotImplementedError


def _code(default: str, what: str) -> TextAttribute:
    return TextAttribute("error_code", default, f"the {what}'s HTTP/2 error code, by name", _CODES)


@register
class Http2Reset(_ErrorCodeToxic):
    """RST_STREAM a matching request's stream with ``error_code``."""

    type = "http2_reset"
    ATTRIBUTES = (*RULE_H2, _code("REFUSED_STREAM", "RST_STREAM"))

    def frame(self, detail: dict[str, object], code: int) -> StreamPlan:
        return StreamPlan("rst_stream", detail, rst=code)


@register
class Http2Goaway(_ErrorCodeToxic):
    """GOAWAY at a matching request with ``error_code``: it and every later request
    on the connection are not forwarded."""

    type = "http2_goaway"
    ATTRIBUTES = (*RULE_H2, _code("NO_ERROR", "GOAWAY"))

    def frame(self, detail: dict[str, object], code: int) -> StreamPlan:
        return StreamPlan("goaway", detail, goaway=code)
