"""A Chaos Toolkit extension: faultnet's fault modes, toxics, probe and controls as
Chaos Toolkit actions and probes, against faultnet servers (optional extra
``chaostoolkit``).

Use it from an experiment with the ``python`` provider::

    {"type": "action", "name": "refuse-db",
     "provider": {"type": "python", "module": "faultnet.chaostoolkit.actions",
                  "func": "refuse", "arguments": {"proxy": "db"}}}

* :mod:`faultnet.chaostoolkit.actions` -- one action per row of
  :data:`faultnet.modes.MODES` (``freeze``, ``thaw``, ``refuse``, ``restore``, ...),
  generated from the table with the arguments the row says it takes; ``remove_fault``
  (the undo of a named mode, for rollbacks), ``clear_faults``, ``add_toxic``,
  ``remove_toxic``, ``reset_server``.
* :mod:`faultnet.chaostoolkit.probes` -- ``probe_address``, ``probe_proxy`` (one
  fresh connect, classified connected/refused/hung/reset), ``run_control`` (a
  faultnet control, by name or by the mode it proves), ``fault_state``.

Which server: the ``api_url`` argument, else the experiment's configuration key
``faultnet_api_url``, else ``$FAULTNET_API``, else http://127.0.0.1:8474. Several
servers (one per host) are several ``api_url`` values in one experiment.

Why in faultnet and not in drivers or harness: it is an adapter that lets another
orchestrator call faultnet's own API, probe and controls, and imports nothing else;
drivers drive a program under test and harness composes experiments, and neither is
needed here. chaostoolkit-lib is imported only for its ``ActivityFailed`` exception
(and by :func:`discover`), so the module imports without it.

A failure (an API error, a control that goes red) raises ``ActivityFailed`` with one
line saying why, which Chaos Toolkit records as the activity's failure.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, TypedDict, Unpack  # noqa: UP035 (see Arguments)

from faultnet._version import __version__
from faultnet.server.client import DEFAULT_API, ApiClient, ApiFailure, ApiUnavailable

__all__ = ["ActivityFailed", "Arguments", "Items", "api_json", "api_request", "discover"]

#: The annotation of a mapping argument (``configuration``, ``attributes``) and of a list
#: one. Chaos Toolkit's discovery reads them and names only ``dict`` and ``typing.Dict``
#: "mapping" (``dict[str, Any]`` it calls "object"), hence the typing module's aliases.
Arguments = Dict[str, Any]  # noqa: UP006
Items = List[Any]  # noqa: UP006

try:  # the exception Chaos Toolkit reports as an activity's failure
    from chaoslib.exceptions import ActivityFailed  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - without the extra, for imports and docs only

    class ActivityFailed(Exception):  # type: ignore[no-redef]
        """Stands in for chaoslib's when chaostoolkit-lib is not installed."""


#: Seconds one API call may take before the activity fails.
API_TIMEOUT_S = 10.0


def api_url(api_url: str | None, configuration: dict[str, Any] | None) -> str:
    """The server to call: the argument, the configuration, $FAULTNET_API, the default."""
    return (
        api_url
        or (configuration or {}).get("faultnet_api_url")
        or os.environ.get("FAULTNET_API")
        or DEFAULT_API
    )


class Server(TypedDict, total=False):
    """Which server an API call goes to (:func:`api_url`): an activity's ``api_url``
    argument, and the experiment's configuration."""

    api_url_: str | None
    configuration: dict[str, Any] | None


def api_request(method: str, path: str, body: Any = None, **server: Unpack[Server]) -> Any:
    """One API call to *server*; any failure is an ``ActivityFailed`` saying why."""
    where = api_url(server.get("api_url_"), server.get("configuration"))
    client = ApiClient(where, timeout=API_TIMEOUT_S)
    try:
        return client.request(method, path, body)
    except ApiFailure as exc:
        raise ActivityFailed(f"{method} {path}: {exc.message} (HTTP {exc.status})") from None
    except ApiUnavailable as exc:
        raise ActivityFailed(str(exc)) from None


def api_json(method: str, path: str, body: Any = None, **server: Unpack[Server]) -> dict[str, Any]:
    """:func:`api_request` for a route that answers a JSON object (an ``ActivityFailed``
    if it answers anything else)."""
    answer = api_request(method, path, body, **server)
    if not isinstance(answer, dict):
        raise ActivityFailed(f"{method} {path}: expected a JSON object, got {answer!r:.80}")
    return answer


def discover(discover_system: bool = True) -> dict[str, Any]:
    """Chaos Toolkit's discovery: the actions and probes this extension offers."""
    from chaoslib.discovery.discover import (  # type: ignore[import-untyped]
        discover_actions,
        discover_probes,
        initialize_discovery_result,
    )

    result: dict[str, Any] = initialize_discovery_result("faultnet", __version__, "faultnet")
    result["activities"].extend(discover_actions("faultnet.chaostoolkit.actions"))
    result["activities"].extend(discover_probes("faultnet.chaostoolkit.probes"))
    return result
