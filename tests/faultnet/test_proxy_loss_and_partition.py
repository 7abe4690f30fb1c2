"""Real packet loss, lossy handshakes, per-peer faults and partitions, over real loopback
sockets: bytes intact under loss, what was dropped reported, every mode live and undone,
and one client cut off while another keeps working."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
import trio

from faultnet import bpf
from faultnet.addresses import AddressError, parse_peer, peer_matches
from faultnet.eventlog import read_jsonl
from faultnet.probe import ProbeKind, probe
from faultnet.proxy import open_proxy
from faultnet.sockopts import detach_filter
from faultnet.testing import echo_back, echo_server, read_exactly, wait_for_record, wait_until

#: Every test here runs on every data plane built here (tests/faultnet/conftest.py).
pytestmark = pytest.mark.usefixtures("each_plane")

OTHER = "127.0.0.2"  # a second client host: all of 127.0.0.0/8 is loopback on Linux


async def connect_from(address: tuple[str, int], source: str = "127.0.0.1") -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.bind((source, 0))
    await sock.connect(address)
    return trio.SocketStream(sock)


async def echoes(stream: trio.SocketStream, payload: bytes = b"ping", timeout: float = 2.0) -> bool:
    with trio.move_on_after(timeout):
        await stream.send_all(payload)
        return await read_exactly(stream, len(payload)) == payload
    return False


async def test_64_mib_each_way_arrive_intact_under_loss_and_the_drops_are_reported(
    tmp_path,
) -> None:
    log = tmp_path / "events.jsonl"
    data = os.urandom(64 << 20)
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        assert await proxy.loss(5) == 1
        with trio.fail_after(100):
            got = await echo_back(stream, data)
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        info = proxy.connections()[0]
        # Both directions lost segments, and both peers' TCPs made up for them.
        assert info.dropped_upstream > 0 and info.dropped_downstream > 0, info
        assert info.loss == {"upstream": 5.0, "downstream": 5.0}
        await stream.aclose()
        closed = await wait_for_record(log, event="conn_close", conn=1)
    assert closed["dropped_upstream"] >= info.dropped_upstream
    assert closed["dropped_downstream"] >= info.dropped_downstream
    applied = [r for r in read_jsonl(log).records if r.get("mode") == "loss"]
    assert applied[0]["percent"] == 5 and applied[0]["connections"] == [1]


async def test_loss_is_live_per_stream_and_thaw_ends_it() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        stream = await trio.open_tcp_stream(*proxy.address)
        assert await echoes(stream)
        # Every segment from the client dropped: its bytes never arrive (it retransmits).
        await proxy.loss(100, "upstream")
        await stream.send_all(b"held back")
        with trio.move_on_after(0.3):
            await stream.receive_some(64)
            pytest.fail("a byte crossed 100 % upstream loss")
        assert proxy.connections()[0].loss == {"upstream": 100.0}
        await proxy.thaw("upstream")
        # The client's next retransmission gets through: in order, intact.
        with trio.fail_after(10):
            assert await read_exactly(stream, 9) == b"held back"
        assert proxy.connections()[0].loss is None
        assert proxy.connections()[0].dropped_upstream > 0


async def test_loss_selects_connections_by_id_and_by_peer() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        mine = await connect_from(proxy.address)
        other = await connect_from(proxy.address, OTHER)
        third = await connect_from(proxy.address, OTHER)
        await wait_until(lambda: len(proxy.connections()) == 3)
        assert await proxy.loss(100, peer=OTHER) == 2
        port = third.socket.getsockname()[1]
        assert await proxy.thaw(peer=f"{OTHER}:{port}") == 1
        by_peer = {c.peer: c.loss for c in proxy.connections()}
        assert by_peer[f"{OTHER}:{other.socket.getsockname()[1]}"] == {
            "upstream": 100.0,
            "downstream": 100.0,
        }
        assert by_peer[f"{OTHER}:{port}"] is None
        assert await echoes(mine) and await echoes(third)
        assert await proxy.loss(50, only=[1]) == 1
        with pytest.raises(AddressError, match="must be an IP address"):
            await proxy.loss(10, peer="localhost")
        with pytest.raises(ValueError, match="between 0 and 100"):
            await proxy.loss(150)


async def test_sever_and_freeze_select_by_peer() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        mine = await connect_from(proxy.address)
        other = await connect_from(proxy.address, OTHER)
        await wait_until(lambda: len(proxy.connections()) == 2)
        assert await proxy.freeze(peer=OTHER) == 1
        assert await echoes(mine) and not await echoes(other, b"x", timeout=0.3)
        assert await proxy.sever(peer=OTHER) == 1
        with trio.fail_after(2):
            assert await other.receive_some(64) == b""
        assert await echoes(mine)


async def test_syn_loss_drops_that_share_of_syns_until_restore() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        await proxy.syn_loss(100)
        assert proxy.state["syn_loss"] == 100
        assert (await probe(proxy.address, 0.3)).kind is ProbeKind.HUNG
        await proxy.syn_loss(0)
        assert (await probe(proxy.address, 0.5)).kind is ProbeKind.CONNECTED
        await proxy.syn_loss(100)
        await proxy.restore()
        assert proxy.state["syn_loss"] == 0
        assert (await probe(proxy.address, 0.5)).kind is ProbeKind.CONNECTED


async def test_a_partitioned_peer_is_cut_off_while_another_keeps_working() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        mine = await connect_from(proxy.address)
        other = await connect_from(proxy.address, OTHER)
        assert await echoes(mine) and await echoes(other)  # both fully connected
        assert await proxy.partition(peer=OTHER) == 1
        assert proxy.state["partitioned"] == [OTHER]
        states = {c.peer.split(":")[0]: c.state for c in proxy.connections()}
        assert states == {"127.0.0.1": "open", OTHER: "blackholed"}
        assert (await probe(proxy.address, 0.3, source=OTHER)).kind is ProbeKind.HUNG
        assert (await probe(proxy.address, 0.5)).kind is ProbeKind.CONNECTED
        assert await echoes(mine)
        await other.send_all(b"during")
        # Healed: new connects from the peer work, and its open link delivers what waited.
        await proxy.thaw(peer=OTHER)
        assert proxy.state["partitioned"] == []
        assert (await probe(proxy.address, 1.0, source=OTHER)).kind is ProbeKind.CONNECTED
        with trio.fail_after(10):
            assert await read_exactly(other, 6) == b"during"


async def test_a_partition_of_everyone_stops_every_connect_until_thaw() -> None:
    async with echo_server() as up, open_proxy(up) as proxy:
        mine = await connect_from(proxy.address)
        await wait_until(lambda: len(proxy.connections()) == 1)
        assert await proxy.partition() == 1
        assert proxy.state["partitioned"] == ["*"]
        for source in ("127.0.0.1", OTHER):
            assert (await probe(proxy.address, 0.3, source=source)).kind is ProbeKind.HUNG
        # restore ends listener faults, not a partition.
        await proxy.restore()
        assert (await probe(proxy.address, 0.3)).kind is ProbeKind.HUNG
        await proxy.thaw()
        assert (await probe(proxy.address, 1.0)).kind is ProbeKind.CONNECTED
        assert await echoes(mine, timeout=10)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.2", ("127.0.0.2", None)),
        ("127.0.0.2:4000", ("127.0.0.2", 4000)),
        ("::1", ("::1", None)),
        ("[::1]", ("::1", None)),
        ("[::1]:4000", ("::1", 4000)),
    ],
)
def test_parse_peer(text: str, parsed: tuple[str, int | None]) -> None:
    assert parse_peer(text) == parsed


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is not HOST"),
        ("localhost", "IP address"),
        ("1.2.3.4:0", "out of range"),
        ("x:y", "not a number"),
    ],
)
def test_parse_peer_says_why_not(text: str, why: str) -> None:
    with pytest.raises(AddressError, match=why):
        parse_peer(text)


def test_peer_matches_by_host_and_optionally_port() -> None:
    assert peer_matches(("127.0.0.2", None), ("127.0.0.2", 5))
    assert peer_matches(("127.0.0.2", 5), ("127.0.0.2", 5))
    assert not peer_matches(("127.0.0.2", 6), ("127.0.0.2", 5))
    assert not peer_matches(("127.0.0.2", None), ("127.0.0.1", 5))


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
async def test_listener_program_drops_syns_from_the_peers_it_names(family) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(16)
    address = listener.getsockname()[:2]
    try:
        named = socket.socket(family, socket.SOCK_STREAM)
        named.bind((host, 0))
        port = named.getsockname()[1]
        named.close()  # its port is named below; a fresh probe from it must hang
        bpf.attach(listener, bpf.listener_program(peers=[(host, port)]))
        assert (await probe(address, 0.5)).kind is ProbeKind.CONNECTED  # another port
        bpf.attach(listener, bpf.listener_program(peers=[(host, None)]))
        assert (await probe(address, 0.3)).kind is ProbeKind.HUNG
        detach_filter(listener)
        assert (await probe(address, 0.5)).kind is ProbeKind.CONNECTED
    finally:
        listener.close()


def test_programs_refuse_a_bad_fraction_and_say_what_they_drop() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        bpf.drop_fraction(1.5)
    assert bpf.listener_program() is None
    assert bpf.listener_program(syn_loss=0.25).what == "25 % of SYNs"
    both = bpf.listener_program(syn_loss=0.5, peers=[("127.0.0.2", 80)])
    assert both.what == "SYNs from 127.0.0.2:80 and 50 % of SYNs"
    assert bpf.listener_program(drop_everything=True, syn_loss=0.5).what == "every segment"
