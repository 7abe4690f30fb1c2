"""The HTTP API: Toxiproxy's routes, bodies and errors, plus faultnet's modes.

A Starlette ASGI app (:func:`create_app`) over a :class:`ProxyRegistry`, served by
hypercorn's trio worker (:func:`serve_api`, :func:`open_server`). The OpenAPI document
is at ``GET /openapi.json``.

Error contract: every error is ``{"error": <message>, "status": <code>}`` with
Toxiproxy's codes and messages. A client's mistake is always a 4xx; the only 5xx a
client can cause is Toxiproxy's 500 for a listen address in use. An unexpected failure
in a handler answers 500 with its message and is logged; the server goes on serving.

As Toxiproxy does, requests whose User-Agent starts with ``Mozilla/`` are refused (403):
a web page must not be able to drive the API from a developer's browser. Only
``GET /openapi.json`` is exempt.
"""

from __future__ import annotations

import functools
import hmac
import json
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from faultnet._version import __version__
from faultnet.server.openapi import openapi_document
from faultnet.server.registry import ApiError, ProxyRegistry, bad_body, open_registry
from faultnet.server.toxic_codec import toxic_to_json

__all__ = ["RunningServer", "create_app", "open_server", "serve_api"]

#: Larger request bodies are refused with 413 (a populate of thousands of proxies fits).
MAX_BODY_BYTES = 1 << 20
#: A request body must arrive within this many seconds of the handler's first read.
BODY_TIMEOUT_S = 10.0
#: hypercorn closes a connection whose client sends nothing for this long mid-request
#: (e.g. headers never finished); idle keep-alive connections close after 5 s anyway.
READ_TIMEOUT_S = 60
#: The Toxiproxy API version whose routes and bodies this server answers.
TOXIPROXY_API_VERSION = "2.12.0"

Handler = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status_code=status)


async def _done(action: Awaitable[None]) -> Response:
    """Run *action*; answer 204 (done, no body)."""
    await action
    return Response(status_code=204)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _BodyRefused(ApiError):
    """An answer given without reading the request body to its end (413, 408).

    The connection cannot carry another request after it (the rest of the body is still
    on its way), so hypercorn closes it; the answer says ``Connection: close`` so that a
    keep-alive client knows before sending its next request on it. Without the header a
    client that reused the connection lost that request whenever the close reached it
    late ("Server disconnected without sending a response").
    """


