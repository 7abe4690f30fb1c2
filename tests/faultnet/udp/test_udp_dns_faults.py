"""The UDP proxy's ``dns`` fault with a real client: dnspython's resolver (with its
retries) and its stub client through the proxy to a loopback DNS responder; set and
cleared through the proxy, the API and the CLI; one ``dns_fault`` record per query."""

from __future__ import annotations

import dns.asyncquery
import dns.asyncresolver
import dns.flags
import dns.message
import dns.rcode
import dns.resolver
import pytest

from faultnet.eventlog import read_jsonl
from faultnet.protocols.dns import ACTIONS, QTYPES
from faultnet.server import ApiError, open_registry
from faultnet.udp import open_udp_proxy
from faultnet.udp.modes import DNS_ACTIONS, DNS_QTYPES, UDP_MODES
from tests.faultnet.server.test_server_cli import Cli, cli  # noqa: F401 (a fixture)
from tests.faultnet.udp.test_udp_dns import ANSWER, addresses, ask, dns_responder


def resolver(address: tuple[str, int], lifetime: float = 2.0) -> dns.asyncresolver.Resolver:
    r = dns.asyncresolver.Resolver(configure=False)
    r.nameservers = [address[0]]
    r.port = address[1]
    r.lifetime = lifetime
    r.timeout = lifetime
    r.retry_servfail = True  # a SERVFAIL is tried again (dnspython's own retry)
    r.cache = None
    return r


def dns_faults(log: object) -> list[dict[str, object]]:
    return [r for r in read_jsonl(str(log)).records if r["event"] == "dns_fault"]


def test_the_table_s_choices_are_the_decider_s() -> None:
    assert (DNS_ACTIONS, DNS_QTYPES) == (ACTIONS, QTYPES)
    assert UDP_MODES["dns"].undone_by == "clear"


async def test_two_servfails_then_an_answer_for_a_resolver_that_retries(tmp_path) -> None:
    log = tmp_path / "udp.jsonl"
    async with (
        dns_responder() as (server, answered),
        open_udp_proxy(server, event_log=str(log)) as proxy,
    ):
        await proxy.dns("servfail", qname="SERVICE.faultnet.test.", count=2)
        answer = await resolver(proxy.address).resolve("service.faultnet.test", "A")
        assert [rr.to_text() for rr in answer] == [ANSWER]
        assert answered[0] == 1  # the faulted two never reached the server
        assert proxy.state["dns"][0]["faulted"] == 2
    faults = dns_faults(log)
    assert [(f["action"], f["qname"], f["qtype"]) for f in faults] == [
        ("servfail", "service.faultnet.test.", "A")
    ] * 2


async def test_nxdomain_refused_truncate_rewrite_and_drop_as_a_client_sees_them() -> None:
    async with dns_responder() as (server, answered), open_udp_proxy(server) as proxy:
        await proxy.dns("nxdomain", qname="service.*")
        with pytest.raises(dns.resolver.NXDOMAIN):
            await resolver(proxy.address).resolve("service.faultnet.test", "A")
        await proxy.clear()
        await proxy.dns("refused")
        with pytest.raises(dns.resolver.NoNameservers, match="REFUSED"):
            await resolver(proxy.address).resolve("service.faultnet.test", "A")
        await proxy.clear()
        await proxy.dns("truncate", qtype="A")
        reply = await ask(proxy.address)
        assert reply.flags & dns.flags.TC and not reply.answer
        await proxy.clear()
        await proxy.dns("rewrite", address="10.9.9.9")
        assert addresses(await ask(proxy.address)) == ["10.9.9.9"]
        await proxy.clear()
        await proxy.dns("drop", count=1)
        with pytest.raises(dns.exception.Timeout):
            await ask(proxy.address, timeout=0.3)
        assert addresses(await ask(proxy.address)) == [ANSWER]  # count spent
        await proxy.clear()
        await proxy.dns("delay", delay_ms=150, qname="other.test")  # not this name
        assert addresses(await ask(proxy.address)) == [ANSWER]
        assert answered[0] == 4  # truncate, rewrite, after the drop, the other name


async def test_a_delayed_query_is_answered_that_late() -> None:
    import trio

    async with dns_responder() as (server, _), open_udp_proxy(server) as proxy:
        await proxy.dns("delay", delay_ms=150)
        start = trio.current_time()
        assert addresses(await ask(proxy.address, timeout=2.0)) == [ANSWER]
        assert trio.current_time() - start >= 0.15


