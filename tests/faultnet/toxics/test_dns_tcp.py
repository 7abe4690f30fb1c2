"""The ``dns`` toxic (faultnet.toxics.dns): DNS over TCP through the TCP proxy, with
dnspython's real clients (``dns.query.tcp``, the stub resolver with ``tcp=True``, each
in a thread as a program would call them) against a small dnspython TCP server. What
each fault looks like to a client."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.resolver
import dns.rrset
import httpx
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.protocols.dns_tcp import Framer, frame
from faultnet.proxy import Proxy
from faultnet.server import RunningServer
from faultnet.testing import start_server, wait_for_record
from faultnet.toxics import TOXICS, Dns

Factory = Callable[..., Awaitable[Proxy]]
ANSWER = "192.0.2.7"
NAME = "service.faultnet.test"


class Server:
    """A loopback DNS-over-TCP server: every question is answered with an A record of
    :data:`ANSWER`; ``answered`` counts the queries."""

    def __init__(self) -> None:
        self.answered = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        framer = Framer()
        async with stream:
            while data := await stream.receive_some():
                for message in framer.feed(data):
                    query = dns.message.from_wire(message)
                    response = dns.message.make_response(query)
                    for q in query.question:
                        response.answer.append(dns.rrset.from_text(q.name, 60, "IN", "A", ANSWER))
                    self.answered += 1
                    await stream.send_all(frame(response.to_wire()))


@pytest.fixture
async def server(nursery: trio.Nursery) -> tuple[Server, tuple[str, int]]:
    s = Server()
    return s, await start_server(nursery, s.handle)


@pytest.fixture
async def proxy(
    faultnet_proxy: Factory, server: tuple[Server, tuple[str, int]], tmp_path: Path, each_plane: str
) -> Proxy:
    """A proxy in front of the server, on each data plane built here."""
    log = str(tmp_path / "events.jsonl")
    return await faultnet_proxy(server[1], event_log=log, dataplane=each_plane)


def address(proxy: Proxy) -> tuple[str, int]:
    assert proxy.address is not None
    return proxy.address[0], proxy.address[1]


async def ask(proxy: Proxy, name: str = NAME, timeout: float = 5.0) -> dns.message.Message:
    """``dns.query.tcp`` through *proxy*, in a thread."""
    host, port = address(proxy)
    query = dns.message.make_query(name, "A")
    call = functools.partial(dns.query.tcp, query, host, port=port, timeout=timeout)
    return await trio.to_thread.run_sync(call)


async def resolve(proxy: Proxy, name: str = NAME) -> list[str]:
    """The stub resolver over TCP (``tcp=True``) through *proxy*, in a thread."""
    host, port = address(proxy)
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [host]
    resolver.port = port
    resolver.lifetime = 5.0
    call = functools.partial(resolver.resolve, name, "A", tcp=True)
    answer = await trio.to_thread.run_sync(call)
    return [rr.to_text() for rr in answer]


def addresses(response: dns.message.Message) -> list[str]:
    return [rr.to_text() for rrset in response.answer for rr in rrset]


def faults(log: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(log).records if r["event"] == "dns_fault"]


def test_dns_is_one_registered_both_stream_type() -> None:
    assert TOXICS["dns"] is Dns and Dns.both_streams
    with pytest.raises(ValueError, match="delay_ms"):
        Dns(action="delay")
    with pytest.raises(ValueError, match="address"):
        Dns(action="rewrite", address="not-an-ip")
    toxic = Dns(action="delay", delay_ms=100)
    with pytest.raises(ValueError):
        toxic.update({"action": "servfail"})  # delay_ms stays: refused, nothing changed
    assert toxic.action == "delay"
    toxic.update({"action": "servfail", "delay_ms": 0})
    assert toxic.faults.rules[0].action == "servfail"


async def test_a_query_no_rule_faults_crosses(
    proxy: Proxy, server: tuple[Server, tuple[str, int]]
) -> None:
    proxy.add_toxic(Dns(action="servfail", qname="other.test"))
    assert addresses(await ask(proxy)) == [ANSWER]
    assert await resolve(proxy) == [ANSWER]
    assert server[0].answered == 2


@pytest.mark.parametrize(
    ("action", "rcode"),
    [
        ("servfail", dns.rcode.SERVFAIL),
        ("nxdomain", dns.rcode.NXDOMAIN),
        ("refused", dns.rcode.REFUSED),
    ],
)
async def test_an_rcode_is_answered_by_the_proxy_and_logged(
    proxy: Proxy,
    server: tuple[Server, tuple[str, int]],
    tmp_path: Path,
    action: str,
    rcode: int,
) -> None:
    proxy.add_toxic(Dns("fail", action=action, qname="*.faultnet.test"))
    response = await ask(proxy)
    assert response.rcode() == rcode and not response.answer
    assert server[0].answered == 0
    record = await wait_for_record(tmp_path / "events.jsonl", event="dns_fault")
    assert record["action"] == action and record["toxic"] == "fail"
    assert record["qname"] == NAME + "." and record["qtype"] == "A"


async def test_the_resolver_over_tcp_meets_nxdomain_and_a_rewrite(proxy: Proxy) -> None:
    toxic = Dns("dns", action="nxdomain")
    proxy.add_toxic(toxic)
    with pytest.raises(dns.resolver.NXDOMAIN):
        await resolve(proxy)
    proxy.update_toxic("dns", {"action": "rewrite", "address": "198.51.100.4"})
    assert await resolve(proxy) == ["198.51.100.4"]


async def test_count_drops_the_first_query_then_lets_the_retry_through(
    proxy: Proxy, server: tuple[Server, tuple[str, int]], tmp_path: Path
) -> None:
    proxy.add_toxic(Dns(action="drop", count=1))
    # The first query is sent by hand and its drop awaited in the log: a client whose
    # own 0.3 s ran out before it had even sent the query (a slow connect in a loaded
    # suite) left the count to the retry, which was dropped instead (seen once).
    sock = await trio.open_tcp_stream(*address(proxy))
    async with sock:
        await sock.send_all(frame(dns.message.make_query(NAME, "A").to_wire()))
        await wait_for_record(tmp_path / "events.jsonl", event="dns_fault", action="drop")
        with trio.move_on_after(0.3):  # dropped: nothing comes back on it
            assert await sock.receive_some() == b"", "a dropped query was answered"
    assert addresses(await ask(proxy)) == [ANSWER]
    assert server[0].answered == 1
    assert [r["action"] for r in faults(tmp_path / "events.jsonl")] == ["drop"]


async def test_a_delayed_query_is_answered_no_sooner_than_its_delay(proxy: Proxy) -> None:
    proxy.add_toxic(Dns(action="delay", delay_ms=200))
    start = trio.current_time()
    assert addresses(await ask(proxy)) == [ANSWER]
    assert trio.current_time() - start >= 0.2


async def test_truncate_sets_tc_on_the_tcp_answer(proxy: Proxy) -> None:
    proxy.add_toxic(Dns(action="truncate"))
    response = await ask(proxy)
    assert response.flags & dns.flags.TC and not response.answer


async def test_frames_split_and_joined_by_the_client_are_each_judged(
    proxy: Proxy, server: tuple[Server, tuple[str, int]]
) -> None:
    # Two queries in one write, the second cut byte by byte: the first answered by the
    # proxy, the second by the server, in order.
    proxy.add_toxic(Dns(action="refused", qname="bad.test"))
    bad = dns.message.make_query("bad.test", "A")
    good = dns.message.make_query(NAME, "A")
    data = frame(bad.to_wire()) + frame(good.to_wire())
    stream = await trio.open_tcp_stream(*address(proxy))
    framer = Framer()
    got: list[dns.message.Message] = []
    with trio.fail_after(10):
        async with stream:
            cut = len(frame(bad.to_wire())) + 1
            await stream.send_all(data[:cut])
            for i in range(cut, len(data)):
                await stream.send_all(data[i : i + 1])
            while len(got) < 2:
                chunk = await stream.receive_some()
                assert chunk, "the proxy closed before both answers"
                got += [dns.message.from_wire(m) for m in framer.feed(chunk)]
    assert [(m.id, m.rcode()) for m in got] == [
        (bad.id, dns.rcode.REFUSED),
        (good.id, dns.rcode.NOERROR),
    ]
    assert server[0].answered == 1


async def test_the_api_answers_an_inconsistent_rule_with_a_400(
    faultnet_server: RunningServer,
) -> None:
    # An action without its figure (delay without delay_ms) is the user's mistake: a 400
    # naming it, on an add and on an update, and the toxic left as it was.
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as api:
        r = await api.post(
            "/proxies", json={"name": "d", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}
        )
        assert r.status_code == 201, r.text
        r = await api.post(
            "/proxies/d/toxics", json={"type": "dns", "attributes": {"action": "delay"}}
        )
        assert r.status_code == 400 and "delay_ms" in r.json()["error"], r.text
        body = {"type": "dns", "attributes": {"action": "delay", "delay_ms": 50}}
        r = await api.post("/proxies/d/toxics", json=body)
        assert r.status_code == 200, r.text
        r = await api.post(
            "/proxies/d/toxics/dns_downstream", json={"attributes": {"action": "drop"}}
        )
        assert r.status_code == 400 and "delay_ms" in r.json()["error"], r.text
        r = await api.get("/proxies/d/toxics/dns_downstream")
        assert r.json()["attributes"]["action"] == "delay"
