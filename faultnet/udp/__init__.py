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

# The controls are the ones faultnet.udp.controls.__all__ lists: declared there, once.
from faultnet.udp import controls as _controls
from faultnet.udp.controls import *  # noqa: F403
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
    *_controls.__all__,
    "open_udp_proxy",
    "udp_probe",
]
