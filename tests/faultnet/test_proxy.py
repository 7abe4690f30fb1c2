"""faultnet.Proxy over real loopback sockets: forwarding, half-close, every fault mode's
client-visible signature, totality of freeze, and resource hygiene."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import socket
import struct

import pytest
import trio

from faultnet import controls
from faultnet.eventlog import read_jsonl
from faultnet.modes import MODES
from faultnet.probe import ProbeKind, probe
from faultnet.proxy import Proxy, ProxyError, open_proxy
from faultnet.sockopts import attach_drop_all, detach_filter, set_keepalive
from faultnet.testing import accept_server, echo_server, open_link, read_exactly, wait_until
from faultnet.toxics import Latency, Slicer
from faultnet.toxics.base import Toxic

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")


class PassThrough(Toxic):
    """A toxic that changes nothing: forces the copy path and the toxic chain."""

    type = "passthrough"


async def _recv_outcome(stream: trio.SocketStream) -> str:
    try:
        data = await stream.receive_some(65536)
    except trio.BrokenResourceError as exc:
        return errno.errorcode[exc.__cause__.errno]
    return "eof" if not data else "data"


# -- forwarding ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["splice", "copy", "copy+toxic"])
async def test_byte_exact_both_ways_at_once(path: str) -> None:
    """64 MiB of random bytes each way, simultaneously, random write sizes: sha256 equal."""
    size = 64 * 1024 * 1024
    rng = random.Random(1234)
    up_data, down_data = os.urandom(size), os.urandom(size)

    async def send_random(stream: trio.SocketStream, data: bytes) -> None:
        view, i = memoryview(data), 0
        while i < len(data):
            n = rng.randint(1, 300_000)
            await stream.send_all(view[i : i + n])
            i += n
        await stream.send_eof()

    async def receive_all(stream: trio.SocketStream, out: list[str]) -> None:
        h, total = hashlib.sha256(), 0
        while data := await stream.receive_some(rng.randint(1, 1 << 20)):
            h.update(data)
            total += len(data)
        out.append(f"{total}:{h.hexdigest()}")

    async with accept_server() as (addr, accepted):
        async with open_proxy(addr, splice=path == "splice") as proxy:
            if path == "copy+toxic":
                proxy.add_toxic(PassThrough("p_up", "upstream"))
                proxy.add_toxic(PassThrough("p_down", "downstream"))
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            got_up: list[str] = []
            got_down: list[str] = []
            with trio.fail_after(90):
                async with trio.open_nursery() as n:
                    n.start_soon(send_random, client, up_data)
                    n.start_soon(send_random, server, down_data)
                    n.start_soon(receive_all, server, got_up)
                    n.start_soon(receive_all, client, got_down)
            assert got_up == [f"{size}:{hashlib.sha256(up_data).hexdigest()}"]
            assert got_down == [f"{size}:{hashlib.sha256(down_data).hexdigest()}"]


@pytest.mark.parametrize("splice", [True, False])
async def test_half_close_both_directions(splice: bool) -> None:
    """A FIN one way is forwarded as a FIN; the other direction keeps flowing."""
    async with accept_server() as (addr, accepted), open_proxy(addr, splice=splice) as proxy:
        # Each side half-closes first in turn: the other sees EOF and can still reply.
        for client_first in (True, False):
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            first, second = (client, server) if client_first else (server, client)
            await first.send_all(b"first words")
            await first.send_eof()
            with trio.fail_after(5):
                assert await read_exactly(second, 11) == b"first words"
                assert await second.receive_some(10) == b""  # the FIN, forwarded
                await second.send_all(b"the reply after your FIN")
                assert await read_exactly(first, 24) == b"the reply after your FIN"
                await second.send_eof()
                assert await first.receive_some(10) == b""


async def test_both_proxy_sockets_of_every_connection_send_without_delay(each_plane: str) -> None:
    """TCP_NODELAY on the accepted client socket and the upstream socket alike: a
    toxic's split writes would otherwise meet the peer's delayed ACK (sockopts.set_nodelay:
    44 ms per request through a slicer, measured)."""
    async with echo_server() as up, open_proxy(up) as proxy:
        proxy.add_toxic(Slicer("slices", "downstream", average_size=100))
        clients = [await trio.open_tcp_stream(*proxy.address) for _ in range(3)]
        for c in clients:  # a round trip each: both sockets exist and carry bytes
            await c.send_all(b"x" * 1000)
            assert await read_exactly(c, 1000) == b"x" * 1000
        conns = list(proxy._connections.values())
        assert len(conns) == 3
        for conn in conns:
            for sock in (conn.client, conn.server):
                assert sock is not None
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), (conn.id, sock)
        for c in clients:
            await c.aclose()


async def test_an_upstream_named_by_host_name_is_resolved_and_reached() -> None:
    """``localhost`` (from /etc/hosts: no DNS server is asked) resolves to 127.0.0.1,
    as trio's connect would resolve it; the thread plane resolves it in a task. With a
    toxic too, and one added while connected (their tasks start after the name is
    resolved: once, a connection reset here)."""
    async with echo_server() as up, open_proxy(("localhost", up[1])) as proxy:
        proxy.add_toxic(Latency("lat", "downstream", latency=1))
        for i in range(2):
            if i:
                proxy.add_toxic(Slicer("slices", "upstream", average_size=2))
            s = await trio.open_tcp_stream(*proxy.address)
            await s.send_all(b"named")
            with trio.fail_after(5):
                assert await read_exactly(s, 5) == b"named"
            await s.aclose()


async def test_the_listing_counts_every_byte_a_peer_has_read() -> None:
    """Once the client has its echo, the listing counts those bytes both ways (on the
    thread plane the count once lagged the send: 0 downstream after a 1,000-byte echo,
    in the suite)."""
    async with echo_server() as up, open_proxy(up) as proxy:
        s = await trio.open_tcp_stream(*proxy.address)
        for i in range(1, 301):
            await s.send_all(b"x" * 10)
            with trio.fail_after(5):
                await read_exactly(s, 10)
            (info,) = proxy.connections()
            assert (info.bytes_upstream, info.bytes_downstream) == (10 * i, 10 * i)


async def test_cancelling_serve_closes_every_connection() -> None:
    """No connection outlives its proxy, however serve() ends (on the thread plane no
    task per connection is cancelled with it: serve ends them itself)."""
    async with echo_server() as up:
        proxy = Proxy(up)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            s = await trio.open_tcp_stream(*proxy.address)
            await s.send_all(b"x")
            with trio.fail_after(5):
                assert await read_exactly(s, 1) == b"x"
            nursery.cancel_scope.cancel()
        with trio.fail_after(5):
            assert await s.receive_some(10) == b""
        assert proxy.connections() == []


async def test_upstream_refusing_or_hanging_closes_client_and_logs(tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    # A port nobody listens on: bind, note the port, close.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()
    s.close()
    # A listener that drops every SYN: connects to it hang.
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    attach_drop_all(hanging)
    try:
        for upstream, reason in ((dead, "refused"), (hanging.getsockname(), "within 0.3 s")):
            async with open_proxy(upstream, event_log=str(log), connect_timeout=0.3) as proxy:
                client = await trio.open_tcp_stream(*proxy.address)
                with trio.fail_after(5):
                    assert await _recv_outcome(client) == "eof"
                # The proxy keeps serving: a second client is accepted and closed too.
                assert (await probe(proxy.address, 1)).kind is ProbeKind.CONNECTED
            failures = [r for r in read_jsonl(log).records if r["event"] == "upstream_failed"]
            assert reason in failures[-1]["reason"].lower()
    finally:
        hanging.close()


async def test_listen_address_in_use_is_a_clear_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ProxyError, match=f"127.0.0.1:{port} is already in use"):
            async with open_proxy(("127.0.0.1", 9), ("127.0.0.1", port)):
                pass
    finally:
        taken.close()


# -- fault modes: client-visible signatures -----------------------------------------------


async def test_refuse_and_restore_same_port() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        port = proxy.address[1]
        await proxy.refuse()  # before the accept loop first ran: that race crashed it once
        await proxy.restore()
        await proxy.refuse()
        result = await controls.assert_refusing(proxy.address, timeout=1.0)
        assert result.elapsed_s < 0.5  # refused at once, not after the timeout
        await proxy.restore()
        assert proxy.address[1] == port
        await controls.assert_accepting(proxy.address)


async def test_drop_syn_hangs_and_restore_lets_a_retrying_client_in() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        await proxy.drop_syn()
        result = await controls.assert_syn_dropped(proxy.address, timeout=0.5)
        assert result.elapsed_s >= 0.5  # hung for the whole window
        connected = trio.Event()

        async def retrying_client() -> None:
            stream = await trio.open_tcp_stream(*proxy.address)
            connected.set()
            await stream.aclose()

        async with trio.open_nursery() as n:
            n.start_soon(retrying_client)
            with trio.move_on_after(1.5):  # SYN retries come at 1 s, 3 s, ...
                await connected.wait()
            assert not connected.is_set(), "a client connected while SYNs were dropped"
            await proxy.restore()
            with trio.fail_after(10):  # the next SYN retry gets through
                await connected.wait()


async def test_sever_is_a_clean_fin_even_with_unread_bytes() -> None:
    async with open_link() as (proxy, client, server):
        await client.send_all(b"x")
        await read_exactly(server, 1)
        await proxy.freeze()
        await client.send_all(b"unread bytes held in the proxy")  # sits unread at the proxy
        # On loopback, send() has queued these at the proxy's socket by the time it returns.
        await server.send_all(b"unread the other way")
        await proxy.sever()
        assert await controls.assert_severed(client, timeout=1)
        assert await controls.assert_severed(server, timeout=1)


async def test_reset_is_an_rst_both_ways() -> None:
    async with open_link() as (proxy, client, server):
        await client.send_all(b"x")
        await read_exactly(server, 1)
        assert await proxy.reset() == 1
        await controls.assert_reset(client, timeout=1)
        await controls.assert_reset(server, timeout=1)
        # New connections are fine: reset acts on the connections open when called.
        await controls.assert_accepting(proxy.address)


async def test_freeze_holds_bytes_and_fin_then_thaw_delivers_in_order(tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    async with accept_server() as (addr, accepted):
        async with open_proxy(addr, event_log=str(log)) as proxy:
            client = await trio.open_tcp_stream(*proxy.address)
            server = await accepted.receive()
            await client.send_all(b"hi")
            await read_exactly(server, 2)
            await proxy.freeze()
            # Writes are accepted both ways; reads hang; no EOF crosses.
            await client.send_all(b"client words")
            await server.send_all(b"last words")
            # Upstream: "more" written by the client never reaches the server...
            await controls.assert_frozen(client, server, window=0.3, payload=b"more")
            # Held bytes alone are not a held FIN: three polls passed and none was logged.
            assert not any(r["event"] == "held_fin" for r in read_jsonl(log).records)
            await server.send_eof()
            # ...and downstream: neither the last words nor the FIN reach the client.
            with trio.move_on_after(0.2):
                pytest.fail(f"client got {await _recv_outcome(client)} through a freeze")
            # The held FIN is seen by the proxy (kernel state) and logged, not forwarded.
            await wait_until(lambda: any(r["event"] == "held_fin" for r in read_jsonl(log).records))
            assert [c.state for c in proxy.connections()] == ["frozen"]
            await proxy.thaw()
            with trio.fail_after(5):
                assert await read_exactly(client, 10) == b"last words"
                assert await client.receive_some(10) == b""  # then the held FIN
                assert await read_exactly(server, 16) == b"client wordsmore"


async def test_freeze_one_stream_leaves_the_other_flowing() -> None:
    async with open_link() as (proxy, client, server):
        await proxy.freeze("upstream")
        await controls.assert_frozen(client, server, window=0.2)
        await server.send_all(b"downstream still flows")
        with trio.fail_after(5):
            assert await read_exactly(client, 22) == b"downstream still flows"
        await proxy.thaw("upstream")
        with trio.fail_after(5):
            assert await read_exactly(server, 22) == b"faultnet frozen probe\n"
        with pytest.raises(ValueError, match="stream was invalid: it must be one of"):
            await proxy.freeze("sideways")


async def test_freeze_acts_on_open_connections_unless_include_new() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        old = await trio.open_tcp_stream(*proxy.address)
        await old.send_all(b"a")
        await read_exactly(old, 1)
        await proxy.freeze()
        new = await trio.open_tcp_stream(*proxy.address)
        await new.send_all(b"fresh")
        with trio.fail_after(5):
            assert await read_exactly(new, 5) == b"fresh"  # new sockets are fine
        await controls.assert_frozen(old, old, window=0.2)
        await proxy.freeze(include_new=True)
        later = await trio.open_tcp_stream(*proxy.address)
        await controls.assert_frozen(later, later, window=0.2)
        await proxy.thaw()
        after = await trio.open_tcp_stream(*proxy.address)
        await after.send_all(b"ok")
        with trio.fail_after(5):
            assert await read_exactly(after, 2) == b"ok"


@pytest.mark.parametrize("mode", [m.name for m in MODES.values() if m.counts_connections])
async def test_a_fault_acts_on_a_connection_still_in_the_accept_queue(mode: str) -> None:
    """A client's connect() returns once the kernel has queued the connection; a fault
    called at once, before the accept loop's turn, acts on that connection too."""
    async with echo_server() as up, open_proxy(up) as proxy:
        # Blocking connect, no trio checkpoint after it: the accept loop cannot have run.
        client = socket.create_connection(proxy.address, timeout=5)
        try:
            assert proxy.connections() == []
            assert await proxy.apply(mode) == 1
            if mode == "freeze":
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(client))
                await controls.assert_frozen(stream, stream, window=0.2)
        finally:
            client.close()


