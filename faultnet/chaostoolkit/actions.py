"""Chaos Toolkit actions: one per fault mode of :data:`faultnet.modes.MODES`, generated
from the table, plus the toxic and cleanup actions (``reset_server`` is Toxiproxy's
``/reset``; ``reset`` is the mode that resets connections).

A mode's action takes ``proxy`` (the proxy's name on the server), then only the
arguments its row says it takes (``stream``, ``include_new``, ``connections``), then
``api_url``; it returns the server's answer (what it acted on, and the proxy's state).
"""

from collections.abc import Callable
from inspect import Parameter, Signature
from typing import Any

from faultnet.chaostoolkit import ActivityFailed, Arguments, Items, api_json, api_request
from faultnet.modes import MODES, Mode
from faultnet.server.client import ApiClient, fault_body


def _path(proxy: str, tail: str = "") -> str:
    return f"/proxies/{ApiClient.quote(proxy)}{tail}"


def _apply(
    proxy: str,
    mode: str,
    *,
    stream: str = "both",
    include_new: bool = False,
    connections: list[Any] | None = None,
    percent: float | None = None,
    peer: str | None = None,
    both_ways: bool = False,
    api_url: str | None = None,
    configuration: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = fault_body(
        mode,
        stream=stream,
        include_new=include_new,
        connections=connections,
        percent=percent,
        peer=peer,
        both_ways=both_ways or None,
    )
    return api_json(
        "POST", _path(proxy, "/faults"), body, api_url_=api_url, configuration=configuration
    )


def _mode_action(m: Mode) -> Callable[..., dict[str, Any]]:
    params = [Parameter("proxy", Parameter.POSITIONAL_OR_KEYWORD, annotation=str)]
    if m.takes_stream:
        params.append(
            Parameter("stream", Parameter.POSITIONAL_OR_KEYWORD, default="both", annotation=str)
        )
    if m.takes_include_new:
        params.append(
            Parameter(
                "include_new", Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation=bool
            )
        )
    if m.per_connection:
        params.append(
            Parameter(
                "connections", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Items
            )
        )
    if m.takes_percent:
        params.append(
            Parameter("percent", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=float)
        )
    if m.takes_peer:
        params.append(
            Parameter("peer", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=str)
        )
    if m.takes_both_ways:
        params.append(
            Parameter("both_ways", Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation=bool)
        )
    params.append(
        Parameter("api_url", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=str)
    )
    params.append(
        Parameter(
            "configuration", Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Arguments
        )
    )
    signature = Signature(params, return_annotation=Arguments)

    def action(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return _apply(mode=m.name, **bound.arguments)

    action.__name__ = action.__qualname__ = m.name
    action.__module__ = __name__
    action.__signature__ = signature  # type: ignore[attr-defined]
    undo = f" Undone by {m.undone_by}." if m.undone_by else ""
    ends = f" Ends {', '.join(m.undoes)}." if m.undoes else ""
    action.__doc__ = f"faultnet mode {m.name} on a proxy: {m.summary}.{undo}{ends}"
    return action


for _m in MODES.values():
    globals()[_m.name] = _mode_action(_m)


def remove_fault(
    proxy: str,
    mode: str,
    stream: str = "both",
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> Arguments:
    """Undo *mode* on a proxy with the mode that undoes it (thaw for freeze and
    blackhole, restore for drop_syn and refuse): the action a rollback names. A mode
    that cannot be undone (sever, reset) is a failure, said so."""
    m = MODES.get(mode.replace("-", "_"))
    if m is None or m.acts_on == "undo":
        raise ActivityFailed(f"not a fault mode: {mode!r}")
    if m.undone_by is None:
        raise ActivityFailed(f"{m.name} cannot be undone: its connections are gone")
    if not MODES[m.undone_by].takes_stream:
        stream = "both"
    return _apply(proxy, m.undone_by, stream=stream, api_url=api_url, configuration=configuration)


def clear_faults(
    proxy: str,
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> None:
    """End every fault mode on a proxy (thaw both ways, then restore)."""
    api_request("DELETE", _path(proxy, "/faults"), api_url_=api_url, configuration=configuration)


def add_toxic(
    proxy: str,
    type: str,
    name: str = None,  # type: ignore[assignment]
    stream: str = "downstream",
    toxicity: float = 1.0,
    attributes: Arguments = None,  # type: ignore[assignment]
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> Arguments:
    """Add a Toxiproxy toxic (latency, bandwidth, slicer, limit_data, slow_close,
    timeout, reset_peer) or one of faultnet's protocol toxics (http_abort, http_delay,
    ..., tls_terminate: :mod:`faultnet.toxics.http`, :mod:`faultnet.toxics.tls`) to a
    proxy; returns it as the server renders it."""
    body: dict[str, Any] = {
        "type": type,
        "stream": stream,
        "toxicity": toxicity,
        "attributes": attributes or {},
    }
    if name:
        body["name"] = name
    return api_json(
        "POST", _path(proxy, "/toxics"), body, api_url_=api_url, configuration=configuration
    )


def remove_toxic(
    proxy: str,
    name: str,
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> None:
    """Remove a toxic from a proxy by name."""
    api_request(
        "DELETE",
        _path(proxy, f"/toxics/{ApiClient.quote(name)}"),
        api_url_=api_url,
        configuration=configuration,
    )


def reset_server(
    api_url: str = None,  # type: ignore[assignment]
    configuration: Arguments = None,  # type: ignore[assignment]
) -> None:
    """Toxiproxy's reset, and faultnet's: every proxy enabled, every toxic removed,
    every mode ended."""
    api_request("POST", "/reset", api_url_=api_url, configuration=configuration)


__all__ = [
    *MODES,
    "add_toxic",
    "clear_faults",
    "remove_fault",
    "remove_toxic",
    "reset_server",
]
