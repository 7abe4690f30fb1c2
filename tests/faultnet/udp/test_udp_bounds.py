"""The UDP proxy's memory is bounded and given back (issue 24 item 12): the bytes a
session and the proxy may keep waiting, the number of sessions (the longest idle is
evicted), memory returned after a thaw, and 10,000 sessions stopped within a second."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from faultnet.eventlog import read_jsonl
from faultnet.testing import udp_echo_server, wait_for_record, wait_until
from faultnet.udp import open_udp_proxy
from faultnet.udp.proxy import UdpProxy

BIG = 65507  # the largest IPv4 UDP payload


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def upstream_counts(proxy: UdpProxy, key: str) -> int:
    return sum(s.counts["upstream"][key] for s in proxy.sessions())


async def send_each(
    proxy: UdpProxy, payloads: list[bytes], sock: socket.socket, done: int = 0
) -> None:
    """Send *payloads* from *sock* one at a time, each seen by the proxy (held, dropped
    or passed) before the next: the proxy's receive buffer never drops one."""
    for i, p in enumerate(payloads, start=done + 1):
        sock.sendto(p, proxy.address)
        await wait_until(lambda i=i: proxy.state["received"]["upstream"] >= i)


@asynccontextmanager
async def client() -> AsyncIterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def test_a_freeze_holds_at_most_session_bytes_and_gives_the_memory_back() -> None:
    """In a process of its own: in the suite's long-lived one, 16 MiB held fit in heap
    earlier tests had freed, so RSS did not rise and the give-back could not be judged
    (seen in a whole-suite run)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import trio, " + __name__ + " as m; trio.run(m.held_then_given_back)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-3000:]


async def held_then_given_back() -> None:
    payload = b"m" * BIG
    async with (
        udp_echo_server() as (up, _),
        open_udp_proxy(up, session_bytes=256 * BIG) as proxy,
        client() as c,
    ):
        before = rss_bytes()
        await proxy.freeze()
        await send_each(proxy, [payload] * 400, c)
        session = proxy.sessions()[0]
        assert session.held["upstream"] == 256
        assert session.counts["upstream"]["hold_overflow"] == 144
        assert proxy.state["buffered_bytes"] == 256 * BIG
        assert rss_bytes() - before > 10 * 2**20  # 16 MiB held: the check below can fail
        assert await proxy.thaw() == 256
        await wait_until(
            lambda: upstream_counts(proxy, "sent") == 256, what="the 256 held sent upstream"
        )
        assert proxy.state["buffered_bytes"] == 0
        # Given back (malloc_trim at the thaw or within a second of the lanes draining):
        # without it the 16 MiB stayed (the issue: 551 MB kept after a thaw).
        await wait_until(
            lambda: rss_bytes() - before < 4 * 2**20, timeout=5, what="memory given back"
        )


async def test_the_proxy_bound_caps_what_all_sessions_hold_together() -> None:
    async with (
        udp_echo_server() as (up, _),
        open_udp_proxy(up, session_bytes=10_000, proxy_bytes=15_000) as proxy,
        client() as a,
        client() as b,
    ):
        await proxy.freeze()
        await send_each(proxy, [b"a" * 1000] * 12, a)
        await send_each(proxy, [b"b" * 1000] * 10, b, done=12)
        held = {
            s.id: (s.held["upstream"], s.counts["upstream"]["hold_overflow"])
            for s in proxy.sessions()
        }
        assert held == {1: (10, 2), 2: (5, 5)}
        assert proxy.state["buffered_bytes"] == 15_000
        await proxy.blackhole()  # what was held is dropped, and its bytes given back
        assert proxy.state["buffered_bytes"] == 0


async def test_datagrams_queued_behind_a_latency_are_bounded_too() -> None:
    async with (
        udp_echo_server() as (up, echoed),
        open_udp_proxy(up, session_bytes=10_000) as proxy,
        client() as c,
    ):
        await proxy.latency(60_000, stream="upstream")
        await send_each(proxy, [b"q" * 1000] * 30, c)
        counts = proxy.sessions()[0].counts["upstream"]
        assert counts["queue_overflow"] == 20 and echoed[0] == 0
        assert proxy.state["buffered_bytes"] == 10_000
    assert proxy.state["buffered_bytes"] == 0  # closing the session gave it back


async def test_a_new_client_beyond_max_sessions_evicts_the_longest_idle(tmp_path) -> None:
    log = tmp_path / "udp.jsonl"
    async with (
        udp_echo_server() as (up, _),
        open_udp_proxy(up, max_sessions=3, event_log=str(log)) as proxy,
        client() as a,
        client() as b,
        client() as c,
        client() as d,
    ):
        for n, sock in enumerate((a, b, c, a), start=1):  # a again: b is now the idlest
            await send_each(proxy, [b"hello"], sock, done=n - 1)
        await send_each(proxy, [b"hello"], d, done=4)
        assert sorted(s.id for s in proxy.sessions()) == [1, 3, 4]
        assert proxy.state["evicted"] == 1
        evicted = await wait_for_record(log, event="session_close", how="evicted")
        assert evicted["session"] == 2
        assert evicted["peer"] == f"127.0.0.1:{b.getsockname()[1]}"
    listening = next(r for r in read_jsonl(log).records if r["event"] == "listening")
    assert listening["max_sessions"] == 3


async def test_ten_thousand_sessions_stop_within_a_second_of_cpu() -> None:
    # A session is a descriptor: fewer where the hard limit says so, the bound scaled.
    n = min(10_000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 1_000)
    async with udp_echo_server() as (up, _):
        proxy = UdpProxy(up, max_sessions=n)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            for i in range(n):
                # Each from its own loopback address: n sessions whatever the ports.
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    sock.bind((f"127.3.{i // 250}.{i % 250 + 1}", 0))
                    sock.sendto(b"s", proxy.address)
                if i % 64 == 63:
                    await wait_until(lambda i=i: proxy.state["sessions"] >= i - 7, timeout=20)
            await wait_until(lambda: proxy.state["sessions"] == n, timeout=20)
            # CPU time, not wall time: the machine's other load must not decide this.
            # Measured 0.4-0.6 s (a task per session before: 5.6 s of wall time).
            start = time.process_time()
            await proxy.aclose()
        assert time.process_time() - start < n / 10_000
        assert proxy.state["sessions"] == 0
