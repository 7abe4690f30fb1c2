"""The ``faultnet`` server and client commands: output, --json, exit codes, one-line errors.

Client commands run in a worker thread (``faultnet.cli.main``) against a server in the
test's trio loop; ``faultnet server`` itself and the unreachable-API case run as real
processes.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from faultnet.addresses import format_address, parse_address
from faultnet.cli import main
from faultnet.controls import assert_accepting, assert_refusing, assert_syn_dropped
from faultnet.eventlog import read_jsonl
from faultnet.server import RunningServer
from faultnet.testing import read_line, start_server, udp_echo_server
from faultnet.udp import udp_probe
from tests.faultnet.server.test_server import until_listed


class Cli:
    """Runs ``faultnet ARGS --api URL`` in a thread; returns (exit code, stdout, stderr)."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        argv = [*args, "--api", self.url]
        code = await trio.to_thread.run_sync(functools.partial(main, argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    async def ok(self, *args: str) -> str:
        code, out, err = await self(*args)
        assert code == 0, err
        return out

    async def json(self, *args: str) -> Any:
        return json.loads(await self.ok(*args, "--json"))


@pytest.fixture
def cli(faultnet_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(faultnet_server.url, capsys)


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> str:
    return format_address(await start_server(nursery))


async def test_client_commands(cli: Cli, upstream: str) -> None:
    assert (await cli.ok("proxies")).strip() == "no proxies"
    out = await cli.ok("create", "web", "--upstream", upstream)
    assert out.startswith("created web: 127.0.0.1:")
    p = (await cli.json("proxies"))["web"]
    where = parse_address(p["listen"])
    table = await cli.ok("proxies")
    assert table.splitlines()[0].split() == ["NAME", "LISTEN", "UPSTREAM", "ENABLED", "TOXICS"]
    assert table.splitlines()[1].split() == ["web", p["listen"], upstream, "true", "-"]

    t = await cli.json("toxic", "add", "web", "-t", "latency", "-a", "latency=50", "-a", "jitter=5")
    assert t["name"] == "latency_downstream" and t["attributes"] == {"latency": 50, "jitter": 5}
    out = await cli.ok("toxic", "add", "web", "-t", "bandwidth", "-s", "upstream", "-n", "bw")
    assert out.strip() == "added bw (bandwidth, upstream) to web"
    t = await cli.json("toxic", "update", "web", "bw", "-a", "rate=100", "--toxicity", "0.5")
    assert t["attributes"] == {"rate": 100} and t["toxicity"] == 0.5
    assert [x["name"] for x in await cli.json("toxic", "list", "web")] == [
        "bw",
        "latency_downstream",
    ]
    assert "removed bw from web" in await cli.ok("toxic", "remove", "web", "bw")
    # A text attribute stays the text typed, added or updated: SQLSTATE 40001, not 40001.
    args = ("-t", "postgres", "-n", "pg", "-a", "sqlstate=40001", "-a", "count=1")
    t = await cli.json("toxic", "add", "web", *args)
    assert (t["attributes"]["sqlstate"], t["attributes"]["count"]) == ("40001", 1)
    t = await cli.json("toxic", "update", "web", "pg", "-a", "sqlstate=40001", "-a", "count=2")
    assert (t["attributes"]["sqlstate"], t["attributes"]["count"]) == ("40001", 2)
    assert "removed pg from web" in await cli.ok("toxic", "remove", "web", "pg")

    stream = await trio.open_tcp_stream(*where)
    await stream.send_all(b"x")
    with trio.fail_after(5):
        await stream.receive_some()
    r = await cli.json("fault", "web", "freeze", "--stream", "upstream")
    assert r["connections"] == 1 and r["state"]["connections"] == {"frozen-upstream": 1}
    assert (await cli.ok("fault", "web", "thaw")).strip() == "web: thaw on 1 connection(s)"
    conns = await cli.json("connections", "web")
    assert [(c["bytes_upstream"], c["state"]) for c in conns] == [(1, "open")]
    assert "up=1" in await cli.ok("connections", "web")
    [only] = conns  # a page: --limit and --after reach the listing's query
    assert [c["id"] for c in await cli.json("connections", "web", "--limit", "1")] == [only["id"]]
    assert await cli.json("connections", "web", "--after", str(only["id"])) == []
    await cli.ok("fault", "web", "drop-syn")
    await assert_syn_dropped(where, timeout=0.3)
    await cli.ok("fault", "web", "restore")
    await assert_accepting(where)
    async with httpx.AsyncClient(base_url=cli.url) as api:
        await until_listed(api, "web", 1)  # the probe's connection gone: stream alone
    r = await cli.json("fault", "web", "loss", "--percent", "100", "--peer", "127.0.0.1")
    assert (r["connections"], r["percent"], r["peer"]) == (1, 100, "127.0.0.1")
    assert "loss={'upstream': 100.0, 'downstream': 100.0}" in await cli.ok("connections", "web")
    await cli.ok("fault", "web", "thaw")
    await cli.ok("fault", "web", "syn-loss", "--percent", "100")
    await assert_syn_dropped(where, timeout=0.3)
    await cli.ok("fault", "web", "restore")
    out = await cli.ok("fault", "web", "partition", "--peer", "127.0.0.2")
    assert out.strip() == "web: partition on 0 connection(s)"
    assert (await cli.json("proxies"))["web"]["enabled"]
    await cli.ok("fault", "web", "thaw")
    await cli.ok("fault", "web", "sever")
    await stream.aclose()

    assert (await cli.ok("disable", "web")).startswith("disabled web")
    await assert_refusing(where)
    assert (await cli.ok("enable", "web")).startswith("enabled web")
    await assert_accepting(where)
    events = await cli.json("events", "web", "--limit", "5")
    assert [e["event"] for e in events["events"]][:2] == ["listening", "toxic_added"]
    text = await cli.ok("events")
    assert '"event": "server_seed"' in text and "could not be written" not in text
    assert "every toxic removed" in await cli.ok("reset")
    assert (await cli.json("proxies"))["web"]["toxics"] == []
    assert (await cli.ok("delete", "web")).strip() == "deleted web"
    await assert_refusing(where)


async def test_a_udp_proxy_from_the_command_line(cli: Cli) -> None:
    async with udp_echo_server() as (up, _):
        out = await cli.ok("create", "dns", "--protocol", "udp", "--upstream", f"{up[0]}:{up[1]}")
        assert out.startswith("created dns: 127.0.0.1:")
        listen = parse_address((await cli.json("proxies"))["dns"]["listen"])
        assert (await cli.json("proxies"))["dns"]["protocol"] == "udp"
        r = await cli.json("fault", "dns", "latency", "--latency-ms", "40", "--stream", "upstream")
        assert r["latency_ms"] == 40 and r["state"]["impairments"]["upstream"]["latency_ms"] == 40
        assert (await udp_probe(listen, 2.0)).elapsed_s >= 0.04
        await cli.ok("fault", "dns", "size-limit", "--limit", "8")
        assert len((await udp_probe(listen, 2.0)).reply) == 8
        await cli.ok("fault", "dns", "clear")
        assert (await udp_probe(listen, 2.0)).echoed
        code, _, err = await cli("fault", "dns", "drop-syn")
        assert code == 2 and "invalid fault mode for a UDP proxy" in err


async def test_client_errors_and_exit_codes(cli: Cli, upstream: str) -> None:
    code, out, err = await cli("delete", "ghost")
    assert (code, out) == (2, "")
    assert err == "faultnet: error: proxy not found (HTTP 404)\n"
    code, out, err = await cli("toxic", "remove", "ghost", "t", "--json")
    assert code == 2 and json.loads(out) == {"error": "proxy not found", "status": 404}
    await cli.ok("create", "p", "--upstream", upstream)
    code, _, err = await cli("create", "p", "--upstream", upstream)
    assert (code, err) == (2, "faultnet: error: proxy already exists (HTTP 409)\n")
    code, _, err = await cli("toxic", "add", "p", "-t", "latency", "-a", "latency=soon")
    assert code == 2 and "must be an integer" in err and len(err.splitlines()) == 1
    code, _, err = await cli("toxic", "add", "p", "-t", "latency", "-a", "latency")
    assert code == 2 and "is not KEY=VALUE" in err
    code, _, err = await cli("toxic", "add", "p", "-t", "nope")
    assert (code, err) == (2, "faultnet: error: invalid toxic type (HTTP 400)\n")
    # A listen address in use is an environment error: exit 2, with its message.
    with trio.socket.socket() as taken:
        await taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, _, err = await cli(
            "create", "q", "--upstream", upstream, "--listen", f"127.0.0.1:{port}"
        )
    assert code == 2  # an environment error (issue 10 item 13: it was 1)
    assert err == (
        f"faultnet: error: listen address 127.0.0.1:{port} is already in use (HTTP 500)\n"
    )


# -- real processes ---------------------------------------------------------------------


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultnet", *args], capture_output=True, text=True, timeout=timeout
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_api_is_one_line_exit_2() -> None:
    r = _run("proxies", "--api", f"http://127.0.0.1:{_free_port()}")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("faultnet: error: cannot reach the API at http://127.0.0.1:")
    assert len(r.stderr.splitlines()) == 1 and "Connection refused" in r.stderr


def test_server_process_config_seed_event_log_and_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "db", "upstream": "127.0.0.1:5432"}]))
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--seed", "42"]
        + ["--config", str(config), "--event-log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = read_line(proc.stdout, 20)
        assert "(seed 42, 1 proxies," in line
        url = line.split(" listening on ")[1].split()[0]
        r = _run("proxies", "--json", "--api", url)
        assert r.returncode == 0 and json.loads(r.stdout)["db"]["enabled"] is True
        proc.send_signal(signal.SIGTERM)  # the exact process started above
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    records = read_jsonl(log).records
    assert {"event": "server_seed", "seed": 42}.items() <= records[0].items()
    kinds = [(r.get("proxy"), r["event"]) for r in records]
    assert ("db", "listening") in kinds and ("db", "stopped") in kinds
    assert (None, "server_stop") in kinds


def test_server_startup_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    r = _run("server", "--port", "0", "--config", str(bad))
    assert r.returncode == 2 and r.stderr.startswith(f"faultnet: error: cannot read config {bad}")
    assert len(r.stderr.splitlines()) == 1
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps([{"name": "x"}]))
    r = _run("server", "--port", "0", "--config", str(missing))
    assert (r.returncode, r.stderr) == (
        2,
        f"faultnet: error: config {missing}: missing required field: upstream at proxy 1\n",
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = _run("server", "--port", str(port))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith(f"faultnet: error: cannot serve the API on 127.0.0.1:{port}: ")
    assert "in use" in r.stderr
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    r = _run("server", "--port", "0", "--event-log", str(not_a_dir / "events.jsonl"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith(f"faultnet: error: cannot open the event log {not_a_dir}/")


# -- front doors: one line and the right exit code (issue 10 items 12, 13, 14) -----------


def _one_line_exit_2(r: subprocess.CompletedProcess[str], says: str) -> None:
    assert r.returncode == 2, r
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_ports_and_api_urls_are_one_line_and_exit_2() -> None:
    _one_line_exit_2(_run("server", "--port", "99999"), "--port must be 0 to 65535, not 99999")
    _one_line_exit_2(_run("server", "--port", "-5"), "--port must be 0 to 65535, not -5")
    _one_line_exit_2(_run("proxies", "--api", "notaurl"), "must be http://HOST:PORT")
    _one_line_exit_2(_run("proxies", "--api", "ftp://127.0.0.1:1"), "must be http://HOST:PORT")


def test_server_beyond_loopback_takes_expose_warns_and_can_require_a_token(
    tmp_path: Path,
) -> None:
    _one_line_exit_2(_run("server", "--host", "0.0.0.0", "--port", "0"), "--expose")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--host", "0.0.0.0", "--port", str(port)]
        + ["--expose", "--token", "s3cret"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in read_line(proc.stdout, 20)
        assert proc.stderr is not None
        warning = read_line(proc.stderr, 5)
        assert warning.startswith("faultnet: warning:") and "beyond loopback" in warning
        api = f"http://127.0.0.1:{port}"
        r = _run("proxies", "--api", api)
        assert r.returncode == 2 and "missing or wrong token (HTTP 401)" in r.stderr
        r = _run("proxies", "--api", api, "--token", "s3cret")
        assert r.returncode == 0 and r.stdout.strip() == "no proxies"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


async def test_a_proxy_asked_for_every_interface_listens_on_loopback(
    cli: Cli, upstream: str
) -> None:
    from faultnet.server import open_server

    async with open_server() as server:  # the default, as `faultnet server` runs it
        cli.url = server.url
        p = await cli.json("create", "web", "--upstream", upstream, "--listen", "0.0.0.0:0")
        host, port = parse_address(p["listen"])
        assert host == "127.0.0.1" and port != 0  # the real address, not 0.0.0.0
        code, _, err = await cli("create", "far", "--upstream", upstream, "--listen", "10.1.2.3:0")
        assert code == 2 and "--proxies-beyond-loopback" in err
    async with open_server(beyond_loopback=True) as server:
        cli.url = server.url
        p = await cli.json("create", "web", "--upstream", upstream, "--listen", "0.0.0.0:0")
        assert parse_address(p["listen"])[0] == "0.0.0.0"


async def test_a_fault_on_a_connection_that_does_not_exist_is_not_a_success(
    cli: Cli, upstream: str
) -> None:
    await cli.ok("create", "web", "--upstream", upstream)
    code, _, err = await cli("fault", "web", "freeze", "--connection", "999")
    assert code == 2 and "connection not found: 999" in err


def test_server_detach_returns_once_listening_and_passes_a_startup_error_on() -> None:
    r = _run("server", "--detach", "--port", "0")
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.rsplit("left running as pid ", 1)[1].split()[0])
    try:
        url = r.stdout.split(" listening on ")[1].split()[0]
        assert _run("proxies", "--api", url).stdout.strip() == "no proxies"
        port = url.rpartition(":")[2]
        taken = _run("server", "--detach", "--port", port)
        assert taken.returncode == 2 and len(taken.stderr.splitlines()) == 1, taken
        assert taken.stderr.startswith(f"faultnet: error: cannot serve the API on 127.0.0.1:{port}")
    finally:
        os.kill(pid, signal.SIGTERM)  # the server this test detached, by its PID
