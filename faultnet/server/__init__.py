"""faultnet's server: a Toxiproxy-compatible HTTP API over named proxies, with faultnet's
fault modes, connection listing and event log as extensions.

``faultnet server`` runs it; :func:`open_server` runs it inside a trio program or test.
The OpenAPI document is served at ``GET /openapi.json``.

Toxiproxy's routes (v2.12.0 bodies, status codes and error messages): ``/proxies``
(GET, POST), ``/populate`` (POST), ``/proxies/{p}`` (GET, POST or PATCH, DELETE),
``/proxies/{p}/toxics`` (GET, POST), ``/proxies/{p}/toxics/{t}`` (GET, POST or PATCH,
DELETE), ``/reset`` (POST), ``/version`` (GET).

faultnet's extensions, which Toxiproxy clients simply never call:

* ``POST /proxies/{p}/faults`` ``{"mode": M, "stream": "both"|"upstream"|"downstream",
  "include_new": bool, "connections": [ids]}`` with M one of
  :data:`faultnet.modes.MODES`; total when answered. ``GET`` shows the modes in force, ``DELETE``
  undoes them all (thaw, then restore). A disabled proxy answers 409.
* ``GET /proxies/{p}/connections``: live connections (peer, bytes each way, state).
* ``GET /proxies/{p}/events`` and ``GET /events`` (``?since=SEQ&limit=N``): the event
  log, numbered; the last 10,000 records are kept in memory, ``--event-log`` keeps all.
  ``dropped`` counts the records that file could not take (``last_error`` says why).

Where faultnet differs from Toxiproxy, on purpose: an omitted listen host is 127.0.0.1
(not every interface); toxicity is decided once per connection and kept; toxicity 0
never touches a connection; reset_peer and timeout also reach connections open before
they were added; timeout holds the FIN; ``POST /reset`` also ends faultnet's modes;
negative delays and sizes are a 400; a client's mistake is never a 5xx.
"""

from faultnet.lazyexports import lazy_exports

# Imported on first use (PEP 562): the client commands import faultnet.server.client,
# and importing this package must not bring starlette, h11 and trio with it
# (0.34 s of every `faultnet proxies`, measured with -X importtime).
#: Public name -> the module that defines it.
_EXPORTS = {
    "RunningServer": "faultnet.server.api",
    "create_app": "faultnet.server.api",
    "open_server": "faultnet.server.api",
    "serve_api": "faultnet.server.api",
    "ApiError": "faultnet.server.registry",
    "EventLog": "faultnet.server.registry",
    "ManagedProxy": "faultnet.server.registry",
    "ProxyRegistry": "faultnet.server.registry",
    "format_address": "faultnet.server.registry",
    "open_registry": "faultnet.server.registry",
    "parse_address": "faultnet.server.registry",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
