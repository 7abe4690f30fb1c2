"""The API against its own OpenAPI document, read as a table: every path answers a
method it does not take with 405 and the methods it does take in ``Allow``; every
request-body field the document does not declare nullable is refused with a 400 naming
it when it is JSON null (17 schemathesis findings, issue 35 item 7)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from faultnet._version import __version__
from faultnet.server import RunningServer
from faultnet.server.openapi import openapi_document

DOCUMENT = openapi_document(__version__)
SCHEMAS = DOCUMENT["components"]["schemas"]
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: The document's path parameters, named as the proxy and toxic the fixture makes.
EXAMPLES = {"{proxy}": "redis", "{toxic}": "latency_downstream"}


def _concrete(path: str) -> str:
    for name, value in EXAMPLES.items():
        path = path.replace(name, value)
    return path


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return SCHEMAS[ref.rpartition("/")[2]] if ref else schema


def _null_cases() -> Iterator[tuple[str, str, Any, str]]:
    """(method, path, body, what the answer names) for each non-nullable field of every
    documented request body: the field alone, null."""
    for path, operations in DOCUMENT["paths"].items():
        for method, op in operations.items():
            body = op.get("requestBody")
            if body is None:
                continue
            schema = _resolve(body["content"]["application/json"]["schema"])
            listed = schema.get("type") == "array"
            if listed:
                schema = _resolve(schema["items"])
            for field, prop in schema.get("properties", {}).items():
                if _resolve(prop).get("nullable"):
                    continue
                case = {field: None}
                yield (
                    method.upper(),
                    _concrete(path),
                    [case] if listed else case,
                    f"bad request body: {field} must not be null"
                    + (" at proxy 1" if listed else ""),
                )


NULL_CASES = list(_null_cases())


@pytest.fixture
async def api(faultnet_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as client:
        r = await client.post("/proxies", json={"name": "redis", "upstream": "127.0.0.1:1"})
        assert r.status_code == 201, r.text
        r = await client.post("/proxies/redis/toxics", json={"type": "latency"})
        assert r.status_code == 200, r.text
        yield client


async def test_a_405_allows_every_method_its_path_takes(api: httpx.AsyncClient) -> None:
    for path, operations in DOCUMENT["paths"].items():
        takes = {m.upper() for m in operations}
        allowed = takes | ({"HEAD"} if "GET" in takes else set())
        for method in METHODS:
            if method in takes:
                continue
            r = await api.request(method, _concrete(path))
            assert r.status_code == 405, (method, path, r.text)
            assert r.json() == {"error": "method not allowed", "status": 405}
            assert set(r.headers["allow"].split(", ")) == allowed, (method, path, r.headers)


def test_the_null_cases_cover_every_body_the_document_declares() -> None:
    bodies = {(m, p) for m, p, _, _ in NULL_CASES}
    assert len(NULL_CASES) >= 17 and len(bodies) >= 8, NULL_CASES
    assert ("POST", "/proxies") in bodies and ("POST", "/populate") in bodies


async def test_null_for_a_field_that_is_not_nullable_is_a_400_naming_it(
    api: httpx.AsyncClient,
) -> None:
    # One server for every case (a server per case cost 8 s of the suite's time).
    wrong = []
    for method, path, body, says in NULL_CASES:
        r = await api.request(method, path, json=body)
        if r.status_code != 400 or r.json() != {"error": says, "status": 400}:
            wrong.append(f"{method} {path} {json.dumps(body)}: {r.status_code} {r.text}")
    assert wrong == []


async def test_null_where_the_document_allows_it_is_answered(api: httpx.AsyncClient) -> None:
    # Toxiproxy's Go client sends a nil attributes map as null, and unknown keys (its
    # proxy's "toxics": null) are ignored; null for an attribute keeps its value.
    r = await api.post("/proxies/redis/toxics", json={"type": "slicer", "attributes": None})
    assert r.status_code == 200, r.text
    r = await api.patch(
        "/proxies/redis/toxics/latency_downstream", json={"attributes": {"latency": None}}
    )
    assert r.status_code == 200 and r.json()["attributes"]["latency"] == 0, r.text
    r = await api.post("/proxies", json={"name": "go", "upstream": "127.0.0.1:1", "toxics": None})
    assert r.status_code == 201, r.text


def test_the_route_table_and_the_document_name_the_same_routes() -> None:
    from faultnet.server.api import ROUTES

    served = {(path, method.lower()) for path, method, _ in ROUTES}
    documented = {(p, m) for p, ops in DOCUMENT["paths"].items() for m in ops}
    assert served == documented