async def test_freeze_race_no_byte_crosses_after_freeze_returns() -> None:
    """A client streams flat out; once freeze() returns, the server receives exactly what
    the proxy had forwarded by then (already in the kernel), never one byte more."""
    async with open_link() as (proxy, client, server):
        received = 0
        block = os.urandom(65536)

        async def blast() -> None:
            with trio.move_on_after(20):  # bounded: it blocks once buffers fill anyway
                while True:
                    await client.send_all(block)

        async def sink() -> None:
            nonlocal received
            while data := await server.receive_some(1 << 20):
                received += len(data)

        async with trio.open_nursery() as n:
            n.start_soon(blast)
            n.start_soon(sink)
            await wait_until(lambda: received > 8 * 1024 * 1024, 20)
            await proxy.freeze()
            crossed = proxy.connections()[0].bytes_upstream
            await wait_until(lambda: received >= crossed, 5)
            await trio.sleep(0.5)  # the scenario: watch the frozen link stay silent
            assert received == crossed
            assert proxy.connections()[0].bytes_upstream == crossed
            n.cancel_scope.cancel()


async def test_blackhole_times_out_a_keepalive_client_and_freeze_does_not() -> None:
    """Same window, same idle client with 1 s keepalive: ETIMEDOUT under blackhole only."""
    async with echo_server() as up, open_proxy(up) as proxy:
        clients = []
        for _ in range(2):
            c = await trio.open_tcp_stream(*proxy.address)
            await c.send_all(b"x")
            await read_exactly(c, 1)
            set_keepalive(c.socket, idle_s=1, interval_s=1, count=2)
            clients.append(c)
        frozen_client, blackholed_client = clients
        # Freeze the first connection only, then blackhole the second only.
        first, second = sorted(c.id for c in proxy.connections())
        assert await proxy.freeze(only=[first]) == 1
        assert await proxy.blackhole(only=[second]) == 1
        assert {c.id: c.state for c in proxy.connections()} == {
            first: "frozen",
            second: "blackholed",
        }
        outcomes: dict[str, str] = {}

        async def watch(name: str, stream: trio.SocketStream) -> None:
            with trio.move_on_after(6):
                outcomes[name] = await _recv_outcome(stream)
                return
            outcomes[name] = "nothing"

        async with trio.open_nursery() as n:
            n.start_soon(watch, "freeze", frozen_client)
            n.start_soon(watch, "blackhole", blackholed_client)
        assert outcomes == {"freeze": "nothing", "blackhole": "ETIMEDOUT"}


