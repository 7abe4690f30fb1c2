"""The HTTP API: Toxiproxy's routes, bodies and errors, plus faultnet's modes.

A Starlette ASGI app (:func:`create_app`) over a :class:`ProxyRegistry`, served by
our own HTTP/1.1 server on trio and h11 (:func:`serve_api`, :func:`open_server`). The OpenAPI document
is at ``GET /openapi.json``.

Error contract: every error is ``{"error": <message>, "status": <code>}`` with
Toxiproxy's codes and messages. A client's mistake is always a 4xx; the only 5xx a
client can cause is Toxiproxy's 500 for a listen address in use. An unexpected failure
in a handler answers 500 with its message and is logged; the server goes on serving.

A web page must not be able to drive the API from a developer's browser, so three
checks answer 403 (:class:`BrowserBlock`; only ``GET /openapi.json`` is exempt): a
User-Agent starting with ``Mozilla/`` (as Toxiproxy does); a ``Host`` that is neither
the address the request reached, nor a loopback name (``localhost``, ``*.localhost``,
127.0.0.0/8, ``::1``), nor a name the server was told to answer to (DNS rebinding: a
page at ``evil.example`` whose name was re-pointed at 127.0.0.1 sends ``Host:
evil.example``, whatever agent it claims); and an ``Origin`` other than the API's own
(a cross-origin request from a page, which the API never serves).
"""

from __future__ import annotations

import functools
import hmac
import inspect
import json
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import outcome
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from faultnet._version import __version__
from faultnet.addresses import is_loopback
from faultnet.server.metrics import (
    CONTENT_TYPE,
    NO_METRICS,
    EventCounters,
    MetricsOptions,
    Snapshot,
    render,
    snapshot,
)
from faultnet.server.openapi import openapi_document
from faultnet.server.registry import ApiError, ProxyRegistry, bad_body, open_registry
from faultnet.server.toxic_codec import toxic_to_json

__all__ = ["RunningServer", "create_app", "open_server", "serve_api"]

#: Larger request bodies are refused with 413 (a populate of thousands of proxies fits).
MAX_BODY_BYTES = 1 << 20
#: A request body must arrive within this many seconds of the handler's first read.
BODY_TIMEOUT_S = 10.0
#: A request's head must be complete this many seconds after its first byte, else the
#: connection is closed. (Under hypercorn this timeout also ran while a connection was
#: idle, and a request sent after it fired got no answer and then an RST; our server's
#: idle wait is :data:`KEEP_ALIVE_TIMEOUT_S` alone.)
READ_TIMEOUT_S = 60
#: An idle keep-alive connection is closed after this many seconds. hypercorn's 5 s
#: raced clients that reuse a pooled connection: a request sent as the close was on its
#: way got none (RemoteDisconnected, issue 35 item 4; a loaded machine widens the
#: window). Longer than Go's 90 s pool (Toxiproxy's client), so its client closes
#: first; Toxiproxy's own server never closes an idle connection.
KEEP_ALIVE_TIMEOUT_S = 120
#: The Toxiproxy API version whose routes and bodies this server answers.
TOXIPROXY_API_VERSION = "2.12.0"

#: A starlette endpoint.
HttpEndpoint = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status_code=status)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _BodyRefused(ApiError):
    """An answer given without reading the request body to its end (413, 408).

    The connection cannot carry another request after it (the rest of the body is still
    on its way), so the server closes it; the answer says ``Connection: close`` so that a
    keep-alive client knows before sending its next request on it. Without the header a
    client that reused the connection lost that request whenever the close reached it
    late ("Server disconnected without sending a response").
    """


