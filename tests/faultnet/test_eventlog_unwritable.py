"""An event log that cannot be written never takes a proxy or the server down (issue 10
item 4).

Two real mechanisms, no mocks: ``/dev/full`` (every write fails with ENOSPC, the disk
full case) for a proxy in this process, and ``RLIMIT_FSIZE`` set in a real ``faultnet
server`` process (writes past the limit fail with EFBIG, "File too large", and the one
that crosses it is cut short: Python ignores SIGXFSZ, so the process is not killed).
"""

from __future__ import annotations

import resource
import subprocess
import sys

import httpx
import trio

from faultnet import controls
from faultnet._version import __version__
from faultnet.eventlog import read_jsonl
from faultnet.proxy import open_proxy
from faultnet.server import open_server
from faultnet.server.openapi import openapi_document
from faultnet.testing import echo_server, read_exactly

FSIZE_LIMIT = 4096  # bytes: the listening record fits, a dozen connections' records do not


async def _echo_once(addr: tuple[str, int], payload: bytes = b"ping pong") -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(*addr)
        async with stream:
            await stream.send_all(payload)
            assert await read_exactly(stream, len(payload)) == payload


async def test_a_proxy_logging_to_a_full_disk_keeps_forwarding_and_faulting() -> None:
    async with echo_server() as up, open_proxy(up, event_log="/dev/full") as proxy:
        for _ in range(3):
            await _echo_once(proxy.address)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*proxy.address)
            async with stream:
                await proxy.freeze()
                await controls.assert_frozen(stream, stream)  # the echo never comes back
                await proxy.thaw()
                assert await read_exactly(stream, 22) == b"faultnet frozen probe\n"
        await _echo_once(proxy.address)
        assert proxy.log.dropped > 5 and "No space left" in (proxy.log.last_error or "")


def _assert_events_shape(body: dict) -> None:
    """*body* is what the OpenAPI document says ``GET /events`` answers."""
    schema = openapi_document(__version__)["components"]["schemas"]["Events"]
    assert set(schema["required"]) <= set(body) <= set(schema["properties"]), body


async def test_the_events_api_counts_what_a_full_disk_dropped(tmp_path) -> None:
    async with (
        echo_server() as up,
        open_server(event_log="/dev/full") as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as api,
    ):
        body = {"name": "db", "listen": "127.0.0.1:0", "upstream": f"{up[0]}:{up[1]}"}
        assert (await api.post("/proxies", json=body)).status_code == 201
        everything = (await api.get("/events")).json()
        mine = (await api.get("/proxies/db/events")).json()
    _assert_events_shape(everything)
    _assert_events_shape(mine)
    # Every record so far was refused by the file, and is still served from memory.
    kinds = [e["event"] for e in everything["events"]]
    assert "server_seed" in kinds and "proxy_created" in kinds
    assert everything["dropped"] == len(kinds) and mine["dropped"] >= len(kinds)
    assert "No space left" in everything["last_error"] and "No space left" in mine["last_error"]
    # The control: a log that takes every record reports none dropped and no error.
    async with open_server(event_log=str(tmp_path / "ok.jsonl")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
            fine = (await api.get("/events")).json()
    _assert_events_shape(fine)
    assert fine["events"] and fine["dropped"] == 0 and "last_error" not in fine


def _limit_file_size() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


async def _read_until(stream: trio.abc.ReceiveStream, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end) and (chunk := await stream.receive_some(4096)):
        data += chunk
    return data


async def test_the_server_survives_its_event_log_hitting_the_file_size_limit(tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--event-log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_limit_file_size,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        with trio.fail_after(20):
            line = (await _read_until(proc.stdout, b"\n")).decode()
        url = line.split(" listening on ")[1].split()[0]
        async with echo_server() as up, httpx.AsyncClient(base_url=url, timeout=10) as api:
            body = {"name": "db", "listen": "127.0.0.1:0", "upstream": f"{up[0]}:{up[1]}"}
            r = await api.post("/proxies", json=body)
            assert r.status_code == 201, r.text
            host, _, port = r.json()["listen"].rpartition(":")
            addr = (host, int(port))
            for _ in range(30):  # well past the limit: each connection logs two records
                await _echo_once(addr)
            r = await api.post("/proxies/db/faults", json={"mode": "refuse"})
            assert r.status_code == 200, r.text
            await controls.assert_refusing(addr)
            r = await api.delete("/proxies/db/faults")
            assert r.status_code == 204, r.text
            await _echo_once(addr)
            assert (await api.get("/proxies")).status_code == 200
            events = (await api.get("/events")).json()
            assert events["dropped"] > 20 and "File too large" in events["last_error"]
            text = await trio.run_process(
                [sys.executable, "-m", "faultnet", "events", "--api", url, "--limit", "1"],
                capture_stdout=True,
            )
            last = text.stdout.decode().splitlines()[-1]
            assert last.startswith(f"event log {log}: ") and "could not be written" in last
            assert "File too large" in last
            assert proc.poll() is None  # still serving
    finally:
        proc.terminate()  # the exact process started above
        with trio.fail_after(10):
            err = (await _read_until(proc.stderr, b"\0")).decode()  # to EOF
            await proc.wait()
    assert proc.returncode == 0, err
    assert err.count("faultnet: warning: cannot write event log") == 1, err
    # The record that crossed the limit was cut short ("short write"), unless the one
    # before it ended exactly at the limit: then it was refused whole with EFBIG (once
    # in a whole-suite run; which record lands where depends on ports and timestamps).
    assert "short write" in err or "[Errno 27] File too large" in err, err
    assert "Traceback" not in err
    assert log.stat().st_size == FSIZE_LIMIT
    read = read_jsonl(log)  # readable: the record cut at the limit is the truncated tail
    assert read.records[0]["event"] == "server_seed"
