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

import importlib
from typing import Any

from faultnet._version import __version__ as __version__

# Everything public is imported on first use (PEP 562), so that importing faultnet, or
# its pytest plugin, which pytest loads into every run where faultnet is installed,
# does not import trio and the whole proxy (it cost 1.3 s per pytest run).
#: Public name -> the module that defines it. The controls are faultnet.controls.__all__.
_EXPORTS = {
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


def _controls() -> list[str]:
    return list(importlib.import_module("faultnet.controls").__all__)


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value: Any = ["__version__", *sorted(_EXPORTS), *_controls()]
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name == "ControlFailed" or name.startswith("assert_"):
        if name not in _controls():
            raise AttributeError(f"module 'faultnet' has no attribute {name!r}")
        value = getattr(importlib.import_module("faultnet.controls"), name)
    else:
        try:  # a submodule, as `import faultnet; faultnet.proxy` found it before
            value = importlib.import_module(f"faultnet.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'faultnet' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
