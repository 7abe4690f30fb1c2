"""What third-party clients, a chaos soak and hostile input broke in the proxy (issue 10),
each as a test that failed before its fix."""

from __future__ import annotations

import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import open_proxy
from faultnet.testing import echo_server
from faultnet.toxics import Latency


async def _churn(address: tuple[str, int], stop: trio.Event) -> int:
    # Open, use and close connections back to back: some are always ending.
    n = 0
    while not stop.is_set() and n < 3000:
        try:
            s = await trio.open_tcp_stream(*address)
            await s.send_all(b"x")
            await s.receive_some(1)
            await s.aclose()
        except (OSError, trio.BrokenResourceError):
            pass
        n += 1
    return n


async def test_toxics_added_and_removed_while_connections_close_are_atomic(tmp_path) -> None:
    """Issue 10 item 1: add_toxic raised 'Nursery is closed to new arrivals' on a
    connection whose pumps had ended, leaving the toxic listed but unlogged and the
    connections after it without it."""
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log)) as proxy:
        assert proxy.address is not None
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_churn, proxy.address, stop)
            with trio.fail_after(60):
                for i in range(300):
                    proxy.add_toxic(Latency(f"lat{i}", "downstream", latency=0))
                    # In force on every live connection that its toxicity picks (1.0).
                    for c in proxy._live():
                        assert f"lat{i}" in c.links, (i, c.id)
                    await trio.lowlevel.checkpoint()
                    proxy.update_toxic(f"lat{i}", {"latency": 1})
                    await trio.lowlevel.checkpoint()
                    proxy.remove_toxic(f"lat{i}")
                    await trio.lowlevel.checkpoint()
            stop.set()
        assert proxy.toxics == []
    records = read_jsonl(log).records
    for event in ("toxic_added", "toxic_updated", "toxic_removed"):
        assert sum(r["event"] == event for r in records) == 300, event
    assert not [r for r in records if r["event"] == "conn_error"]
