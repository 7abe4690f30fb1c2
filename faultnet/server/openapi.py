"""The OpenAPI 3.0 document of the server's API (served at ``GET /openapi.json``).

Written by hand so the document states the contract (units, semantics, error codes)
rather than whatever a framework infers, except what is declared elsewhere once: the
fault modes come from :data:`faultnet.modes.MODES`, the toxic types and their attribute
schemas from the toxics' own declarations (:data:`faultnet.toxics.TOXICS`).
tests/faultnet/server/test_server_fuzz.py fuzzes the server from this document, so a
route or status missing here shows up there.
"""

from __future__ import annotations

from typing import Any

from faultnet.modes import MODES, STREAM_CHOICES, modes_that
from faultnet.proxy import CONNECTION_STATES
from faultnet.server.names import MAX_NAME_CHARS
from faultnet.toxics import INT64_MAX, INT64_MIN, TOXICS, TextAttribute
from faultnet.udp.modes import UDP_MODES, UDP_ONLY_ARGUMENTS

__all__ = ["openapi_document"]


def _modes_that(flag: str) -> str:
    return ", ".join(modes_that(flag))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _op(
    summary: str,
    responses: dict[str, Any],
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One operation: its summary, path/query parameters, JSON body and responses."""
    op: dict[str, Any] = {"summary": summary}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = _body(body)
        responses = {**responses, "408": SLOW_BODY, "413": LARGE_BODY}
    op["responses"] = responses
    return op


def _body(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "required": True,
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }


def _name(example: str) -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_CHARS,
        "description": "no '/', no control characters, not '.' or '..'",
        "example": example,
    }


def _path_parameter(name: str, example: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "example": example,
    }


PROXY = _path_parameter("proxy", "redis")
TOXIC = _path_parameter("toxic", "latency_downstream")
NOT_FOUND = _error("proxy not found (or toxic not found)")
BAD = _error("bad request body, missing required field, invalid stream or toxic type")
EMPTY = {"description": "done, no body"}
SLOW_BODY = _error("the request body did not arrive within 10 s; the answer says Connection: close")
LARGE_BODY = _error(
    "the request body is larger than 1 MiB (refused unread); the answer says Connection: close"
)


def _toxic_attributes() -> dict[str, Any]:
    """Every toxic's attributes, from their :class:`~faultnet.toxics.Attribute`
    declarations; a name two toxics share says what it means for each."""
    properties: dict[str, dict[str, Any]] = {}
    for cls in TOXICS.values():
        for attr in cls.ATTRIBUTES:
            # nullable: null keeps the value (Toxiproxy's decoder leaves the field as is).
            if isinstance(attr, TextAttribute):
                prop = properties.setdefault(attr.name, {"type": "string", "nullable": True})
            else:
                prop = properties.setdefault(
                    attr.name, {"type": "integer", "minimum": attr.minimum, "nullable": True}
                )
                prop["minimum"] = min(prop["minimum"], attr.minimum)
                if attr.maximum < INT64_MAX:
                    prop["maximum"] = max(prop.get("maximum", attr.maximum), attr.maximum)
            said = prop.get("description")
            prop["description"] = (said + "; " if said else "") + f"{cls.type}: {attr.doc}"
    for prop in properties.values():
        if prop.get("minimum", 0) <= INT64_MIN:  # no lower bound worth stating (bandwidth's rate)
            del prop["minimum"]
    return {
        "type": "object",
        # Toxiproxy's Go client sends a nil attributes map as null: none given.
        "nullable": True,
        "description": "Depends on the toxic's type; unknown keys are ignored, null keeps a "
        "value; null for the whole object gives none.",
        "properties": properties,
    }


def _schemas() -> dict[str, Any]:
    # Built per document, so a toxic registered later is in it too.
    toxic_attributes = _toxic_attributes()
    return {
        "Error": {
            "type": "object",
            "required": ["error", "status"],
            "properties": {"error": {"type": "string"}, "status": {"type": "integer"}},
        },
        "Toxic": {
            "type": "object",
            "required": ["name", "type", "stream", "toxicity", "attributes"],
            "properties": {
                "name": {"type": "string"},
                "type": {"type": "string"},
                "stream": {"type": "string", "enum": ["upstream", "downstream"]},
                "toxicity": {"type": "number", "minimum": 0, "maximum": 1},
                "attributes": toxic_attributes,
            },
        },
        "ToxicCreate": {
            "type": "object",
            "description": "Defaults: stream downstream, toxicity 1.0, name <type>_<stream>. "
            "Names are unique across both streams.",
            "properties": {
                "name": _name("latency_downstream"),
                "type": {
                    "type": "string",
                    "enum": list(TOXICS),
                },
                "stream": {"type": "string", "enum": ["upstream", "downstream"]},
                "toxicity": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "description": "probability that a connection is affected, decided once "
                    "per connection and kept; 0 never affects one",
                },
                "attributes": toxic_attributes,
            },
        },
        "ToxicUpdate": {
            "type": "object",
            "description": "Only attributes (merged) and toxicity are read. A new toxicity "
            "applies to connections opened afterwards.",
            "properties": {
                "toxicity": {"type": "number", "minimum": 0, "maximum": 1},
                "attributes": toxic_attributes,
            },
        },
        "Proxy": _object(
            ["name", "listen", "upstream", "enabled", "toxics"],
            name={"type": "string"},
            listen={"type": "string", "description": "the bound host:port"},
            upstream={"type": "string"},
            enabled={"type": "boolean"},
            toxics=_array(_ref("Toxic")),
        ),
        "ProxyCreate": {
            "type": "object",
            "required": ["name", "upstream"],
            "properties": {
                "name": _name("redis"),
                "listen": {
                    "type": "string",
                    "example": "127.0.0.1:0",
                    "description": "host:port; port 0 picks a free port; empty host = 127.0.0.1",
                },
                "upstream": {"type": "string", "example": "127.0.0.1:6379"},
                "enabled": {"type": "boolean", "default": True},
                "protocol": {
                    "type": "string",
                    "enum": ["tcp", "udp"],
                    "default": "tcp",
                    "description": "faultnet extension: udp makes a UDP proxy (per-client "
                    "sessions; its faults are the UDP modes, it takes no toxics)",
                },
            },
        },
        "ProxyUpdate": {
            "type": "object",
            "description": "Missing fields keep their values; a changed listen or upstream "
            "restarts the proxy. enabled false closes the listener and every connection.",
            "properties": {
                "listen": {"type": "string", "example": "127.0.0.1:0"},
                "upstream": {"type": "string", "example": "127.0.0.1:6379"},
                "enabled": {"type": "boolean"},
            },
        },
        "Fault": {
            "type": "object",
            "required": ["mode"],
            "properties": {
                "mode": {
                    "type": "string",
                    "enum": [*MODES, *(m for m in UDP_MODES if m not in MODES)],
                    "description": "; ".join(f"{m.name}: {m.summary}" for m in MODES.values())
                    + ". On a UDP proxy: "
                    + "; ".join(f"{m.name}: {m.summary}" for m in UDP_MODES.values()),
                },
                **{
                    arg.key: {
                        "type": "string" if arg.kind in ("choice", "text") else "number",
                        "description": "UDP proxies: "
                        + ", ".join(m.name for m in UDP_MODES.values() if m.argument(arg.name)),
                    }
                    for arg in UDP_ONLY_ARGUMENTS
                },
                "stream": {
                    "type": "string",
                    "enum": list(STREAM_CHOICES),
                    "default": "both",
                    "description": f"{_modes_that('takes_stream')} only",
                },
                "include_new": {
                    "type": "boolean",
                    "default": False,
                    "description": f"{_modes_that('takes_include_new')} only: also catch "
                    "connections accepted later, until their undo",
                },
                "connections": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": f"{_modes_that('per_connection')}: act only on these live "
                    "connections (ids from /proxies/{proxy}/connections); default all",
                },
                "percent": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 100,
                    "description": f"{_modes_that('takes_percent')}: the chance each segment "
                    "(or SYN) is dropped; default "
                    + ", ".join(
                        f"{m.default_percent:g} for {m.name}"
                        for m in MODES.values()
                        if m.takes_percent
                    ),
                },
                "both_ways": {
                    "type": "boolean",
                    "default": False,
                    "description": f"{_modes_that('takes_both_ways')} only (stream both): "
                    "lose segments travelling either way, ACKs included, as a lossy route "
                    "(the connection's bytes cross an internal hop, for good); default only "
                    "segments arriving at the proxy (its own never)",
                },
                "peer": {
                    "type": "string",
                    "description": f"{_modes_that('takes_peer')}: act only on the client at "
                    "this address, HOST or HOST:PORT (an IP; [V6] in brackets); for "
                    "partition also its new connects. Default every client",
                },
            },
        },
        "FaultState": {
            "type": "object",
            "required": ["proxy", "enabled"],
            "properties": {
                "proxy": {"type": "string"},
                "enabled": {"type": "boolean"},
                "refusing": {"type": "boolean"},
                "syn_dropped": {"type": "boolean"},
                "frozen_new": {"type": "array", "items": {"type": "string"}},
                "blackhole_new": {"type": "boolean"},
                "loss_new": {
                    "type": "object",
                    "nullable": True,
                    "description": "include_new of loss: percent per stream",
                    "additionalProperties": {"type": "number"},
                },
                "loss_new_both_ways": {
                    "type": "array",
                    "nullable": True,
                    "items": {"type": "string"},
                    "description": "the streams of loss_new lost both ways",
                },
                "syn_loss": {"type": "number", "description": "percent of SYNs dropped"},
                "partitioned": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": 'the peers partitioned ("*": every client)',
                },
                "connections": {
                    "type": "object",
                    "description": "count of live connections per fault state (open: "
                    "none on it), kept as connections change, not read from each: "
                    "whether an open one is still connecting or half-closed is in the "
                    "connection listing",
                    "additionalProperties": {"type": "integer"},
                },
            },
        },
        "FaultResult": {
            "type": "object",
            "required": ["proxy", "mode", "state"],
            "properties": {
                "proxy": {"type": "string"},
                "mode": {"type": "string"},
                "stream": {"type": "string"},
                "connections": {
                    "type": "integer",
                    "description": "live connections the mode acted on",
                },
                "state": _ref("FaultState"),
            },
        },
        "Connection": _object(
            ["id", "peer", "bytes_upstream", "bytes_downstream", "state"],
            id={"type": "integer"},
            peer={"type": "string", "description": "the client's host:port"},
            upstream={"type": "string"},
            bytes_upstream={"type": "integer", "description": "client to server, bytes"},
            bytes_downstream={"type": "integer", "description": "server to client, bytes"},
            state={"type": "string", "enum": list(CONNECTION_STATES)},
            age_s={"type": "number", "description": "seconds since accepted"},
            dropped_upstream={
                "type": "integer",
                "description": "segments dropped into the proxy's client-side socket "
                "(loss, blackhole): the client retransmitted the data among them",
            },
            dropped_downstream={
                "type": "integer",
                "description": "segments dropped into the proxy's upstream socket: the "
                "server retransmitted the data among them",
            },
            retransmits={
                "type": "integer",
                "description": "segments the proxy's own two sockets retransmitted (TCP_INFO)",
            },
            loss={
                "type": "object",
                "nullable": True,
                "additionalProperties": {"type": "number"},
                "description": "the loss in force, percent per stream",
            },
            loss_both_ways={
                "type": "array",
                "nullable": True,
                "items": {"type": "string"},
                "description": "the streams whose loss is both ways (on the internal hop)",
            },
            on_hop={
                "type": "boolean",
                "description": "the bytes cross the connection's internal hop (since a "
                "loss both ways; it stays, lossless, after thaw)",
            },
            hop_dropped={
                "type": "integer",
                "description": "segments the hop's filters dropped, both ways",
            },
            hop_retransmits={
                "type": "integer",
                "description": "segments the hop's two ends retransmitted (TCP_INFO)",
            },
        ),
        "Events": {
            "type": "object",
            "required": ["events", "last_seq", "dropped"],
            "properties": {
                "events": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["seq", "event", "wall", "mono"],
                        "properties": {
                            "seq": {"type": "integer"},
                            "event": {"type": "string"},
                            "wall": {"type": "number"},
                            "mono": {"type": "number"},
                        },
                    },
                },
                "last_seq": {"type": "integer"},
                "path": {"type": "string", "nullable": True, "description": "the JSONL file"},
                "dropped": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "records the JSONL file could not take (disk full, a "
                    "file-size limit), the whole server's (proxies share the file); they "
                    "are still in `events`",
                },
                "last_error": {
                    "type": "string",
                    "description": "why the last dropped record failed; absent while none has",
                },
            },
        },
    }


#: A page of the connection listing: ``?limit=&after=`` (issue 36).
CONNECTION_QUERY = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "at most this many connections (default: all); only they are read",
        "schema": {"type": "integer", "minimum": 1, "maximum": 1000000},
    },
    {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "only connections whose id comes after this one (ids increase in "
        "accept order): the next page is after the last id of this one",
        "schema": {"type": "integer", "minimum": 0},
    },
]

EVENT_QUERY = [
    {
        "name": "since",
        "in": "query",
        "required": False,
        "description": "only records numbered after this seq",
        "schema": {"type": "integer", "minimum": 0},
    },
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "at most this many records (default 1000)",
        "schema": {"type": "integer", "minimum": 1, "maximum": 10000},
    },
]


def openapi_document(version: str) -> dict[str, Any]:
    """The document; *version* is the server's."""
    proxy = _json(_ref("Proxy"), "the proxy")
    toxic = _json(_ref("Toxic"), "the toxic")
    in_use = _error("listen address in use")
    records = _json(_ref("Events"), "records, oldest first")
    bad_query = _error("bad since or limit")
    ext = "faultnet extension: "
    proxy_update = _op(
        "Update a proxy (POST is Toxiproxy's older spelling of PATCH)",
        {"200": proxy, "400": BAD, "404": NOT_FOUND, "500": in_use},
        [PROXY],
        _ref("ProxyUpdate"),
    )
    toxic_update = _op(
        "Update a toxic's attributes (merged) and toxicity, live",
        {"200": toxic, "400": BAD, "404": NOT_FOUND},
        [PROXY, TOXIC],
        _ref("ToxicUpdate"),
    )
    populate_error = _object(
        ["error", "status", "proxies"],
        error={"type": "string"},
        status={"type": "integer"},
        proxies=_array(_ref("Proxy")),
    )
    paths: dict[str, Any] = {
        "/proxies": {
            "get": _op(
                "Every proxy, keyed by name",
                {
                    "200": _json(
                        {"type": "object", "additionalProperties": _ref("Proxy")}, "proxies"
                    )
                },
            ),
            "post": _op(
                "Create a proxy (listening at once unless enabled is false)",
                {
                    "201": _json(_ref("Proxy"), "the proxy, listen = the bound address"),
                    "400": BAD,
                    "409": _error("proxy already exists"),
                    "500": in_use,
                },
                body=_ref("ProxyCreate"),
            ),
        },
        "/populate": {
            "post": _op(
                "Create or replace the listed proxies; the others are kept",
                {
                    "201": _json(
                        _object(["proxies"], proxies=_array(_ref("Proxy"))), "the proxies"
                    ),
                    "400": BAD,
                    "500": _json(
                        populate_error, "a listen address in use; the proxies done before it"
                    ),
                },
                body=_array(_ref("ProxyCreate")),
            )
        },
        "/proxies/{proxy}": {
            "get": _op("One proxy", {"200": proxy, "404": NOT_FOUND}, [PROXY]),
            "post": proxy_update,
            "patch": proxy_update,
            "delete": _op(
                "Delete a proxy: its listener and connections close",
                {"204": EMPTY, "404": NOT_FOUND},
                [PROXY],
            ),
        },
        "/proxies/{proxy}/toxics": {
            "get": _op(
                "The proxy's toxics: upstream chain, then downstream chain",
                {"200": _json(_array(_ref("Toxic")), "toxics"), "404": NOT_FOUND},
                [PROXY],
            ),
            "post": _op(
                "Add a toxic, live on existing connections too",
                {"200": toxic, "400": BAD, "404": NOT_FOUND, "409": _error("toxic already exists")},
                [PROXY],
                _ref("ToxicCreate"),
            ),
        },
        "/proxies/{proxy}/toxics/{toxic}": {
            "get": _op("One toxic", {"200": toxic, "404": NOT_FOUND}, [PROXY, TOXIC]),
            "post": toxic_update,
            "patch": toxic_update,
            "delete": _op("Remove a toxic, live", {"204": EMPTY, "404": NOT_FOUND}, [PROXY, TOXIC]),
        },
        "/reset": {
            "post": _op(
                "Enable every proxy, remove every toxic, end every faultnet mode",
                {"204": EMPTY, "500": _error("a listen address in use")},
            )
        },
        "/version": {
            "get": _op(
                "The server's version",
                {"200": _json(_object(["version"], version={"type": "string"}), "version")},
            )
        },
        "/ca": {
            "get": _op(
                ext + "the certificate of the throwaway CA tls_terminate's certificates are "
                "issued by (PEM), and the path of a file holding it on the server's host",
                {
                    "200": _json(
                        _object(["pem", "path"], pem={"type": "string"}, path={"type": "string"}),
                        "the CA certificate",
                    )
                },
            )
        },
        "/proxies/{proxy}/faults": {
            "get": _op(
                ext + "the proxy's modes in force",
                {"200": _json(_ref("FaultState"), "state"), "404": NOT_FOUND},
                [PROXY],
            ),
            "post": _op(
                ext + "apply a fault mode (total when answered)",
                {
                    "200": _json(_ref("FaultResult"), "what the mode did"),
                    "400": _error("invalid mode, stream or option"),
                    "404": _error("proxy not found, or a connection named is not live"),
                    "409": _error("proxy is disabled"),
                    "500": _error("restore: the listen address was taken meanwhile"),
                },
                [PROXY],
                _ref("Fault"),
            ),
            "delete": _op(
                ext + "undo every mode (thaw, then restore)",
                {
                    "204": EMPTY,
                    "404": NOT_FOUND,
                    "500": _error("the listen address was taken meanwhile"),
                },
                [PROXY],
            ),
        },
        "/proxies/{proxy}/connections": {
            "get": _op(
                ext + "the proxy's live connections in accept order: all, or a page",
                {
                    "200": _json(_array(_ref("Connection")), "connections"),
                    "400": _error("bad limit or after"),
                    "404": NOT_FOUND,
                },
                [PROXY, *CONNECTION_QUERY],
            )
        },
        "/proxies/{proxy}/events": {
            "get": _op(
                ext + "the proxy's event log records",
                {"200": records, "400": bad_query, "404": NOT_FOUND},
                [PROXY, *EVENT_QUERY],
            )
        },
        "/events": {
            "get": _op(
                ext + "every event log record (server and proxies)",
                {"200": records, "400": bad_query},
                EVENT_QUERY,
            )
        },
        "/openapi.json": {
            "get": _op("This document", {"200": _json({"type": "object"}, "OpenAPI 3.0 document")})
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics, when the server was started with --proxy-metrics "
                "(Toxiproxy's toxiproxy_proxy_received_bytes_total and "
                "toxiproxy_proxy_sent_bytes_total, labels direction, listener, proxy, "
                "upstream; faultnet_proxy_connections, faultnet_proxy_fault_in_force, "
                "faultnet_fault_applications_total, faultnet_toxic_applications_total, "
                "faultnet_protocol_faults_total) or --runtime-metrics (process_*, python_*, "
                "faultnet_build_info)",
                {
                    "200": {
                        "description": "the text exposition format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "404": _error("metrics are off (neither flag given)"),
                },
            )
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "faultnet server",
            "version": version,
            "description": "Toxiproxy's HTTP API (v2.12.0 routes, bodies and errors), plus "
            "faultnet's fault modes, connection listing and event log as extensions. Every "
            "error body is {error, status}. Requests from browsers (User-Agent Mozilla/...), "
            "with a Host that is not this server's address or a loopback name, or with a "
            "cross-origin Origin are refused with 403, except this document.",
        },
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
