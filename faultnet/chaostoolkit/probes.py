"""Chaos Toolkit probes: faultnet's probe and controls, and a proxy's fault state.

``probe_address`` and ``probe_proxy`` return what one fresh connect saw ("connected",
"refused", "hung", "reset"), for a tolerance to compare. ``run_control`` runs one of
faultnet's controls that score a fresh connect (the negative control
``assert_accepting``, and the positive controls of the listener modes), named itself or
by the mode it proves; it returns True, or fails the activity with the control's own
one-line verdict. Controls that need a live stream of the caller's (freeze, blackhole,
sever, reset) are not offered: a probe has no stream to hand them.
"""

import inspect
from typing import Any

import trio

from faultnet import controls
from faultnet.addresses import parse_address
from faultnet.chaostoolkit import ActivityFailed, Arguments, api_json, api_request
from faultnet.modes import MODES
from faultnet.probe import probe
from faultnet.server.client import ApiClient

#: The controls a probe can run: those that make their own connect to an address.
ADDRESS_CONTROLS = tuple(
    name
    for name in controls.__all__
    if name.startswith("assert_")
    and next(iter(inspect.signature(getattr(controls, name)).parameters)) == "address"
)


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text, port_zero=False)
    except ValueError as exc:
        raise ActivityFailed(str(exc)) from None


def _listen(
    proxy: str, api_url: str | None, configuration: dict[str, Any] | None
) -> tuple[str, int]:
    p = api_request(
        "GET",
        f"/proxies/{ApiClient.quote(proxy)}",
        api_url_=api_url,
        configuration=configuration,
    )
    return _address(p["listen"])


def probe_address(address: str, timeout: float = 1.0) -> str:
    """Connect once to HOST:PORT and say what happened: connected, refused, hung, reset."""
    return trio.run(probe, _address(address), timeout).kind.value


def probe_proxy(
    proxy: str,
    timeout: float = 1.0,
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> str:
    """Connect once to a proxy's listen address (asked of its server) and say what
    happened: connected, refused, hung, reset."""
    return trio.run(probe, _listen(proxy, api_url, configuration), timeout).kind.value


def run_control(
    control: str,
    proxy: str = None,  # type: ignore[assignment]
    address: str = None,  # type: ignore[assignment]
    timeout: float = 1.0,
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> bool:
    """Run a faultnet control against a proxy's listen address (or HOST:PORT): its name
    (assert_accepting, assert_refusing, assert_syn_dropped) or the mode it proves
    (refuse, drop_syn). True when it holds; a failed activity, with the control's
    verdict, when it does not."""
    row = MODES.get(control.replace("-", "_"))
    name = row.control if row is not None else control
    if name not in ADDRESS_CONTROLS:
        raise ActivityFailed(
            f"no probe-able control for {control!r}: one of {', '.join(ADDRESS_CONTROLS)} "
            "or a mode they prove"
        )
    if (proxy is None) == (address is None):
        raise ActivityFailed("run_control takes a proxy or an address, one of the two")
    target = _address(address) if address else _listen(proxy, api_url, configuration)
    try:
        trio.run(getattr(controls, name), target, timeout)
    except controls.ControlFailed as exc:
        raise ActivityFailed(str(exc)) from None
    return True


def fault_state(
    proxy: str,
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> Arguments:
    """A proxy's fault state as its server reports it (refusing, syn_dropped,
    frozen_new, blackhole_new, connections by state)."""
    return api_json(
        "GET",
        f"/proxies/{ApiClient.quote(proxy)}/faults",
        api_url_=api_url,
        configuration=configuration,
    )


__all__ = ["fault_state", "probe_address", "probe_proxy", "run_control"]
