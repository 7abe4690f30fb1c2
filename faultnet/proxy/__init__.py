"""The fault proxy: a trio TCP proxy whose links can be frozen, blackholed, severed and
reset, whose listener can drop SYNs or refuse, and whose bytes can pass through toxics.

The package, one concept per module:

* ``_faultstate`` -- the fault state of a connection, per stream, and of new connections
  and the listener: what every mode does and what undoes it, as tables (pure, no I/O);
* ``_connection`` -- one connection: its sockets, its fault state made real on its
  plane and sockets, its toxics, its life from accept to ``conn_close``;
* ``_toxiclink`` -- a toxic link: one stream's path through its toxics (chain, task);
* ``_hop`` -- the internal hop of two-way loss;
* ``_proxy`` -- the :class:`Proxy`: listener and accept loop, the fault operations, toxics;
* ``_sharedplane`` -- the planes the proxies of a trio run share (one of each kind);
* ``_errors`` -- what the proxies raise.

Bytes move on a data plane (:mod:`faultnet.planes`), behind one interface.

Semantics every fault method shares:

* It is **total when it returns**. ``freeze`` closes each affected stream's gate on the
  plane (see :mod:`faultnet.planes`), so no byte crosses after it; ``sever`` and ``reset`` have sent
  their FIN or RST by then; ``refuse`` has closed the listener and ``drop_syn`` has
  attached its filter.
* ``freeze``, ``blackhole``, ``sever`` and ``reset`` act on the connections open at the
  call (a laptop that changed networks: old sockets dead, new ones fine).
  ``include_new=True`` extends ``freeze``/``blackhole`` to connections accepted later,
  until ``thaw``. ``drop_syn`` and ``refuse`` last until ``restore``; ``drop_syn`` with
  ``freeze(include_new=True)`` models a route that died outright.
* Half-close is kept: a FIN one way is forwarded as a FIN (``shutdown(SHUT_WR)``) and the
  other direction keeps flowing. While a direction is frozen its FIN or RST is held (not
  even read) and passed on after the held bytes, in order, on thaw.

Every connection and every fault is one record in the JSONL event log.
"""

from faultnet.proxy._connection import CONNECTION_STATES, ConnectionInfo
from faultnet.proxy._errors import AddressInUse, ProxyError, listen_error
from faultnet.proxy._proxy import SEVER_LINGER_S, Proxy, open_proxy

__all__ = [
    "CONNECTION_STATES",
    "SEVER_LINGER_S",
    "AddressInUse",
    "ConnectionInfo",
    "Proxy",
    "ProxyError",
    "listen_error",
    "open_proxy",
]