async def test_a_malformed_datagram_crosses_untouched_while_a_rule_is_in_force() -> None:
    from faultnet.testing import udp_echo_server
    from faultnet.udp import udp_probe

    async with udp_echo_server() as (up, echoed), open_udp_proxy(up) as proxy:
        await proxy.dns("servfail")
        assert (await udp_probe(proxy.address, 2.0)).echoed and echoed[0] == 1


async def test_the_api_sets_and_clears_a_dns_fault_and_says_what_is_wrong() -> None:
    async with dns_responder() as (server, _), open_registry() as reg:
        mp = await reg.create(
            {"name": "dns", "upstream": f"{server[0]}:{server[1]}", "protocol": "udp"}
        )
        assert mp.proxy is not None
        r = await reg.apply_fault("dns", {"mode": "dns", "action": "servfail", "count": 1})
        assert (r["action"], r["count"], r["state"]["dns"][0]["action"]) == (
            "servfail",
            1,
            "servfail",
        )
        with pytest.raises(dns.resolver.NoNameservers, match="SERVFAIL"):
            await ask_resolver_once(mp.proxy.address)
        await reg.apply_fault("dns", {"mode": "clear"})
        assert reg.fault_state("dns")["dns"] == []
        for body, message in (
            ({"mode": "dns"}, "dns needs action"),
            ({"mode": "dns", "action": "explode"}, "action must be one of"),
            ({"mode": "dns", "action": "drop", "stream": "upstream"}, "stream must be both"),
            ({"mode": "dns", "action": "drop", "qtype": "aaaa"}, "qtype must be one of"),
            ({"mode": "dns", "action": "drop", "count": 1.5}, "count must be a whole number"),
        ):
            with pytest.raises(ApiError, match=message) as info:
                await reg.apply_fault("dns", body)
            assert info.value.status == 400
        await reg.apply_fault("dns", {"mode": "dns", "action": "refused"})
        await reg.reset()  # every undo: the rule goes
        assert reg.fault_state("dns")["dns"] == []


async def ask_resolver_once(address: tuple[str, int]) -> object:
    r = resolver(address)
    r.retry_servfail = False
    return await r.resolve("service.faultnet.test", "A")


async def test_a_dns_fault_from_the_command_line(cli: Cli) -> None:  # noqa: F811
    async with dns_responder() as (server, _):
        await cli.ok("create", "dns", "--protocol", "udp", "--upstream", f"{server[0]}:{server[1]}")
        listen = (await cli.json("proxies"))["dns"]["listen"]
        host, port = listen.rsplit(":", 1)
        r = await cli.json(
            "fault",
            "dns",
            "dns",
            "--action",
            "rewrite",
            "--qname",
            "service.*",
            "--address",
            "10.9.9.9",
            "--qtype",
            "A",
        )
        assert (r["action"], r["address"], r["qname"]) == ("rewrite", "10.9.9.9", "service.*")
        assert addresses(await ask((host, int(port)))) == ["10.9.9.9"]
        await cli.ok("fault", "dns", "clear")
        assert addresses(await ask((host, int(port)))) == [ANSWER]
        code, _, err = await cli("fault", "dns", "dns", "--action", "rewrite", "--address", "x")
        assert code == 2 and "address must be an IPv4 or IPv6 address" in err


async def test_which_queries_a_percent_faults_does_not_depend_on_their_order() -> None:
    import trio

    async def fates(order: list[int], concurrently: bool) -> set[int]:
        failed: set[int] = set()
        async with dns_responder() as (server, _), open_udp_proxy(server, seed=11) as proxy:
            await proxy.dns("servfail", percent=50)

            async def one(i: int) -> None:
                query = dns.message.make_query(f"host{i}.faultnet.test", "A")
                query.id = 1000 + i
                reply = await dns.asyncquery.udp(
                    query, *proxy.address[:1], port=proxy.address[1], timeout=2
                )
                if reply.rcode() == dns.rcode.SERVFAIL:
                    failed.add(i)

            if concurrently:
                async with trio.open_nursery() as nursery:
                    for i in order:
                        nursery.start_soon(one, i)
            else:
                for i in order:
                    await one(i)
        return failed

    ids = list(range(30))
    in_order = await fates(ids, concurrently=False)
    assert 5 <= len(in_order) <= 25  # half of 30, drawn
    assert await fates(ids[::-1], concurrently=True) == in_order