async def test_storm_of_client_resets_leaves_the_proxy_serving(tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:

        async def reset_client() -> None:
            s = await trio.open_tcp_stream(*proxy.address)
            await s.send_all(b"hello")
            await read_exactly(s, 5)  # proxied end to end
            await s.send_all(b"unread by anyone")  # in flight when the RST goes out
            s.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await s.aclose()

        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                for _ in range(200):
                    n.start_soon(reset_client)
            await wait_until(lambda: not proxy.connections(), 10)
        # Every one of the 200 connections ended and was logged once (read before the
        # control below makes a connection of its own).
        closes = [r for r in read_jsonl(log).records if r["event"] == "conn_close"]
        assert len(closes) == 200
        await controls.assert_accepting(proxy.address)


def _socket_and_pipe_fds() -> tuple[int, int]:
    sockets = pipes = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        sockets += target.startswith("socket:")
        pipes += target.startswith("pipe:")
    return sockets, pipes


async def test_descriptors_back_to_baseline_after_2000_connections() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        base_sockets, _ = _socket_and_pipe_fds()  # listeners only: no connection yet

        async def one() -> None:
            s = await trio.open_tcp_stream(*proxy.address)
            await s.send_all(b"ping")
            await read_exactly(s, 4)
            await s.aclose()

        with trio.fail_after(60):
            for _ in range(10):  # 10 waves of 200 concurrent connections
                async with trio.open_nursery() as n:
                    for _ in range(200):
                        n.start_soon(one)
            await wait_until(lambda: not proxy.connections(), 10)
            # The echo server's side closes asynchronously too: wait for sockets to settle.
            await wait_until(lambda: _socket_and_pipe_fds()[0] <= base_sockets, 10)
        sockets, pipes = _socket_and_pipe_fds()
        assert sockets == base_sockets
        assert pipes <= 2 * 64  # the splice pipe pool's cap, never one per connection


async def test_event_log_records_connections_and_faults(tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log), seed=7) as proxy:
        s = await trio.open_tcp_stream(*proxy.address)
        await s.send_all(b"12345")
        await read_exactly(s, 5)
        await proxy.freeze()
        await proxy.thaw()
        await s.aclose()
        await wait_until(lambda: not proxy.connections())
    events = read_jsonl(log).records
    kinds = [r["event"] for r in events]
    assert kinds[0] == "listening" and events[0]["seed"] == 7
    for kind in ("conn_open", "fault_applied", "fault_removed", "conn_close"):
        assert kind in kinds
    close = next(r for r in events if r["event"] == "conn_close")
    assert (close["bytes_upstream"], close["bytes_downstream"]) == (5, 5)
    assert all("wall" in r and "mono" in r for r in events)


