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
import importlib
from typing import Any

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


def _controls() -> list[str]:
    return list(importlib.import_module("faultnet.udp.controls").__all__)


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value: Any = sorted([*_EXPORTS, *_controls()])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name.startswith("__"):
        raise AttributeError(f"module 'faultnet.udp' has no attribute {name!r}")
    elif name in _controls():
        value = getattr(importlib.import_module("faultnet.udp.controls"), name)
    else:
        try:  # a submodule, as the eager imports made it an attribute before
            value = importlib.import_module(f"faultnet.udp.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module 'faultnet.udp' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
