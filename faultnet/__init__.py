"""faultnet: inject the network failures real networks have, and prove they are in force.

The public API, re-exported here:

* :class:`Proxy`, :func:`open_proxy` -- the fault proxy (freeze, blackhole, sever, reset,
  drop_syn, refuse, toxics), see :mod:`faultnet.proxy`;
* :func:`probe` -- one fresh connect, classified connected/refused/hung/reset;
* the controls (``assert_accepting``, ``assert_syn_dropped``, ``assert_refusing``,
  ``assert_frozen``, ``assert_blackholed``, ``assert_severed``, ``assert_reset``) and
  :class:`ControlFailed`;
* the JSONL event log (:class:`JsonlWriter`, :func:`read_jsonl`) and exact-PID process
  identity (:class:`ProcessIdentity`, :func:`signal_exact`).
"""

from faultnet._version import __version__
from faultnet.controls import (
    ControlFailed,
    assert_accepting,
    assert_blackholed,
    assert_frozen,
    assert_refusing,
    assert_reset,
    assert_severed,
    assert_syn_dropped,
)
from faultnet.eventlog import CorruptLogError, JsonlRead, JsonlWriter, read_jsonl
from faultnet.probe import ProbeKind, ProbeResult, probe
from faultnet.procs import ProcessIdentity, signal_exact
from faultnet.proxy import ConnectionInfo, Proxy, ProxyError, open_proxy

__all__ = [
    "ConnectionInfo",
    "ControlFailed",
    "CorruptLogError",
    "JsonlRead",
    "JsonlWriter",
    "ProbeKind",
    "ProbeResult",
    "ProcessIdentity",
    "Proxy",
    "ProxyError",
    "__version__",
    "assert_accepting",
    "assert_blackholed",
    "assert_frozen",
    "assert_refusing",
    "assert_reset",
    "assert_severed",
    "assert_syn_dropped",
    "open_proxy",
    "probe",
    "read_jsonl",
    "signal_exact",
]
