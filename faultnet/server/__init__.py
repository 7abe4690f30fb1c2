"""faultnet's server: a Toxiproxy-compatible HTTP API over named proxies, with faultnet's
fault modes, connection listing and event log as extensions.

``faultnet server`` runs it; :func:`open_server` runs it inside a trio program or test.
"""

from faultnet.server.api import RunningServer, create_app, open_server, serve_api
from faultnet.server.registry import (
    FAULT_MODES,
    ApiError,
    EventLog,
    ManagedProxy,
    ProxyRegistry,
    format_address,
    open_registry,
    parse_address,
)

__all__ = [
    "FAULT_MODES",
    "ApiError",
    "EventLog",
    "ManagedProxy",
    "ProxyRegistry",
    "RunningServer",
    "create_app",
    "format_address",
    "open_registry",
    "open_server",
    "parse_address",
    "serve_api",
]
