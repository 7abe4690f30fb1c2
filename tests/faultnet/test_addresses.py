"""The one loopback judge (:func:`faultnet.addresses.is_loopback`), by table: what every
"loopback only" rule (server API host, chaos rail, enclave listen host) accepts."""

from __future__ import annotations

import pytest

from faultnet.addresses import is_loopback

LOOPBACK = [
    "localhost",
    "LOCALHOST",
    "LocalHost",
    "127.0.0.1",
    "127.255.255.254",
    "127.0.0.2",
    "::1",
]
NOT_LOOPBACK = [
    "",
    "0.0.0.0",  # every interface, not loopback
    "::",
    "192.0.2.1",  # TEST-NET-1
    "10.0.0.1",
    "::2",
    "128.0.0.1",
    "localhost.",  # a name: resolved elsewhere, never trusted
    "localhost.example",
    "example.com",
    "[::1]",  # a bare host has no brackets (parse_address strips them)
    "127.0.0.1:80",  # nor a port
    " 127.0.0.1",
]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts_are_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_every_other_host_is_not(host: str) -> None:
    assert not is_loopback(host)
