"""The event log's vocabulary: every event a proxy (TCP or UDP) or the server writes,
with its fields, declared once.

Writers name events by these strings; readers (the run report, the fleet's verifier,
:func:`faultnet.testing.wait_for_record`) match them. A writer made with
``vocabulary=EVENTS`` (:class:`faultnet.eventlog.JsonlWriter`) checks each record
against this table when ``$FAULTNET_STRICT_EVENTS`` is set, as the test suite sets it:
an undeclared event or field raises :class:`UndeclaredEvent` (in production it is
written as it is: a log line is never worth a failure). tests/faultnet/test_events.py
checks that every name written in the source is declared and every name a reader
matches exists.

Every record also has ``wall``, ``mono`` and ``event`` (the writer's), and the writer's
static fields (``proxy``: the proxy's name).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["EVENTS", "STRICT_ENV", "Event", "UndeclaredEvent", "check"]

#: Set (to anything but "" or "0") to make writers with a vocabulary check each record.
STRICT_ENV = "FAULTNET_STRICT_EVENTS"


class UndeclaredEvent(ValueError):
    """A record whose event, or one of whose fields, is not in its vocabulary."""


@dataclass(frozen=True)
class Event:
    name: str
    #: The fields it may carry (beyond wall, mono, event and the writer's static ones).
    fields: tuple[str, ...]
    #: What it records.
    doc: str


def _table(*events: Event) -> dict[str, Event]:
    return {e.name: e for e in events}


_CONN_CLOSE_FIELDS = (
    "conn",
    "how",
    "bytes_upstream",
    "bytes_downstream",
    "age_s",
    "dropped_upstream",
    "dropped_downstream",
    "retransmits",
    "hop_dropped",
    "hop_retransmits",
)

#: The event log's vocabulary (proxies and the server).
EVENTS: dict[str, Event] = _table(
    # -- a proxy's life (TCP and UDP) --
    Event(
        "listening",
        (
            "listen",
            "upstream",
            "seed",
            "dataplane",
            "protocol",
            "idle_timeout",
            "hold_limit",
            "session_bytes",
            "proxy_bytes",
            "max_sessions",
        ),
        "a proxy is serving: its address, upstream, seed (and plane, for TCP)",
    ),
    Event("stopped", (), "a proxy has stopped"),
    Event("accept_error", ("error",), "accept() failed (out of descriptors or memory)"),
    Event(
        "fd_reserve",
        ("state", "limit", "reserve", "refused"),
        "past the descriptor reserve: clients reset at once (refusing), or carried again"
        " (admitting, with how many were refused)",
    ),
    # -- TCP connections --
    Event("conn_open", ("conn", "peer"), "a connection was accepted"),
    Event("conn_close", _CONN_CLOSE_FIELDS, "a connection ended, how, and what crossed"),
    Event("conn_error", ("conn", "error"), "a bug met on one connection, which it ended"),
    Event("upstream_failed", ("conn", "upstream", "reason"), "the upstream connect failed"),
    Event("peer_reset", ("conn", "stream", "errno"), "a peer reset: passed on as an RST"),
    Event("held_fin", ("conn", "stream"), "a FIN arrived on a frozen stream: held"),
    Event("held_rst", ("conn", "stream"), "an RST arrived on a frozen stream: held"),
    Event("queued_reset", ("peer",), "refuse reset a connection the kernel had queued"),
    Event(
        "hop_opened",
        ("conn", "ports"),
        "a connection's bytes cross an internal hop from now on (loss both ways)",
    ),
    Event("hop_failed", ("conn", "error"), "a connection's internal hop failed: reset"),
    # -- faults and toxics --
    Event(
        "fault_applied",
        (
            "mode",
            "stream",
            "include_new",
            "connections",
            "bytes",
            "peer",
            "percent",
            "queued_reset",
            "protocol",
            "sessions",
            "attributes",
            "seed",
            "both_ways",
        ),
        "a fault mode in force: what it acted on",
    ),
    Event(
        "fault_removed",
        ("mode", "stream", "peer", "connections", "protocol", "released"),
        "an undo (thaw, restore, clear): what it acted on",
    ),
    Event(
        "toxic_added",
        ("toxic", "type", "stream", "toxicity", "attributes"),
        "a toxic in force on every connection its toxicity picks",
    ),
    Event("toxic_updated", ("toxic", "toxicity", "attributes"), "a toxic's attributes changed"),
    Event("toxic_removed", ("toxic",), "a toxic removed from every connection"),
    # -- protocol toxics (faultnet/protocols, faultnet/toxics/http.py, tls.py) --
    Event(
        "http_fault",
        (
            "conn",
            "toxic",
            "method",
            "path",
            "action",
            "status",
            "delay_ms",
            "before",
            "rate",
            "bytes",
            "on",
            "added",
            "removed",
            "by",
            "protocol",
            "stream_id",
            "grpc_status",
            "error_code",
        ),
        "one request an HTTP toxic faulted: its method and path, what was done, the figures"
        " (over HTTP/2: protocol h2 and its stream_id)",
    ),
    Event(
        "dns_fault",
        ("session", "conn", "toxic", "action", "qname", "qtype", "id", "delay_ms"),
        "one query a UDP proxy's dns rule (session) or a dns toxic (conn, toxic) faulted: "
        "its name, type and id, what was done",
    ),
    Event(
        "redis_fault",
        ("conn", "toxic", "command", "key", "action", "error", "delay_ms"),
        "one command a redis toxic faulted: its name and first argument (its key), what "
        "was done, the error answered or the delay",
    ),
    Event(
        "pg_fault",
        (
            "conn",
            "toxic",
            "action",
            "kind",
            "query",
            "at",
            "sqlstate",
            "severity",
            "delay_ms",
            "rows",
        ),
        "one request a postgres toxic faulted: its kind (startup, query), its statement "
        "(the first 200 characters), what was done, the figures",
    ),
    Event("http_opaque", ("conn", "toxic", "stream"), "a stream h11 could not parse, passed as is"),
    Event(
        "tls_handshake",
        ("conn", "toxic", "version", "alpn", "server_name"),
        "a TLS toxic's handshake completed: the version, the protocol ALPN chose, the SNI",
    ),
    Event(
        "tls_failed",
        ("conn", "toxic", "reason"),
        "a TLS toxic's handshake failed, and why: reset, or (an upstream's) a 502 or alert",
    ),
    Event("tls_fault", ("conn", "toxic", "action"), "tls_handshake stalled or reset a handshake"),
    # -- UDP sessions --
    Event("session_open", ("session", "peer"), "a UDP client's first datagram: a session"),
    Event(
        "session_close",
        ("session", "peer", "how", "age_s", "counts", "held", "unsent"),
        "a UDP session ended, how, and its counts",
    ),
    Event("session_error", ("session", "error"), "a bug met on one session, which it ended"),
    Event("session_failed", ("peer", "error"), "a session could not get a socket"),
    Event("upstream_refused", ("session",), "the upstream answered ICMP port unreachable"),
    Event("receive_error", ("error",), "a receive on the UDP listener failed"),
    Event(
        "send_failed",
        ("session", "stream", "bytes", "error"),
        "the kernel refused a datagram (e.g. too long for the family): once per errno",
    ),
    Event(
        "datagram_cut",
        ("session", "stream", "bytes", "kept"),
        "a datagram longer than the receive buffer, cut: once per session and stream",
    ),
    # -- the server --
    Event("api_listening", ("url",), "the API is serving"),
    Event("api_error", ("method", "path", "error", "traceback"), "a request met a bug: 500"),
    Event("client_disconnected", ("method", "path"), "a client left before its answer"),
    Event("server_seed", ("seed",), "the server's seed, from which each proxy's derives"),
    Event("server_stop", ("signal",), "the server is stopping"),
    Event(
        "proxy_created",
        ("name", "listen", "upstream", "enabled", "protocol", "seed"),
        "a proxy was created",
    ),
    Event(
        "proxy_updated",
        ("name", "listen", "upstream", "enabled", "protocol", "seed"),
        "a proxy's listen, upstream or enabled changed",
    ),
    Event("proxy_deleted", ("name",), "a proxy was deleted"),
    Event("proxy_failed", ("name", "error"), "a proxy stopped on an error and was disabled"),
    Event("populated", ("names",), "POST /populate made or replaced these proxies"),
    Event("populate_failed", ("name", "error"), "POST /populate failed: nothing changed"),
    Event("reset", ("proxies",), "POST /reset: every toxic removed, every proxy enabled"),
)


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def check(vocabulary: Mapping[str, Event], event: str, fields: Iterable[str]) -> None:
    """Raise :class:`UndeclaredEvent` if *event* or one of *fields* is not declared in
    *vocabulary* (only when ``$FAULTNET_STRICT_EVENTS`` is set)."""
    if not _strict():
        return
    declared = vocabulary.get(event)
    if declared is None:
        raise UndeclaredEvent(f"event {event!r} is not declared in faultnet.events")
    extra = sorted(set(fields) - set(declared.fields))
    if extra:
        raise UndeclaredEvent(f"event {event!r}: fields {extra} are not declared")