async def _read_body(request: Request) -> bytes:
    """The request body's bytes, read on the API's side.

    A body over :data:`MAX_BODY_BYTES` is a 413, without reading the rest of it; a body
    not complete within :data:`BODY_TIMEOUT_S` is a 408 (headers sent, body stalled: the
    handler does not wait forever). Both close the connection (:class:`_BodyRefused`).
    """
    too_large = _BodyRefused(413, f"bad request body: larger than {MAX_BODY_BYTES} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    raw = bytearray()
    with trio.move_on_after(BODY_TIMEOUT_S) as late:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise too_large
    if late.cancelled_caught:
        raise _BodyRefused(408, f"bad request body: not received within {BODY_TIMEOUT_S} s")
    return bytes(raw)


def _parse_json(raw: bytes, schema: BodySchema | None = None) -> Any:
    """The request body as JSON (whatever its Content-Type, as Toxiproxy reads it); a
    body that is not is Toxiproxy's 400, and so is a JSON null where *schema* (the
    route's, from the OpenAPI document) does not declare one nullable."""
    if not raw.strip():
        raise bad_body("EOF")  # what Toxiproxy's decoder says for an empty body
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise bad_body(str(exc) or type(exc).__name__) from None
    if schema is not None:
        schema.refuse_nulls(body)
    return body


@dataclass(frozen=True)
class BodySchema:
    """A request body's schema in the OpenAPI document (*components* resolve its
    ``$ref`` entries): the one statement of which fields may be JSON null.

    Before, a null anywhere meant "the default" (17 schemathesis findings, issue 35
    item 7): ``{"enabled": null}`` kept a proxy as it was, a null toxicity was 1.0. A
    field the document does not declare (``nullable``) is now refused with a 400 naming
    it; a key the document does not know is ignored, as Toxiproxy ignores it (its Go
    client sends ``"toxics": null`` with every proxy it creates).
    """

    schema: dict[str, Any]
    components: dict[str, Any]

    def refuse_nulls(self, body: Any) -> None:
        """Raise a 400 for the first null in *body* the schema does not allow; a body
        that is not of the schema's shape is left to the handler to refuse."""
        schema = self._resolve(self.schema)
        if isinstance(body, list) and "items" in schema:  # /populate: "at proxy N"
            for i, item in enumerate(body, 1):
                self._refuse_in(item, schema["items"], f" at proxy {i}")
        else:
            self._refuse_in(body, schema, "")

    def _refuse_in(self, body: Any, schema: dict[str, Any], where: str) -> None:
        if isinstance(body, dict):  # null itself is the handler's "expected an object"
            field = self._null_field(body, schema)
            if field is not None:
                raise bad_body(f"{field} must not be null{where}")

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        return self.components[ref.rpartition("/")[2]] if isinstance(ref, str) else schema

    def _null_field(self, value: Any, schema: dict[str, Any]) -> str | None:
        """Where in *value* a null is not allowed by *schema*: ``""`` for *value*
        itself, a path (``attributes.latency``, ``connections[0]``), or None."""
        schema = self._resolve(schema)
        if value is None:
            return None if schema.get("nullable") else ""
        parts: Iterable[tuple[str, Any, dict[str, Any] | None]] = ()
        if isinstance(value, dict):
            properties = schema.get("properties", {})
            parts = ((f".{k}", v, properties.get(k)) for k, v in value.items())
        elif isinstance(value, list) and "items" in schema:
            parts = ((f"[{i}]", v, schema["items"]) for i, v in enumerate(value))
        for step, item, sub in parts:
            if sub is None:
                continue  # a key the document does not declare: ignored
            inner = self._null_field(item, sub)
            if inner is not None:
                return (step + inner).removeprefix(".")
        return None


def _query_int(request: Request, key: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw) <= hi:
        raise ApiError(400, f"bad request: {key} must be an integer from {lo} to {hi}")
    return int(raw)


class TokenRequired:
    """Refuse requests without ``Authorization: Bearer <token>`` (401), except
    ``GET /openapi.json``. For a server exposed beyond loopback."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/openapi.json":
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(
                    {"error": "missing or wrong token", "status": 401}, status_code=401
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


_AGENT_REFUSED = "User agent not allowed"  # Toxiproxy's words


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` header value, without port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_loopback_name(host: str) -> bool:
    return is_loopback(host) or host.endswith(".localhost")


class BrowserBlock:
    """Refuse what only a browser sends (403, one JSON error saying which check): a
    ``Mozilla/`` User-Agent, a ``Host`` that is not this server's (DNS rebinding) and a
    cross-origin ``Origin``. Toxiproxy's clients send none of these."""

    def __init__(self, app: ASGIApp, allow_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allow_hosts = {_host_name(h) for h in allow_hosts}

    def refusal(self, scope: Scope) -> str | None:
        """Why the request in *scope* is refused, or None."""
        headers = dict(scope.get("headers", []))
        agent = headers.get(b"user-agent", b"")
        if agent.startswith(b"Mozilla/"):
            return _AGENT_REFUSED
        raw_host = headers.get(b"host")
        if raw_host is not None:
            host_text = raw_host.decode("latin-1")
            host = _host_name(host_text)
            here = scope.get("server") or (None, None)
            if not (
                _is_loopback_name(host) or host == str(here[0]).lower() or host in self.allow_hosts
            ):
                return (
                    f"Host {host_text!r} is not this server's address nor a loopback name "
                    "(refused as DNS rebinding; faultnet server --allow-host NAME admits it)"
                )
        origin = headers.get(b"origin")
        if origin is not None:
            own = b"http://" + (raw_host or b"")
            if raw_host is None or origin.lower().rstrip(b"/") != own.lower():
                text = origin.decode("latin-1")
                return f"cross-origin request refused: Origin {text!r} is not this API's own"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/openapi.json":
            why = self.refusal(scope)
            if why is not None:
                response: Response = (
                    PlainTextResponse(f"{why}\n", status_code=403)  # Toxiproxy's answer
                    if why is _AGENT_REFUSED
                    else JSONResponse({"error": why, "status": 403}, status_code=403)
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: Runs a registry operation where the registry lives and returns its result (see
#: :func:`create_app`). The operation is a plain function or a coroutine function.
OnRegistry = Callable[[Callable[[], Any]], Awaitable[Any]]


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending


async def _here(op: Callable[[], Any]) -> Any:
    """:data:`OnRegistry` for an app served in the registry's own trio loop."""
    result = op()
    if inspect.isawaitable(result):
        result = await result
    return result


# -- a request to a handler -------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """What every handler of one app shares: the registry, the way to it, and the
    OpenAPI document (served, and read for request bodies' nulls)."""

    registry: ProxyRegistry
    on_registry: OnRegistry
    document: dict[str, Any]
    #: What ``/metrics`` serves, and the counts it serves from the event log.
    metrics: MetricsOptions = NO_METRICS
    counters: EventCounters | None = None

    def body_schema(self, path: str, method: str) -> BodySchema | None:
        """The document's schema of *method* *path*'s request body, if it takes one."""
        body = self.document["paths"][path].get(method.lower(), {}).get("requestBody")
        if body is None:
            return None
        schema = body["content"]["application/json"]["schema"]
        return BodySchema(schema, self.document["components"]["schemas"])

    async def log(self, event: str, **fields: Any) -> None:
        # Where the registry lives: its event log is not shared across threads.
        with trio.CancelScope(shield=True):
            await self.on_registry(lambda: self.registry.events.server.write(event, **fields))


@dataclass(frozen=True)
class Call:
    """One request, as a handler sees it. Everything a handler does to the registry,
    reads included, goes through :meth:`answer` or :meth:`done` (where the registry
    lives); the body is read here, on the API's side."""

    served: Served
    request: Request
    #: The route's request-body schema (None for a route that takes no body).
    schema: BodySchema | None

    @property
    def registry(self) -> ProxyRegistry:
        return self.served.registry

    @property
    def proxy(self) -> str:
        """The ``{proxy}`` of the path."""
        name: str = self.request.path_params["proxy"]
        return name

    @property
    def toxic(self) -> str:
        """The ``{toxic}`` of the path."""
        name: str = self.request.path_params["toxic"]
        return name

    async def read(self) -> bytes:
        """The request body's bytes (:func:`_read_body`)."""
        return await _read_body(self.request)

    def parse(self, raw: bytes) -> Any:
        """*raw* as JSON, its nulls checked against the route's schema."""
        return _parse_json(raw, self.schema)

    async def run(self, op: Callable[[], Any]) -> Any:
        """*op*'s result, computed where the registry lives."""
        return await self.served.on_registry(op)

    async def answer(self, op: Callable[[], Any], status_code: int = 200) -> Response:
        """*op*'s result (JSON-able, computed where the registry lives) as the answer."""
        return JSONResponse(await self.run(op), status_code=status_code)

    async def done(self, op: Callable[[], Any]) -> Response:
        """Run *op* where the registry lives; answer 204 (done, no body)."""
        await self.run(op)
        return Response(status_code=204)


Handler = Callable[[Call], Awaitable[Response]]


# -- Toxiproxy's routes -----------------------------------------------------------------


async def proxy_index(call: Call) -> Response:
    return await call.answer(call.registry.index)


async def proxy_create(call: Call) -> Response:
    raw = await call.read()

    async def op() -> Any:
        return (await call.registry.create(call.parse(raw))).to_json()

    return await call.answer(op, 201)


async def populate(call: Call) -> Response:
    raw = await call.read()

    async def op() -> Any:
        made, err = await call.registry.populate(call.parse(raw))
        return [mp.to_json() for mp in made], err

    proxies, err = await call.run(op)
    if err is not None:
        return _error(err.status, err.message, proxies=proxies)
    return JSONResponse({"proxies": proxies}, status_code=201)


async def proxy_show(call: Call) -> Response:
    return await call.answer(lambda: call.registry.get(call.proxy).to_json())


async def proxy_update(call: Call) -> Response:
    raw = await call.read()

    async def op() -> Any:
        call.registry.get(call.proxy)  # 404 before a body error, as Toxiproxy
        return (await call.registry.update(call.proxy, call.parse(raw))).to_json()

    return await call.answer(op)


async def proxy_delete(call: Call) -> Response:
    return await call.done(lambda: call.registry.delete(call.proxy))


async def toxic_index(call: Call) -> Response:
    return await call.answer(
        lambda: [toxic_to_json(t) for t in call.registry.get(call.proxy).toxics]
    )


async def toxic_create(call: Call) -> Response:
    raw = await call.read()

    def op() -> Any:
        call.registry.get(call.proxy)
        body = call.parse(raw)
        return call.registry.under_lock(
            lambda: toxic_to_json(call.registry.locked_add_toxic(call.proxy, body))
        )

    return await call.answer(op)


async def toxic_show(call: Call) -> Response:
    return await call.answer(
        lambda: toxic_to_json(call.registry.get_toxic(call.proxy, call.toxic)[1])
    )


async def toxic_update(call: Call) -> Response:
    raw = await call.read()

    def op() -> Any:
        call.registry.get_toxic(call.proxy, call.toxic)
        body = call.parse(raw)
        return call.registry.under_lock(
            lambda: toxic_to_json(call.registry.locked_update_toxic(call.proxy, call.toxic, body))
        )

    return await call.answer(op)


async def toxic_delete(call: Call) -> Response:
    return await call.done(
        lambda: call.registry.under_lock(
            lambda: call.registry.locked_remove_toxic(call.proxy, call.toxic)
        )
    )


async def reset(call: Call) -> Response:
    return await call.done(call.registry.reset)


async def version(call: Call) -> Response:
    # Nothing of the registry: answered on the API's side alone.
    return JSONResponse(
        {"version": __version__, "server": "faultnet", "toxiproxy_api": TOXIPROXY_API_VERSION}
    )


# -- faultnet's extensions --------------------------------------------------------------


async def ca(call: Call) -> Response:
    # tls_terminate's throwaway CA (this process's), for clients to trust.
    from faultnet.protocols.tls import ca_cert_path, ca_cert_pem

    return JSONResponse({"pem": ca_cert_pem(), "path": ca_cert_path()})


async def fault_show(call: Call) -> Response:
    return await call.answer(lambda: call.registry.fault_state(call.proxy))


async def fault_apply(call: Call) -> Response:
    raw = await call.read()

    async def op() -> Any:
        call.registry.get(call.proxy)
        return await call.registry.apply_fault(call.proxy, call.parse(raw))

    return await call.answer(op)


async def fault_clear(call: Call) -> Response:
    return await call.done(lambda: call.registry.clear_faults(call.proxy))


async def connections(call: Call) -> Response:
    after = _query_int(call.request, "after", 0, 0, 2**62)
    limit = _query_int(call.request, "limit", 0, 1, 1_000_000) or None  # absent: all

    def op() -> Any:
        conns = call.registry.connections(call.proxy, after=after, limit=limit)
        return [c.to_json() for c in conns]

    return await call.answer(op)


def _events(call: Call, proxy: str | None) -> Any:
    since = _query_int(call.request, "since", 0, 0, 2**62)
    limit = _query_int(call.request, "limit", 1000, 1, 10_000)
    log = call.registry.events
    body: dict[str, Any] = {
        "events": log.read(since=since, limit=limit, proxy=proxy),
        "last_seq": log.last_seq,
        "path": log.path,
        "dropped": log.dropped,
    }
    if log.last_error is not None:
        body["last_error"] = log.last_error
    return body


async def proxy_events(call: Call) -> Response:
    def op() -> Any:
        call.registry.get(call.proxy)
        return _events(call, call.proxy)

    return await call.answer(op)


async def all_events(call: Call) -> Response:
    return await call.answer(lambda: _events(call, None))


async def openapi(call: Call) -> Response:
    return JSONResponse(call.served.document)


async def metrics(call: Call) -> Response:
    # Toxiproxy serves /metrics only when a metrics flag is given; a 404 says which.
    options, counters = call.served.metrics, call.served.counters
    if not options.any:
        raise ApiError(
            404, "metrics are off: start the server with --proxy-metrics or --runtime-metrics"
        )
    shot = Snapshot()
    if options.proxy and counters is not None:
        shot = await call.run(lambda: snapshot(call.registry, counters))
    return Response(render(shot, options), media_type=CONTENT_TYPE)


#: Every route: path, method, handler. The OpenAPI document (faultnet/server/openapi.py)
#: states the same routes; tests/faultnet/server/test_server_conformance.py holds the
#: two to each other. A path's methods become one :class:`Route` (:func:`_routes`).
ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("/reset", "POST", reset),
    ("/ca", "GET", ca),
    ("/proxies", "GET", proxy_index),
    ("/proxies", "POST", proxy_create),
    ("/populate", "POST", populate),
    ("/proxies/{proxy}", "GET", proxy_show),
    ("/proxies/{proxy}", "POST", proxy_update),
    ("/proxies/{proxy}", "PATCH", proxy_update),
    ("/proxies/{proxy}", "DELETE", proxy_delete),
    ("/proxies/{proxy}/toxics", "GET", toxic_index),
    ("/proxies/{proxy}/toxics", "POST", toxic_create),
    ("/proxies/{proxy}/toxics/{toxic}", "GET", toxic_show),
    ("/proxies/{proxy}/toxics/{toxic}", "POST", toxic_update),
    ("/proxies/{proxy}/toxics/{toxic}", "PATCH", toxic_update),
    ("/proxies/{proxy}/toxics/{toxic}", "DELETE", toxic_delete),
    ("/version", "GET", version),
    ("/proxies/{proxy}/faults", "GET", fault_show),
    ("/proxies/{proxy}/faults", "POST", fault_apply),
    ("/proxies/{proxy}/faults", "DELETE", fault_clear),
    ("/proxies/{proxy}/connections", "GET", connections),
    ("/proxies/{proxy}/events", "GET", proxy_events),
    ("/events", "GET", all_events),
    ("/openapi.json", "GET", openapi),
    ("/metrics", "GET", metrics),
)


# -- the app ----------------------------------------------------------------------------


#: The methods the API answers, in the order an ``Allow`` header names them.
_METHOD_ORDER = ("GET", "HEAD", "POST", "PATCH", "DELETE")


def _endpoint(served: Served, path: str, method: str, func: Handler) -> HttpEndpoint:
    """*func* as a starlette endpoint: its :class:`Call`, and the error contract (see
    the module's docstring) for whatever it raises."""
    schema = served.body_schema(path, method)

    async def endpoint(request: Request) -> Response:
        try:
            return await func(Call(served, request, schema))
        except _BodyRefused as exc:
            response = _error(exc.status, exc.message)
            response.headers["connection"] = "close"
            return response
        except ApiError as exc:
            return _error(exc.status, exc.message)
        except ClientDisconnect:
            # The client left mid-request: its business, not a bug. No answer can reach
            # it; one record, no traceback.
            await served.log(
                "client_disconnected", method=request.method, path=request.url.path[:300]
            )
            return _error(400, "client disconnected")
        except HTTPException as exc:
            return _error(exc.status_code, str(exc.detail).lower())
        except Exception as exc:
            # A bug, not a client's mistake: answer, record, keep serving.
            await served.log(
                "api_error",
                method=request.method,
                path=request.url.path,
                error=repr(exc),
                traceback=traceback.format_exc(limit=8),
            )
            return _error(500, f"internal error: {exc!r}")

    return endpoint


def _routes(served: Served, table: Iterable[tuple[str, str, Handler]]) -> list[Route]:
    """One :class:`Route` per path, dispatching on the method: a path's 405 then says
    every method it takes (a Route per method answered ``Allow: GET, HEAD`` for a PUT
    on a path that takes POST, PATCH and DELETE too: the first route's alone)."""
    by_path: dict[str, dict[str, HttpEndpoint]] = {}
    for path, method, func in table:
        by_path.setdefault(path, {})[method] = _endpoint(served, path, method, func)

    def dispatch(endpoints: dict[str, HttpEndpoint]) -> HttpEndpoint:
        async def endpoint(request: Request) -> Response:
            return await endpoints["GET" if request.method == "HEAD" else request.method](request)

        return endpoint

    return [Route(p, dispatch(e), methods=list(e)) for p, e in by_path.items()]


async def _http_error(request: Request, exc: Exception) -> Response:
    """The router's 404 (no such route) and 405 (method), as JSON error bodies."""
    assert isinstance(exc, HTTPException)
    response = _error(exc.status_code, str(exc.detail).lower())
    response.headers.update(exc.headers or {})
    if "allow" in response.headers:  # starlette joins a set: say them in one order
        allowed = response.headers["allow"].split(", ")
        response.headers["allow"] = ", ".join(sorted(allowed, key=_METHOD_ORDER.index))
    return response


def create_app(
    registry: ProxyRegistry,
    token: str | None = None,
    *,
    on_registry: OnRegistry = _here,
    allow_hosts: Iterable[str] = (),
    metrics: MetricsOptions = NO_METRICS,
) -> Starlette:
    """The ASGI app for *registry* (which must be running: see :func:`open_registry`).
    With *token*, every request but the OpenAPI document must carry it (401 otherwise).
    *allow_hosts* are the names, besides its address and loopback's, that a request's
    ``Host`` may give (:class:`BrowserBlock`). *metrics*: what ``GET /metrics``
    serves (:mod:`faultnet.server.metrics`; nothing by default, as Toxiproxy).

    Everything a handler does to the registry, reads included, goes through
    *on_registry*: served in the registry's loop that is a plain call; served from the
    API's own thread (:func:`open_server`) it is one hop into the registry's loop. The
    request is read and the answer encoded and written on the API's side."""
    counters = EventCounters() if metrics.proxy else None
    if counters is not None:
        # From the API's thread when served from one: list.append is atomic, and the
        # registry's loop only iterates the list.
        registry.events.listeners.append(counters)
    served = Served(registry, on_registry, openapi_document(__version__), metrics, counters)
    app = Starlette(routes=_routes(served, ROUTES), exception_handlers={HTTPException: _http_error})
    # "/proxies/" is not "/proxies": a 404, not a redirect (Toxiproxy's router agrees).
    app.router.redirect_slashes = False
    app.add_middleware(BrowserBlock, allow_hosts=allow_hosts)
    if token:
        app.add_middleware(TokenRequired, token=token)
    return app


async def serve_api(
    registry: ProxyRegistry,
    host: str = "127.0.0.1",
    port: int = 8474,
    *,
    token: str | None = None,
    on_registry: OnRegistry = _here,
    allow_hosts: Iterable[str] = (),
    metrics: MetricsOptions = NO_METRICS,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API over HTTP/1.1 (:mod:`faultnet.server.http_server`) until
    cancelled; report the base URL.

    In the registry's own loop by default; :func:`open_server` runs it in a thread of
    its own with *on_registry* hopping into the registry's loop."""
    from faultnet.server.http_server import HttpLimits, serve_http

    # Read here, not at import: tests scale the timeouts down.
    limits = HttpLimits(keep_alive_s=KEEP_ALIVE_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S)
    app = create_app(
        registry, token, on_registry=on_registry, allow_hosts=allow_hosts, metrics=metrics
    )
    await serve_http(app, host, port, limits, task_status=task_status)


@dataclass
class RunningServer:
    """A server started by :func:`open_server`."""

    url: str
    registry: ProxyRegistry


class _ApiThread:
    """The API served in a thread with a trio loop of its own.

    Why (issue 24 item 17): in one loop with the proxies, every checkpoint of a request
    (a dozen, from the accept to the last write) waited behind whatever the proxies had
    ready: at ~1,600 connections/s through a proxy the accept loop alone held the loop
    for a batch of 64 accepts and upstream connects at a time, and GET /version took
    5 ms at the median and 36-120 ms at p99. In its own loop the API's checkpoints wait
    for nothing but the API; a request crosses into the registry's loop once, for the
    registry operation itself (:meth:`on_registry`), and its answer comes back whole.
    """

    def __init__(
        self,
        registry: ProxyRegistry,
        host: str,
        port: int,
        token: str | None,
        allow_hosts: Iterable[str],
        metrics: MetricsOptions,
    ) -> None:
        self.registry, self.host, self.port, self.token = registry, host, port, token
        self.allow_hosts = tuple(allow_hosts)
        self.metrics = metrics
        self.home = trio.lowlevel.current_trio_token()  # the registry's loop
        self.api: trio.lowlevel.TrioToken | None = None
        self.stop_scope = trio.CancelScope()
        self.ready = trio.Event()
        self.started: outcome.Outcome[str] | None = None
        self.thread = threading.Thread(target=self._main, name="faultnet-api", daemon=True)

    async def on_registry(self, op: Callable[[], Any]) -> Any:
        """:data:`OnRegistry`: run *op* in the registry's loop, wait for it here. A plain
        function runs in the registry loop's callback itself and its result comes
        straight back; a result to await is awaited by a system task there. A request
        cancelled meanwhile leaves the operation to finish there on its own: it is never
        half-applied by a cancellation from this side."""
        api = trio.lowlevel.current_trio_token()
        finished = trio.Event()
        result: list[outcome.Outcome[Any]] = []

        def answer(value: outcome.Outcome[Any]) -> None:
            result.append(value)
            try:
                api.run_sync_soon(finished.set)
            except trio.RunFinishedError:
                pass  # the API's loop ended meanwhile: nobody waits for the answer

        async def await_there(pending: Awaitable[Any]) -> None:
            answer(await outcome.acapture(_awaited, pending))

        def run_there() -> None:
            # No task for a plain function (a no-op's hop: p50 53 -> 44 us, issue 36).
            # Captured: an exception escaping a run_sync_soon callback ends trio's run.
            called = outcome.capture(op)
            if isinstance(called, outcome.Value) and inspect.isawaitable(called.value):
                trio.lowlevel.spawn_system_task(await_there, called.value)
            else:
                answer(called)

        self.home.run_sync_soon(run_there)
        await finished.wait()
        return result[0].unwrap()

    def _report(self, started: outcome.Outcome[str]) -> None:
        if self.started is None:
            self.started = started
            self.ready.set()

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 -- handed to the registry's loop
            failed: outcome.Outcome[str] = outcome.Error(exc)
            try:
                self.home.run_sync_soon(self._report, failed)
            except trio.RunFinishedError:
                pass
        else:
            try:
                self.home.run_sync_soon(self._report, outcome.Error(RuntimeError("API ended")))
            except trio.RunFinishedError:
                pass

    async def _serve(self) -> None:
        self.api = trio.lowlevel.current_trio_token()
        with self.stop_scope:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    functools.partial(
                        serve_api,
                        token=self.token,
                        on_registry=self.on_registry,
                        allow_hosts=self.allow_hosts,
                        metrics=self.metrics,
                    ),
                    self.registry,
                    self.host,
                    self.port,
                )
                self.home.run_sync_soon(self._report, outcome.Value(url))

    def stop(self) -> None:
        """Ask the API's loop to end (from the registry's loop); :meth:`join` waits."""
        if self.api is not None:
            try:
                self.api.run_sync_soon(self.stop_scope.cancel)
            except trio.RunFinishedError:
                pass

    async def join(self) -> None:
        # Shielded: the thread must be gone before the registry closes under it. While
        # waiting, this loop keeps running the operations the API still hands it.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.thread.join)


@asynccontextmanager
async def open_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    populate: list[Any] | None = None,
    token: str | None = None,
    allow_hosts: Iterable[str] = (),
    metrics: MetricsOptions = NO_METRICS,
    **registry_kwargs: Any,
) -> AsyncIterator[RunningServer]:
    """Run the whole server (proxies and API) for the block.

    The proxies run in the caller's trio loop, the API in a thread of its own (see
    :class:`_ApiThread`): the control plane answers whatever the proxies carry.
    *populate* is a ``/populate`` body applied before the API starts answering;
    its first error is raised as :class:`ApiError`. *token*, *allow_hosts* and
    *metrics*: see :func:`create_app`. *registry_kwargs* go to
    :class:`ProxyRegistry` (seed, event_log, listen_hosts). An address the API cannot
    listen on is raised as the :class:`OSError`.
    """
    async with open_registry(**registry_kwargs) as registry:
        if populate is not None:
            _, err = await registry.populate(populate)
            if err is not None:
                raise err
        api = _ApiThread(registry, host, port, token, allow_hosts, metrics)
        api.thread.start()
        try:
            with trio.CancelScope(shield=True):
                await api.ready.wait()  # the thread always reports, bound or failed
            assert api.started is not None
            url = api.started.unwrap()
            registry.events.server.write("api_listening", url=url)
            yield RunningServer(url, registry)
        finally:
            api.stop()
            await api.join()
