"""UDP proxies on the faultnet server: created with ``"protocol": "udp"``, faulted by the
UDP mode table, listed, reset; TCP stays the default and Toxiproxy's shape unchanged."""

from __future__ import annotations

import pytest

from faultnet.server import ApiError, open_registry
from faultnet.testing import udp_echo_server
from faultnet.udp import UdpProbeKind, udp_probe
from faultnet.udp.modes import UDP_MODES, udp_markdown_table
from faultnet.udp.proxy import UdpProxy
from tests import REPO


async def test_a_udp_proxy_is_created_faulted_listed_and_reset() -> None:
    async with udp_echo_server() as (up, _), open_registry() as reg:
        mp = await reg.create({"name": "dns", "upstream": f"{up[0]}:{up[1]}", "protocol": "udp"})
        assert mp.to_json()["protocol"] == "udp" and isinstance(mp.proxy, UdpProxy)
        addr = mp.proxy.address
        assert (await udp_probe(addr, 1.0)).echoed
        r = await reg.apply_fault("dns", {"mode": "blackhole", "stream": "downstream"})
        assert r["state"]["gates"] == {"upstream": "open", "downstream": "blackholed"}
        assert (await udp_probe(addr, 0.2)).kind is UdpProbeKind.SILENT
        assert reg.fault_state("dns")["connections"] == {"blackholed-downstream": 2}
        await reg.apply_fault("dns", {"mode": "thaw"})
        r = await reg.apply_fault("dns", {"mode": "latency", "latency_ms": 50, "jitter_ms": 5})
        assert r["latency_ms"] == 50
        assert (await udp_probe(addr, 2.0)).elapsed_s >= 0.09
        await reg.reset()
        assert reg.fault_state("dns")["impairments"]["upstream"]["latency_ms"] == 0
        assert [s.to_json()["peer"] for s in mp.proxy.connections()]
        # TCP is the default and keeps Toxiproxy's shape (no protocol field).
        tcp = await reg.create({"name": "web", "upstream": "127.0.0.1:9"})
        assert "protocol" not in tcp.to_json()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"mode": "drop_syn"}, "invalid fault mode for a UDP proxy"),
        ({"mode": "loss"}, "loss needs percent"),
        ({"mode": "loss", "percent": 150}, "percentage 0-100"),
        ({"mode": "loss", "percent": 5, "peer": "127.0.0.1"}, "takes no 'peer'"),
        ({"mode": "size_limit", "limit": 10, "action": "squash"}, "truncate, drop"),
        ({"mode": "freeze", "stream": "sideways"}, "stream must be one of"),
        ({"mode": "size_limit", "limit": 9.5}, "whole number of bytes"),
    ],
)
async def test_udp_fault_errors_are_400s_saying_why(body, message) -> None:
    async with udp_echo_server() as (up, _), open_registry() as reg:
        await reg.create({"name": "u", "upstream": f"{up[0]}:{up[1]}", "protocol": "udp"})
        with pytest.raises(ApiError, match=message) as info:
            await reg.apply_fault("u", body)
        assert info.value.status == 400


async def test_udp_proxies_take_no_toxics_and_a_protocol_is_checked() -> None:
    async with open_registry() as reg:
        with pytest.raises(ApiError, match="protocol must be tcp or udp"):
            await reg.create({"name": "x", "upstream": "127.0.0.1:9", "protocol": "sctp"})
        await reg.create({"name": "u", "upstream": "127.0.0.1:9", "protocol": "udp"})
        with pytest.raises(ApiError, match="toxics are for TCP proxies"):
            await reg.add_toxic("u", {"type": "latency", "attributes": {"latency": 5}})
        with pytest.raises(ApiError, match="protocol cannot change"):
            await reg.update("u", {"protocol": "tcp"})


def test_every_udp_mode_is_a_proxy_method_taking_what_its_row_says() -> None:
    import inspect

    for m in UDP_MODES.values():
        params = inspect.signature(getattr(UdpProxy, m.name)).parameters
        assert "stream" in params, m.name
        assert set(m.params) <= set(params), m.name
        assert set(m.required) <= set(m.params), m.name
        if m.undone_by is not None:
            assert UDP_MODES[m.undone_by].undone_by is None


def test_readme_udp_table_is_the_table() -> None:
    assert udp_markdown_table() in (REPO / "README.md").read_text(), (
        "README's UDP table is stale: paste faultnet.udp.modes.udp_markdown_table()"
    )


@pytest.mark.parametrize(
    # The impairments' rows (dns's rule checks itself: tests/faultnet/udp/test_udp_dns_faults.py).
    "row",
    [m for m in UDP_MODES.values() if m.params and m.name != "dns"],
    ids=lambda m: m.name,
)
def test_the_table_refuses_what_the_impairment_refuses_saying_the_same(row) -> None:
    # The table checks a request before the proxy is called (so that what the call
    # raises is a bug, never the client's); the impairment checks again for a direct
    # UdpProxy.impair. Two declarations of one range: they must agree, value by value.
    from faultnet.modes import ModeArgumentError
    from faultnet.udp.impairments import Impairment
    from faultnet.udp.modes import UDP

    good = {"percent": 5, "latency_ms": 5, "limit": 8}
    values = [-1, 0, 5.5, 100, 101, float("nan"), "x", True, 9.5, 8, "drop", "squash"]
    for arg in row.arguments:
        if arg.name == "stream":
            continue
        for value in values:
            try:
                Impairment().with_(**{arg.label or arg.name: value})
                impairment = None
            except ValueError as exc:
                impairment = str(exc)
            try:
                UDP.check(row, {**{r: good[r] for r in row.required}, arg.name: value})
                table = None
            except ModeArgumentError as exc:
                table = str(exc)
            assert table == impairment, (row.name, arg.name, value)


async def test_a_udp_fault_answer_reads_no_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, item 2, for UDP proxies: the counts in a fault answer come from the
    proxy's gates, which every session shares, not from each session's info (counted by
    wrapping the real :meth:`Session.info`); they agree with a recount through modes."""
    from collections import Counter

    from faultnet.udp.proxy import Session

    reads: list[int] = []
    info = Session.info

    def counted(self: Session) -> object:
        reads.append(self.id)
        return info(self)

    monkeypatch.setattr(Session, "info", counted)
    async with udp_echo_server() as (up, _), open_registry() as reg:
        mp = await reg.create({"name": "u", "upstream": f"{up[0]}:{up[1]}", "protocol": "udp"})
        assert isinstance(mp.proxy, UdpProxy)
        assert reg.fault_state("u")["connections"] == {}
        for _ in range(3):  # each probe is a socket of its own: a session each
            assert (await udp_probe(mp.proxy.address, 1.0)).echoed
        for body in (
            {"mode": "freeze", "stream": "upstream"},
            {"mode": "blackhole"},
            {"mode": "thaw", "stream": "downstream"},
            {"mode": "thaw"},
        ):
            del reads[:]
            answer = await reg.apply_fault("u", body)
            counts = reg.fault_state("u")["connections"]
            assert reads == [] and answer["state"]["connections"] == counts, body
            recount = Counter(s.state for s in mp.proxy.connections())
            assert counts == dict(recount) and sum(counts.values()) == 3, body
            assert reads  # the instrument sees the listing's reads