async def _json(request: Request) -> Any:
    """The request body as JSON (whatever its Content-Type, as Toxiproxy reads it).

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
    if not raw.strip():
        raise bad_body("EOF")  # what Toxiproxy's decoder says for an empty body
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise bad_body(str(exc) or type(exc).__name__) from None


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


class BrowserBlock:
    """Refuse browsers (User-Agent ``Mozilla/...``) as Toxiproxy does: 403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/openapi.json":
            for key, value in scope.get("headers", []):
                if key == b"user-agent" and value.startswith(b"Mozilla/"):
                    response = PlainTextResponse("User agent not allowed\n", status_code=403)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def create_app(registry: ProxyRegistry, token: str | None = None) -> Starlette:
    """The ASGI app for *registry* (which must be running: see :func:`open_registry`).
    With *token*, every request but the OpenAPI document must carry it (401 otherwise)."""

    def handler(func: Handler) -> Handler:
        @functools.wraps(func)
        async def wrapped(request: Request) -> Response:
            try:
                return await func(request)
            except _BodyRefused as exc:
                response = _error(exc.status, exc.message)
                response.headers["connection"] = "close"
                return response
            except ApiError as exc:
                return _error(exc.status, exc.message)
            except ClientDisconnect:
                # The client left mid-request: its business, not a bug. No answer
                # can reach it; one record, no traceback.
                registry.events.server.write(
                    "client_disconnected", method=request.method, path=request.url.path[:300]
                )
                return _error(400, "client disconnected")
            except HTTPException as exc:
                return _error(exc.status_code, str(exc.detail).lower())
            except Exception as exc:
                # A bug, not a client's mistake: answer, record, keep serving.
                registry.events.server.write(
                    "api_error",
                    method=request.method,
                    path=request.url.path,
                    error=repr(exc),
                    traceback=traceback.format_exc(limit=8),
                )
                return _error(500, f"internal error: {exc!r}")

        return wrapped

    def proxy_name(request: Request) -> str:
        return request.path_params["proxy"]

    # -- Toxiproxy's routes --

    @handler
    async def proxy_index(request: Request) -> Response:
        return JSONResponse(registry.index())

    @handler
    async def proxy_create(request: Request) -> Response:
        mp = await registry.create(await _json(request))
        return JSONResponse(mp.to_json(), status_code=201)

    @handler
    async def populate(request: Request) -> Response:
        done, err = await registry.populate(await _json(request))
        proxies = [mp.to_json() for mp in done]
        if err is not None:
            return _error(err.status, err.message, proxies=proxies)
        return JSONResponse({"proxies": proxies}, status_code=201)

    @handler
    async def proxy_show(request: Request) -> Response:
        return JSONResponse(registry.get(proxy_name(request)).to_json())

    @handler
    async def proxy_update(request: Request) -> Response:
        registry.get(proxy_name(request))  # 404 before a body error, as Toxiproxy
        mp = await registry.update(proxy_name(request), await _json(request))
        return JSONResponse(mp.to_json())

    @handler
    async def proxy_delete(request: Request) -> Response:
        return await _done(registry.delete(proxy_name(request)))

    @handler
    async def toxic_index(request: Request) -> Response:
        mp = registry.get(proxy_name(request))
        return JSONResponse([toxic_to_json(t) for t in mp.toxics])

    @handler
    async def toxic_create(request: Request) -> Response:
        registry.get(proxy_name(request))
        toxic = await registry.add_toxic(proxy_name(request), await _json(request))
        return JSONResponse(toxic_to_json(toxic))

    @handler
    async def toxic_show(request: Request) -> Response:
        _, toxic = registry.get_toxic(proxy_name(request), request.path_params["toxic"])
        return JSONResponse(toxic_to_json(toxic))

    @handler
    async def toxic_update(request: Request) -> Response:
        name = request.path_params["toxic"]
        registry.get_toxic(proxy_name(request), name)
        toxic = await registry.update_toxic(proxy_name(request), name, await _json(request))
        return JSONResponse(toxic_to_json(toxic))

    @handler
    async def toxic_delete(request: Request) -> Response:
        return await _done(registry.remove_toxic(proxy_name(request), request.path_params["toxic"]))

    @handler
    async def reset(request: Request) -> Response:
        return await _done(registry.reset())

    @handler
    async def version(request: Request) -> Response:
        return JSONResponse(
            {"version": __version__, "server": "faultnet", "toxiproxy_api": TOXIPROXY_API_VERSION}
        )

    # -- faultnet's extensions --

    @handler
    async def fault_show(request: Request) -> Response:
        return JSONResponse(registry.fault_state(proxy_name(request)))

    @handler
    async def fault_apply(request: Request) -> Response:
        registry.get(proxy_name(request))
        return JSONResponse(await registry.apply_fault(proxy_name(request), await _json(request)))

    @handler
    async def fault_clear(request: Request) -> Response:
        return await _done(registry.clear_faults(proxy_name(request)))

    @handler
    async def connections(request: Request) -> Response:
        mp = registry.get(proxy_name(request))
        conns = mp.proxy.connections() if mp.proxy is not None else []
        return JSONResponse([c.to_json() for c in conns])

    def _events(request: Request, proxy: str | None) -> Response:
        since = _query_int(request, "since", 0, 0, 2**62)
        limit = _query_int(request, "limit", 1000, 1, 10_000)
        log = registry.events
        body: dict[str, Any] = {
            "events": log.read(since=since, limit=limit, proxy=proxy),
            "last_seq": log.last_seq,
            "path": log.path,
            "dropped": log.dropped,
        }
        if log.last_error is not None:
            body["last_error"] = log.last_error
        return JSONResponse(body)

    @handler
    async def proxy_events(request: Request) -> Response:
        registry.get(proxy_name(request))
        return _events(request, proxy_name(request))

    @handler
    async def all_events(request: Request) -> Response:
        return _events(request, None)

    document = openapi_document(__version__)

    @handler
    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def http_error(request: Request, exc: Exception) -> Response:
        # The router's 404 (no such route) and 405 (method), as JSON error bodies.
        assert isinstance(exc, HTTPException)
        response = _error(exc.status_code, str(exc.detail).lower())
        response.headers.update(exc.headers or {})
        return response

    routes = [
        Route("/reset", reset, methods=["POST"]),
        Route("/proxies", proxy_index, methods=["GET"]),
        Route("/proxies", proxy_create, methods=["POST"]),
        Route("/populate", populate, methods=["POST"]),
        Route("/proxies/{proxy}", proxy_show, methods=["GET"]),
        Route("/proxies/{proxy}", proxy_update, methods=["POST", "PATCH"]),
        Route("/proxies/{proxy}", proxy_delete, methods=["DELETE"]),
        Route("/proxies/{proxy}/toxics", toxic_index, methods=["GET"]),
        Route("/proxies/{proxy}/toxics", toxic_create, methods=["POST"]),
        Route("/proxies/{proxy}/toxics/{toxic}", toxic_show, methods=["GET"]),
        Route("/proxies/{proxy}/toxics/{toxic}", toxic_update, methods=["POST", "PATCH"]),
        Route("/proxies/{proxy}/toxics/{toxic}", toxic_delete, methods=["DELETE"]),
        Route("/version", version, methods=["GET"]),
        Route("/proxies/{proxy}/faults", fault_show, methods=["GET"]),
        Route("/proxies/{proxy}/faults", fault_apply, methods=["POST"]),
        Route("/proxies/{proxy}/faults", fault_clear, methods=["DELETE"]),
        Route("/proxies/{proxy}/connections", connections, methods=["GET"]),
        Route("/proxies/{proxy}/events", proxy_events, methods=["GET"]),
        Route("/events", all_events, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    # "/proxies/" is not "/proxies": a 404, not a redirect (Toxiproxy's router agrees).
    app.router.redirect_slashes = False
    app.add_middleware(BrowserBlock)
    if token:
        app.add_middleware(TokenRequired, token=token)
    return app


async def serve_api(
    registry: ProxyRegistry,
    host: str = "127.0.0.1",
    port: int = 8474,
    *,
    token: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API with hypercorn's trio worker until cancelled; report the base URL."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # failures are answered and logged by the app itself
    config.graceful_timeout = 1.0
    config.read_timeout = READ_TIMEOUT_S

    class Started:
        def started(self, binds: Any = None) -> None:
            task_status.started(binds[0] if binds else None)

    await serve(create_app(registry, token), config, task_status=Started())  # type: ignore[arg-type]


@dataclass
class RunningServer:
    """A server started by :func:`open_server`."""

    url: str
    registry: ProxyRegistry


@asynccontextmanager
async def open_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    populate: list[Any] | None = None,
    token: str | None = None,
    **registry_kwargs: Any,
) -> AsyncIterator[RunningServer]:
    """Run the whole server (proxies and API) for the block.

    *populate* is a ``/populate`` body applied before the API starts answering;
    its first error is raised as :class:`ApiError`. *registry_kwargs* go to
    :class:`ProxyRegistry` (seed, event_log, listen_hosts).
    """
    async with open_registry(**registry_kwargs) as registry:
        if populate is not None:
            _, err = await registry.populate(populate)
            if err is not None:
                raise err
        async with trio.open_nursery() as nursery:
            url = await nursery.start(
                functools.partial(serve_api, token=token), registry, host, port
            )
            registry.events.server.write("api_listening", url=url)
            try:
                yield RunningServer(url, registry)
            finally:
                nursery.cancel_scope.cancel()
