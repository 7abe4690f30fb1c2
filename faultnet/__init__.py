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

from faultnet import controls as _controls
from faultnet._version import __version__
from faultnet.controls import *  # noqa: F403 - the controls, as controls.__all__ lists them
from faultnet.eventlog import CorruptLogError, JsonlRead, JsonlWriter, read_jsonl
from faultnet.modes import MODES, Mode
from faultnet.probe import ProbeKind, ProbeResult, probe
from faultnet.procs import ProcessIdentity, signal_exact
from faultnet.proxy import AddressInUse, ConnectionInfo, Proxy, ProxyError, open_proxy

__all__ = [
    "MODES",
    "AddressInUse",
    "ConnectionInfo",
    "CorruptLogError",
    "JsonlRead",
    "JsonlWriter",
    "Mode",
    "ProbeKind",
    "ProbeResult",
    "ProcessIdentity",
    "Proxy",
    "ProxyError",
    "__version__",
    "open_proxy",
    "probe",
    "read_jsonl",
    "signal_exact",
    *_controls.__all__,
]
