"""The dns toxic held against dnsmasq producing the same answer over TCP (principle 13),
on loopback: the real arm is dnsmasq itself answering (an ``address=`` line: NXDOMAIN,
or the rewrite's address) behind a TCP proxy with no toxic; faultnet's arm is dnsmasq
answering normally (``host-record``) behind a TCP proxy with the ``dns`` toxic. Two
real clients, dnspython's ``dns.query.tcp`` and its resolver with ``tcp=True`` (its
own retries): the same outcome (RCODE and addresses, or the exception) after the same
number of TCP connections. Each row has a breakage that turns it red (the wrong
address; no fault at all)."""

from __future__ import annotations

import functools
import shutil
import socket
from pathlib import Path
from typing import Any

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.resolver
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import open_proxy
from faultnet.toxics import Dns
from tests.conftest import require_program
from tests.faultnet.udp.test_dns_fidelity import dnsmasq

NAME = "www.example.test"
NORMAL = [f"host-record={NAME},10.0.0.1"]
#: row -> (the real dnsmasq's lines, the toxic's attributes)
ROWS = {
    "nxdomain": ([f"address=/{NAME}/"], {"action": "nxdomain"}),
    "rewrite": ([f"address=/{NAME}/10.9.9.9"], {"action": "rewrite", "address": "10.9.9.9"}),
}


def free_port() -> int:
    # dnsmasq binds it a moment later: a port another test takes meanwhile fails loudly
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clients(host: str, port: int) -> dict[str, object]:
    """What each client sees (run in a thread)."""
    query = dns.message.make_query(NAME, "A")
    response = dns.query.tcp(query, host, port=port, timeout=5)
    seen: dict[str, object] = {
        "query.tcp": (
            dns.rcode.to_text(response.rcode()),
            sorted(rr.to_text() for rrset in response.answer for rr in rrset),
        )
    }
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port, resolver.lifetime = [host], port, 5.0
    try:
        seen["resolver"] = sorted(rr.to_text() for rr in resolver.resolve(NAME, "A", tcp=True))
    except dns.exception.DNSException as exc:
        seen["resolver"] = type(exc).__name__
    return seen


async def arm(tmp_path: Path, tag: str, lines: list[str], toxic: dict[str, Any] | None) -> Any:
    """The clients' outcomes and the TCP connections they made, through a proxy (with
    the dns *toxic*, or none) in front of a dnsmasq with *lines*."""
    port = free_port()
    log = tmp_path / f"{tag}.jsonl"
    with dnsmasq(tmp_path, tag, port, lines):
        async with open_proxy(("127.0.0.1", port), event_log=str(log)) as proxy:
            if toxic is not None:
                proxy.add_toxic(Dns(**toxic))
            assert proxy.address is not None
            call = functools.partial(clients, proxy.address[0], proxy.address[1])
            seen = await trio.to_thread.run_sync(call)
    opened = sum(r["event"] == "conn_open" for r in read_jsonl(str(log)).records)
    return seen, opened


@pytest.fixture(autouse=True)
def _dnsmasq() -> None:
    require_program(shutil.which("dnsmasq"), "dnsmasq")


@pytest.mark.parametrize("row", list(ROWS))
async def test_the_dns_toxic_over_tcp_is_what_dnsmasq_answering_so_is(
    row: str, tmp_path: Path
) -> None:
    lines, toxic = ROWS[row]
    real = await arm(tmp_path, "real", lines, None)
    faulted = await arm(tmp_path, "faulted", NORMAL, toxic)
    print(row, "real:", real, "faultnet:", faulted)
    assert faulted == real, (row, real, faulted)
    # The breakage "a fault that does nothing": the healthy answer differs.
    assert await arm(tmp_path, "healthy", NORMAL, None) != real


async def test_a_wrong_address_turns_the_rewrite_row_red(tmp_path: Path) -> None:
    real = await arm(tmp_path, "real", ROWS["rewrite"][0], None)
    wrong = {"action": "rewrite", "address": "10.9.9.8"}
    assert await arm(tmp_path, "wrong", NORMAL, wrong) != real