async def test_toxic_added_live_moves_a_spliced_connection_to_the_copy_path() -> None:
    seen: list[bytes] = []

    class Spy(Toxic):
        type = "spy"

        async def on_chunk(self, ctx, data, t_read):
            seen.append(data)
            await ctx.forward(data, t_read)

    async with echo_server() as up, open_proxy(up) as proxy:
        s = await trio.open_tcp_stream(*proxy.address)
        await s.send_all(b"before")
        await read_exactly(s, 6)
        proxy.add_toxic(Spy("spy", "upstream"))
        await s.send_all(b"after")
        with trio.fail_after(5):
            assert await read_exactly(s, 5) == b"after"
        assert seen == [b"after"]
        proxy.remove_toxic("spy")
        await s.send_all(b"gone")
        with trio.fail_after(5):
            assert await read_exactly(s, 4) == b"gone"
        assert seen == [b"after"]


async def test_proxy_serve_in_a_nursery_reports_its_address() -> None:
    async with echo_server() as up, trio.open_nursery() as n:
        proxy = Proxy(up)
        address = await n.start(proxy.serve)
        assert address == proxy.address and address[1] != 0
        await proxy.aclose()


async def test_freeze_catches_a_connection_whose_upstream_connect_is_still_pending() -> None:
    """The client is accepted before the upstream answers; a freeze in that gap holds."""
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(8)
    attach_drop_all(upstream)  # the proxy's upstream connect hangs on SYN retries
    try:
        async with open_proxy(upstream.getsockname(), connect_timeout=10) as proxy:
            client = await trio.open_tcp_stream(*proxy.address)
            await wait_until(lambda: [c.state for c in proxy.connections()] == ["connecting"])
            assert await proxy.freeze() == 1
            detach_filter(upstream)  # the next SYN retry (~1 s) completes the connect
            upstream.setblocking(False)
            trio_up = trio.socket.from_stdlib_socket(upstream)
            with trio.fail_after(10):
                server_sock, _ = await trio_up.accept()
            server = trio.SocketStream(server_sock)
            await controls.assert_frozen(client, server, window=0.3)
            await proxy.thaw()
            with trio.fail_after(5):
                assert await read_exactly(server, 22) == b"faultnet frozen probe\n"
    finally:
        upstream.close()


async def test_ending_a_connection_at_every_step_of_its_setup(tmp_path) -> None:
    """sever/reset landing before the upstream connect, before the pumps first ran, or
    mid-forward: the connection ends cleanly and no connection error is ever logged."""
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        for i in range(60):
            s = await trio.open_tcp_stream(*proxy.address)
            for _ in range(i % 6):  # let setup advance a different number of steps
                await trio.lowlevel.checkpoint()
            await (proxy.sever() if i % 2 else proxy.reset())
            await s.aclose()
        await wait_until(lambda: not proxy.connections())
        await controls.assert_accepting(proxy.address)
    errors = [r for r in read_jsonl(log).records if r["event"] == "conn_error"]
    assert errors == []
