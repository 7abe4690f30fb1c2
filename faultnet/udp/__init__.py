"""UDP: a fault proxy for datagrams, its probe and its controls.

* :class:`UdpProxy`, :func:`open_udp_proxy` -- per-client sessions with an idle expiry;
  freeze (held), blackhole (dropped), and seeded loss, latency with jitter, duplicate,
  reorder and size limit, per direction (:mod:`faultnet.udp.proxy`);
* :mod:`faultnet.udp.impairments` -- the pure core: what happens to one datagram,
  decided from the seed (replayable without the proxy);
* :func:`udp_probe` -- one datagram out, the first reply classified
  answered/refused/silent;
* the controls, one per mode (:mod:`faultnet.udp.controls`).

Layout: ``impairments`` (pure) < ``lane`` (one direction's ordered, timed sending) <
``proxy``; ``probe`` < ``controls`` < ``controltest``. Nothing here imports the TCP proxy's
internals (only its :class:`~faultnet.proxy.ProxyError`).
"""

from faultnet.udp.controls import (
    assert_udp_answering,
    assert_udp_delayed,
    assert_udp_duplicated,
    assert_udp_held,
    assert_udp_lossy,
    assert_udp_oversize_dropped,
    assert_udp_reordered,
    assert_udp_silent,
    assert_udp_truncated,
)
from faultnet.udp.impairments import Impairment
from faultnet.udp.probe import UdpProbeKind, UdpProbeResult, udp_probe
from faultnet.udp.proxy import SessionInfo, UdpCounts, UdpProxy, open_udp_proxy

__all__ = [
    "Impairment",
    "SessionInfo",
    "UdpCounts",
    "UdpProbeKind",
    "UdpProbeResult",
    "UdpProxy",
    "assert_udp_answering",
    "assert_udp_delayed",
    "assert_udp_duplicated",
    "assert_udp_held",
    "assert_udp_lossy",
    "assert_udp_oversize_dropped",
    "assert_udp_reordered",
    "assert_udp_silent",
    "assert_udp_truncated",
    "open_udp_proxy",
    "udp_probe",
]
