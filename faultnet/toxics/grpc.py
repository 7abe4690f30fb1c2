"""``grpc_status``: answer a matching gRPC call with a status, as a failing server
does, without the server seeing it.

The answer is a trailers-only response (one HEADERS frame, END_STREAM): ``:status
200``, ``content-type: application/grpc``, ``grpc-status`` (``status``, by name:
``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``...) and ``grpc-message``
(``message``, percent-encoded). It is what grpcio's server sends when a handler aborts
before replying, so a client's retry policy treats it as it treats the real one
(tests/faultnet/toxics/test_http2_grpc.py holds the two side by side). The rule is the
HTTP toxics' (:mod:`faultnet.toxics.http`): ``path`` ``/pkg.Service/*`` picks a
service, ``/pkg.Service/Method`` one method. HTTP/2 only: an HTTP/1.1 request passes.
"""

from __future__ import annotations

from faultnet.protocols.http2 import GRPC_STATUS, StreamPlan, grpc_answer
from faultnet.toxics._attributes import TextAttribute
from faultnet.toxics.http import RULE_H2, HttpToxic, RequestHead
from faultnet.toxics.registry import register

__all__ = ["GrpcStatus"]


@register
class GrpcStatus(HttpToxic):
    """Answer a matching gRPC call with ``grpc-status`` ``status`` and ``message``."""

    type = "grpc_status"
    ATTRIBUTES = (
        *RULE_H2,
        TextAttribute(
            "status", "UNAVAILABLE", "the gRPC status answered, by name", tuple(GRPC_STATUS)
        ),
        TextAttribute("message", "injected by faultnet", "the grpc-message answered"),
    )
    status: str
    message: str
    http1 = False
    http2 = True

    def plan_h2(self, request: RequestHead) -> StreamPlan:
        detail: dict[str, object] = {"grpc_status": self.status}
        return StreamPlan("grpc_status", detail, answer=grpc_answer(self.status, self.message))
