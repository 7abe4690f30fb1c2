"""What the proxies (TCP and UDP) raise."""

from __future__ import annotations

import errno

from faultnet.addresses import format_address

__all__ = ["AddressInUse", "ProxyError", "listen_error"]

Address = tuple[str, int]


class ProxyError(Exception):
    """A proxy could not do what was asked (e.g. it cannot listen on its address)."""


class AddressInUse(ProxyError):
    """The listen address is taken (EADDRINUSE): an environment error, not a mistake in
    the request (the server answers it with Toxiproxy's 500)."""


def listen_error(where: Address, exc: OSError) -> ProxyError:
    """What a proxy (TCP or UDP) raises when it cannot bind its listen address *where*:
    :class:`AddressInUse` for EADDRINUSE, else :class:`ProxyError` with the OS's reason."""
    text = format_address(where)
    if exc.errno == errno.EADDRINUSE:
        return AddressInUse(f"listen address {text} is already in use")
    return ProxyError(f"cannot listen on {text}: {exc.strerror}")
