"""Addresses: the one parser and formatter of ``host:port`` for the proxy, the server,
the probe and the CLI.

An IPv6 host is written in brackets (``[::1]:8474``) both ways: :func:`format_address`
adds them and :func:`parse_address` requires them (``::1:8474`` is ambiguous). A bare host
(what :func:`parse_address` returns) has no brackets; :func:`is_loopback` judges one.
"""

from __future__ import annotations

import ipaddress
from typing import Any

__all__ = [
    "Address",
    "AddressError",
    "format_address",
    "is_loopback",
    "parse_address",
    "parse_peer",
    "peer_matches",
]

Address = tuple[str, int]


class AddressError(ValueError):
    """A ``host:port`` that cannot be parsed; the message says why."""


def parse_address(text: str, *, default_host: str | None = None, port_zero: bool = True) -> Address:
    """``HOST:PORT`` or ``[V6]:PORT`` -> ``(host, port)``; :class:`AddressError` saying why.

    An empty host is *default_host* (an error when None). Port 0 ("any free port") is
    accepted only with *port_zero*.
    """
    if not isinstance(text, str):
        raise AddressError(f"{text!r} is not HOST:PORT")
    host, sep, port_s = text.rpartition(":")
    if not sep:
        raise AddressError(f"{text!r} is not HOST:PORT")
    if not (port_s.isascii() and port_s.isdigit()):
        raise AddressError(f"port {port_s!r} in {text!r} is not a number")
    port = int(port_s)
    lowest = 0 if port_zero else 1
    if not lowest <= port <= 65535:
        raise AddressError(f"port {port} in {text!r} is out of range {lowest}-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise AddressError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:{port}")
    if any(c.isspace() or c in "[]/" or "\ud800" <= c <= "\udfff" for c in host) or "\0" in host:
        raise AddressError(f"{text!r}: invalid host")
    if not host:
        if default_host is None:
            raise AddressError(f"{text!r} is not HOST:PORT")
        host = default_host
    return host, port


def format_address(addr: Any) -> str:
    """``(host, port[, ...])`` -> ``host:port``, IPv6 in brackets (``[::1]:8474``)."""
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peer(text: str) -> tuple[str, int | None]:
    """A client selector, ``HOST`` or ``HOST:PORT`` (``[V6]`` / ``[V6]:PORT``), HOST an IP
    literal (it is matched against packets' source addresses) -> ``(host, port or None)``.
    :class:`AddressError` saying why."""
    if not isinstance(text, str) or not text:
        raise AddressError(f"peer {text!r} is not HOST or HOST:PORT")
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(bare)), None
    except ValueError:
        pass
    if ":" not in text:
        raise AddressError(f"peer {text!r}: the host must be an IP address")
    host, port = parse_address(text, port_zero=False)
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        raise AddressError(f"peer {text!r}: the host must be an IP address") from None


def peer_matches(peer: tuple[str, int | None], addr: Any) -> bool:
    """Whether a client at *addr* (host, port) is the one *peer* selects."""
    host, port = peer
    try:
        same_host = ipaddress.ip_address(addr[0]) == ipaddress.ip_address(host)
    except ValueError:
        return False
    return same_host and (port is None or port == addr[1])


def is_loopback(host: str) -> bool:
    """Whether a bare *host* (no brackets, no port) is loopback: ``localhost`` in any case,
    or an IP literal in 127.0.0.0/8 or ``::1``. Any other name is False without a lookup:
    it may resolve anywhere. The one judge for every "loopback only" rule (the server's
    API host, the chaos loopback rail, the enclave's listen host)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
