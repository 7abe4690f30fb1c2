"""A DNS-style request/response through the UDP proxy, with third-party UDP programs:
dnspython's stub client and resolver (PyPI) against a small loopback DNS responder,
and socat's UDP mode (Debian) as a client. What each fault looks like to a real client."""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import dns.asyncquery
import dns.asyncresolver
import dns.exception
import dns.message
import dns.rrset
import pytest
import trio

from faultnet.testing import udp_echo_server, wait_until
from faultnet.udp import open_udp_proxy
from tests.conftest import require_program

ANSWER = "192.0.2.7"


@asynccontextmanager
async def dns_responder() -> AsyncIterator[tuple[tuple[str, int], list[int]]]:
    """A loopback DNS server: every A question is answered with 192.0.2.7. Yields
    (address, counter) where counter[0] counts the queries answered."""
    counter = [0]
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        await sock.bind(("127.0.0.1", 0))

        async def serve() -> None:
            while True:
                data, peer = await sock.recvfrom(65536)
                query = dns.message.from_wire(data)
                response = dns.message.make_response(query)
                for q in query.question:
                    response.answer.append(dns.rrset.from_text(q.name, 60, "IN", "A", ANSWER))
                counter[0] += 1  # before the send: the client may act on the answer at once
                await sock.sendto(response.to_wire(), peer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            yield sock.getsockname(), counter
            nursery.cancel_scope.cancel()


async def ask(address: tuple[str, int], timeout: float = 1.0) -> dns.message.Message:
    query = dns.message.make_query("service.faultnet.test", "A")
    return await dns.asyncquery.udp(query, address[0], port=address[1], timeout=timeout)


def addresses(response: dns.message.Message) -> list[str]:
    return [rr.to_text() for rrset in response.answer for rr in rrset]


async def test_a_dns_query_crosses_and_latency_shows_in_the_clients_round_trip() -> None:
    async with dns_responder() as (server, answered), open_udp_proxy(server) as proxy:
        assert addresses(await ask(proxy.address)) == [ANSWER]
        await proxy.latency(40, stream="upstream")
        await proxy.latency(40, stream="downstream")
        start = trio.current_time()
        assert addresses(await ask(proxy.address)) == [ANSWER]
        assert trio.current_time() - start >= 0.08
        assert answered[0] == 2


async def test_a_blackholed_dns_server_is_a_client_timeout_until_thaw() -> None:
    async with dns_responder() as (server, answered), open_udp_proxy(server) as proxy:
        await proxy.blackhole("downstream")
        with pytest.raises(dns.exception.Timeout):
            await ask(proxy.address, timeout=0.3)
        assert answered[0] == 1  # the server answered; the answer died on the way back
        await proxy.thaw()
        assert addresses(await ask(proxy.address)) == [ANSWER]


async def test_a_truncated_dns_answer_is_a_malformed_message_to_the_client() -> None:
    async with dns_responder() as (server, _), open_udp_proxy(server) as proxy:
        await proxy.size_limit(20, stream="downstream")
        with pytest.raises(dns.exception.FormError):
            await ask(proxy.address)


async def test_a_duplicated_answer_is_ignored_by_the_client() -> None:
    async with dns_responder() as (server, _), open_udp_proxy(server) as proxy:
        await proxy.duplicate(100, stream="downstream")
        assert addresses(await ask(proxy.address)) == [ANSWER]
        assert proxy.sessions()[0].counts["downstream"]["duplicated"] == 1


async def test_dnspythons_resolver_retries_through_seeded_loss() -> None:
    async with (
        dns_responder() as (server, answered),
        open_udp_proxy(server, seed=3) as proxy,
    ):
        await proxy.loss(60, stream="upstream")
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [proxy.address[0]]
        resolver.port = proxy.address[1]
        resolver.timeout = 0.1  # per try; it retries until the lifetime ends
        resolver.lifetime = 5.0
        answer = await resolver.resolve("service.faultnet.test", "A")
        assert [rr.to_text() for rr in answer] == [ANSWER]
        tries = sum(s.counts["upstream"]["received"] for s in proxy.sessions())
        lost = sum(s.counts["upstream"]["lost"] for s in proxy.sessions())
        assert tries == lost + answered[0] and answered[0] >= 1


async def test_socat_as_a_udp_client_sees_its_line_truncated() -> None:
    socat = require_program(shutil.which("socat"), "socat")
    async with udp_echo_server() as (up, _), open_udp_proxy(up) as proxy:
        await proxy.size_limit(5, stream="downstream")
        host, port = proxy.address
        with trio.fail_after(10):
            done = await trio.run_process(
                [socat, "-t", "1", "-", f"UDP4:{host}:{port}"],
                stdin=b"hello world\n",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert (done.returncode, done.stdout) == (0, b"hello"), done.stderr


async def _fates_of_fresh_socket_queries(seed: int, n: int, *, source_port: int) -> list[str]:
    """*n* dnspython queries through 10 % loss each way, each from a fresh socket
    (dnspython's default), one at a time: the fate of each, "answered" or "lost".

    ``source_port`` 0 lets the kernel pick each socket's port; a fixed port makes every
    query reuse it, so they all land in one session (the kernel's reuse, forced)."""
    async with dns_responder() as (server, _), open_udp_proxy(server, seed=seed) as proxy:
        await proxy.loss(10)

        def lost() -> int:
            return sum(c["lost"] for s in proxy.sessions() for c in s.counts.values())

        fates: list[str] = []
        for _ in range(n):
            before = lost()
            async with trio.open_nursery() as nursery:

                async def query(nursery: trio.Nursery = nursery) -> None:
                    query = dns.message.make_query("service.faultnet.test", "A")
                    await dns.asyncquery.udp(
                        query,
                        proxy.address[0],
                        port=proxy.address[1],
                        timeout=10,
                        source="127.0.0.1",
                        source_port=source_port,
                    )
                    fates.append("answered")
                    nursery.cancel_scope.cancel()

                async def watch(nursery: trio.Nursery = nursery, before: int = before) -> None:
                    # A lost query or answer is the proxy's count going up: no timeout
                    # decides it.
                    await wait_until(lambda: lost() > before, timeout=10)
                    fates.append("lost")
                    nursery.cancel_scope.cancel()

                nursery.start_soon(query)
                nursery.start_soon(watch)
        return fates


async def test_a_seed_replays_the_same_fates_whatever_source_ports_the_kernel_picks() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free a moment ago; UDP rebinds it at once
    kernel_ports = await _fates_of_fresh_socket_queries(5, 80, source_port=0)
    one_port = await _fates_of_fresh_socket_queries(5, 80, source_port=port)
    assert kernel_ports == one_port
    assert 3 <= kernel_ports.count("lost") <= 35
