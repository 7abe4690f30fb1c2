"""The server's Prometheus metrics (``GET /metrics``), opt-in as Toxiproxy's are.

``faultnet server --proxy-metrics`` serves Toxiproxy's two proxy counters under its
names and labels, so a dashboard made for Toxiproxy reads faultnet unchanged:

* ``toxiproxy_proxy_received_bytes_total`` and ``toxiproxy_proxy_sent_bytes_total``,
  labels ``direction`` (upstream: client to server; downstream: server to client),
  ``listener``, ``proxy``, ``upstream``.

and faultnet's own, read from the proxies at each scrape:

* ``faultnet_proxy_connections{proxy, state}``: live connections per state (every state
  of :data:`faultnet.proxy.CONNECTION_STATES`, 0 included);
* ``faultnet_proxy_fault_in_force{proxy, fault}``: 1 for each fault in force on the
  listener or on new connections (``refusing``, ``syn_dropped``, ``frozen_new``,
  ``blackhole_new``, ``loss_new``, ``syn_loss``, ``partitioned``; a UDP proxy's
  impairments), 0 for the others; faults on live connections show in their state;
* ``faultnet_fault_applications_total{proxy, mode}``: fault modes applied (and undone:
  ``thaw``, ``restore``) since the server started;
* ``faultnet_toxic_applications_total{proxy, type}``: toxics put in force (added);
* ``faultnet_protocol_faults_total{proxy, event}``: requests and handshakes a protocol
  toxic faulted (``http_fault``, ``tls_fault``, ``tls_failed``).

``--runtime-metrics`` adds the process's, as Toxiproxy's adds Go's: prometheus_client's
``process_*`` (the same names Go's process collector gives), ``python_info`` and
``python_gc_*``, and ``faultnet_build_info{version}`` (Toxiproxy: ``go_build_info``).

Where a byte is counted: the data plane counts a byte when it has written it to the
other side. So ``sent`` is exact, live connections included; faultnet's planes do not
count bytes read, and ``received`` is the same figure: a byte a freeze or a toxic still
holds, or one a toxic dropped (``limit_data``), is in neither. (Toxiproxy adds a link's
bytes to both when the link ends.) TCP proxies only: a UDP proxy counts datagrams.

The counters are fed by the event log (:class:`EventCounters`, in the registry's loop);
a scrape takes a :class:`Snapshot` there and renders it on the API's side.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faultnet.server.registry import ProxyRegistry

__all__ = [
    "CONTENT_TYPE",
    "NO_METRICS",
    "EventCounters",
    "MetricsOptions",
    "Snapshot",
    "render",
    "snapshot",
]

#: The exposition format's content type (prometheus_client's text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The labels of Toxiproxy's byte counters, in its order.
BYTE_LABELS = ("direction", "listener", "proxy", "upstream")
#: Events counted, and the metric each feeds (by the label its value goes to).
PROTOCOL_FAULT_EVENTS = ("http_fault", "tls_fault", "tls_failed")


@dataclass(frozen=True)
class MetricsOptions:
    """Which metrics ``/metrics`` serves (both off: it answers 404, as Toxiproxy's)."""

    proxy: bool = False
    runtime: bool = False

    @property
    def any(self) -> bool:
        return self.proxy or self.runtime


#: The default: ``/metrics`` answers 404.
NO_METRICS = MetricsOptions()


class EventCounters:
    """Counts kept from the event log's records (a listener of
    :class:`~faultnet.server.registry.EventLog`): what a scrape cannot read from the
    proxies themselves, because it is over (a closed connection's bytes) or was an act
    (a fault applied)."""

    def __init__(self) -> None:
        #: proxy -> [bytes upstream, bytes downstream] of its closed connections.
        self.closed_bytes: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        self.faults: collections.Counter[tuple[str, str]] = collections.Counter()
        self.toxics: collections.Counter[tuple[str, str]] = collections.Counter()
        self.protocol_faults: collections.Counter[tuple[str, str]] = collections.Counter()

    def __call__(self, record: Mapping[str, Any]) -> None:
        proxy = record.get("proxy")
        if not isinstance(proxy, str):
            if record.get("event") == "proxy_deleted":  # the server's record of it
                self._forget(str(record.get("name")))
            return
        event = record.get("event")
        if event == "conn_close":
            counts = self.closed_bytes[proxy]
            counts[0] += int(record.get("bytes_upstream") or 0)
            counts[1] += int(record.get("bytes_downstream") or 0)
        elif event in ("fault_applied", "fault_removed"):
            self.faults[proxy, str(record.get("mode"))] += 1
        elif event == "toxic_added":
            self.toxics[proxy, str(record.get("type"))] += 1
        elif event in PROTOCOL_FAULT_EVENTS:
            self.protocol_faults[proxy, str(event)] += 1

    def _forget(self, proxy: str) -> None:
        self.closed_bytes.pop(proxy, None)
        for counter in (self.faults, self.toxics, self.protocol_faults):
            for key in [k for k in counter if k[0] == proxy]:
                del counter[key]


@dataclass
class ProxySample:
    """One proxy at one scrape."""

    name: str
    listener: str
    upstream: str
    #: Bytes written (upstream, downstream): closed connections' and live ones'.
    sent: tuple[int, int] | None
    states: dict[str, int]
    faults: dict[str, bool]


@dataclass
class Snapshot:
    """Everything a scrape renders, taken in the registry's loop."""

    proxies: list[ProxySample] = field(default_factory=list)
    faults: dict[tuple[str, str], int] = field(default_factory=dict)
    toxics: dict[tuple[str, str], int] = field(default_factory=dict)
    protocol_faults: dict[tuple[str, str], int] = field(default_factory=dict)


def _faults_in_force(state: Mapping[str, Any]) -> dict[str, bool]:
    if state.get("protocol") == "udp":
        return {str(name): True for name in state.get("impairments") or {}}
    keys = ("refusing", "syn_dropped", "frozen_new", "blackhole_new", "loss_new")
    return {k: bool(state.get(k)) for k in (*keys, "syn_loss", "partitioned")}


def snapshot(registry: ProxyRegistry, counters: EventCounters) -> Snapshot:
    """The metrics' figures now (call it where the registry lives)."""
    from faultnet.proxy import CONNECTION_STATES, Proxy
    from faultnet.server.registry import format_address

    shot = Snapshot(
        faults=dict(counters.faults),
        toxics=dict(counters.toxics),
        protocol_faults=dict(counters.protocol_faults),
    )
    for name, mp in sorted(registry.proxies.items()):
        state = registry.fault_state(name)
        live = mp.proxy.connections() if isinstance(mp.proxy, Proxy) else []
        sent: tuple[int, int] | None = None
        if mp.protocol == "tcp":
            up, down = counters.closed_bytes.get(name, (0, 0))
            sent = (
                up + sum(c.bytes_upstream for c in live),
                down + sum(c.bytes_downstream for c in live),
            )
        states = dict.fromkeys(CONNECTION_STATES, 0) if mp.protocol == "tcp" else {}
        states.update(state.get("connections", {}))
        shot.proxies.append(
            ProxySample(
                name=name,
                listener=format_address(mp.listen),
                upstream=mp.upstream,
                sent=sent,
                states=states,
                faults=_faults_in_force(state),
            )
        )
    return shot


def _families(shot: Snapshot, options: MetricsOptions) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if options.proxy:
        received = CounterMetricFamily(
            "toxiproxy_proxy_received_bytes",
            "Bytes received on a proxy's link in a direction (faultnet: as sent, see "
            "faultnet.server.metrics)",
            labels=BYTE_LABELS,
        )
        sent = CounterMetricFamily(
            "toxiproxy_proxy_sent_bytes",
            "Bytes sent on a proxy's link in a direction",
            labels=BYTE_LABELS,
        )
        connections = GaugeMetricFamily(
            "faultnet_proxy_connections", "Live connections by state", labels=("proxy", "state")
        )
        in_force = GaugeMetricFamily(
            "faultnet_proxy_fault_in_force",
            "1 for a fault in force on a proxy's listener or new connections",
            labels=("proxy", "fault"),
        )
        for p in shot.proxies:
            if p.sent is not None:
                for direction, count in zip(("upstream", "downstream"), p.sent, strict=True):
                    labels = [direction, p.listener, p.name, p.upstream]
                    received.add_metric(labels, count)
                    sent.add_metric(labels, count)
            for state, n in p.states.items():
                connections.add_metric([p.name, state], n)
            for fault, on in p.faults.items():
                in_force.add_metric([p.name, fault], int(on))
        yield from (received, sent, connections, in_force)
        yield _counter(
            "faultnet_fault_applications", "Fault modes applied or undone", "mode", shot.faults
        )
        yield _counter(
            "faultnet_toxic_applications", "Toxics put in force (added)", "type", shot.toxics
        )
        yield _counter(
            "faultnet_protocol_faults",
            "Requests or handshakes a protocol toxic faulted",
            "event",
            shot.protocol_faults,
        )
    if options.runtime:
        from faultnet._version import __version__

        info = GaugeMetricFamily(
            "faultnet_build_info", "faultnet's version (1)", labels=("version",)
        )
        info.add_metric([__version__], 1)
        yield info


def _counter(name: str, doc: str, label: str, counts: Mapping[tuple[str, str], int]) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=("proxy", label))
    for (proxy, value), n in sorted(counts.items()):
        family.add_metric([proxy, value], n)
    return family


class _Collector:
    def __init__(self, families: Iterable[Any]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


def render(shot: Snapshot, options: MetricsOptions) -> bytes:
    """The exposition text of *shot* (and, with ``runtime``, of this process)."""
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
        generate_latest,
    )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(_families(shot, options)))
    if options.runtime:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return generate_latest(registry)
