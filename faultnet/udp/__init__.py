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

from faultnet.lazyexports import lazy_exports

# Imported on first use (PEP 562), so that importing faultnet.udp.modes (the mode table,
# which the CLI's parser reads) does not import trio and the proxy (0.18 s, measured
# with -X importtime). The controls are faultnet.udp.controls.__all__.
#: Public name -> the module that defines it.
_EXPORTS = {
    "Impairment": "faultnet.udp.impairments",
    "UdpProbeKind": "faultnet.udp.probe",
    "UdpProbeResult": "faultnet.udp.probe",
    "udp_probe": "faultnet.udp.probe",
    "SessionInfo": "faultnet.udp.proxy",
    "UdpCounts": "faultnet.udp.proxy",
    "UdpProxy": "faultnet.udp.proxy",
    "open_udp_proxy": "faultnet.udp.proxy",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, everything_in=["faultnet.udp.controls"])
