"""faultnet: inject the network failures real networks have, and prove they are in force.

The public API, re-exported here:

* :class:`Proxy`, :func:`open_proxy` -- the fault proxy (freeze, blackhole, sever, reset,
  drop_syn, refuse, toxics), see :mod:`faultnet.proxy`;
* :func:`probe` -- one fresh connect, classified connected/refused/hung/reset;
* :data:`MODES` -- the fault-mode table (:mod:`faultnet.modes`);
* the controls, as :data:`faultnet.controls.__all__` lists them (``assert_accepting``
  and one per mode, see :mod:`faultnet.controls`) and :class:`ControlFailed`;
* UDP, in :mod:`faultnet.udp`: :class:`~faultnet.udp.UdpProxy` (per-client sessions;
  freeze, blackhole and seeded loss, latency, duplicate, reorder, size limit), its probe
  and its controls;
* the JSONL event log (:class:`JsonlWriter`, :func:`read_jsonl`) and exact-PID process
  identity (:class:`ProcessIdentity`, :func:`signal_exact`).
"""

from faultnet._version import __version__ as __version__
from faultnet.lazyexports import lazy_exports

# Everything public is imported on first use (PEP 562), so that importing faultnet, or
# its pytest plugin, which pytest loads into every run where faultnet is installed,
# does not import trio and the whole proxy (it cost 1.3 s per pytest run).
#: Public name -> the module that defines it. The controls are faultnet.controls.__all__.
_EXPORTS = {
    "__version__": "faultnet._version",  # imported above: listed in __all__
    "MODES": "faultnet.modes",
    "Mode": "faultnet.modes",
    "AddressInUse": "faultnet.proxy",
    "ConnectionInfo": "faultnet.proxy",
    "Proxy": "faultnet.proxy",
    "ProxyError": "faultnet.proxy",
    "open_proxy": "faultnet.proxy",
    "CorruptLogError": "faultnet.eventlog",
    "JsonlRead": "faultnet.eventlog",
    "JsonlWriter": "faultnet.eventlog",
    "read_jsonl": "faultnet.eventlog",
    "ProbeKind": "faultnet.probe",
    "ProbeResult": "faultnet.probe",
    "probe": "faultnet.probe",
    "ProcessIdentity": "faultnet.procs",
    "signal_exact": "faultnet.procs",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, everything_in=["faultnet.controls"])
