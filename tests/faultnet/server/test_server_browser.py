"""The API refuses what only a web page sends, whatever User-Agent it claims: a Host
that is not this server's (DNS rebinding: ``Host: evil.example`` got 201 before) and a
cross-origin Origin; a token can be kept out of ``ps`` and cannot be empty."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from faultnet.server import RunningServer, open_server
from faultnet.testing import read_line
from tests.faultnet.server.test_server_cli import _free_port, _run

BODY = {"name": "db", "upstream": "127.0.0.1:5432"}


def _refused(r: httpx.Response, says: str) -> None:
    assert r.status_code == 403, r.text
    assert r.json()["status"] == 403 and says in r.json()["error"], r.text


async def test_a_foreign_host_or_a_cross_origin_origin_is_refused_with_403(
    faultnet_server: RunningServer,
) -> None:
    url = faultnet_server.url
    port = url.rpartition(":")[2]
    async with httpx.AsyncClient(base_url=url) as api:
        agent = {"User-Agent": "curl/8"}
        r = await api.post("/proxies", json=BODY, headers={**agent, "Host": "evil.example"})
        _refused(r, "Host 'evil.example' is not this server's address nor a loopback name")
        r = await api.post(
            "/proxies", json=BODY, headers={**agent, "Origin": "http://evil.example"}
        )
        _refused(r, "cross-origin request refused: Origin 'http://evil.example'")
        r = await api.get("/proxies", headers={"Host": f"evil.example:{port}"})
        _refused(r, "DNS rebinding")
        r = await api.get("/proxies", headers={"Origin": "null"})
        _refused(r, "cross-origin")
        assert faultnet_server.registry.proxies == {}  # nothing refused took effect
        # This server's own names and origin, and loopback's, are answered.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
            r = await api.get("/proxies", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        own = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}
        assert (await api.get("/proxies", headers=own)).status_code == 200
        # The OpenAPI document stays readable, as for a browser's agent.
        r = await api.get("/openapi.json", headers={"Host": "evil.example"})
        assert r.status_code == 200


async def test_a_host_the_server_was_told_to_answer_to_is_answered() -> None:
    async with (
        open_server(allow_hosts=["ci-box.internal"]) as server,
        httpx.AsyncClient(base_url=server.url) as api,
    ):
        r = await api.get("/proxies", headers={"Host": "ci-box.internal:8474"})
        assert r.status_code == 200, r.text
        _refused(await api.get("/proxies", headers={"Host": "other.internal"}), "--allow-host")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["server", "--token", ""], "argument --token: must not be empty"),
        (["server", "--token", " s3cret"], "argument --token: must not begin or end"),
        (["proxies", "--token", ""], "argument --token: must not be empty"),
        (["server", "--token-file", "/nonexistent/t"], "cannot read /nonexistent/t"),
        (["server", "--token", "a", "--token-file", __file__], "not allowed with argument"),
    ],
)
def test_an_empty_or_unreadable_token_is_a_usage_error(argv: list[str], says: str) -> None:
    r = _run(*argv)
    assert r.returncode == 2, r
    assert says in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize(
    "argv", [["server", "--host", "0.0.0.0", "--expose", "--port", "0"], ["proxies"]]
)
def test_an_empty_token_in_the_environment_is_refused_as_an_empty_token_option(
    argv: list[str], value: str
) -> None:
    # FAULTNET_TOKEN="" was taken as no token: an exposed server answered anyone (the
    # server above ran, listening on every address, until this run's timeout).
    r = subprocess.run(
        [sys.executable, "-m", "faultnet", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "FAULTNET_TOKEN": value},
    )
    assert r.returncode == 2, r
    says = "argument --token: $FAULTNET_TOKEN must not be empty"
    assert says in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr, r.stderr
    assert "listening on" not in r.stdout


def test_an_empty_token_file_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    r = _run("server", "--token-file", str(empty))
    assert r.returncode == 2 and "holds no token" in r.stderr.splitlines()[-1], r.stderr


def test_a_token_from_a_file_or_the_environment_is_not_on_the_command_line(
    tmp_path: Path,
) -> None:
    secret = "t0ken-from-a-file"
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", str(port)]
        + ["--token-file", str(token_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in read_line(proc.stdout, 20)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert secret.encode() not in cmdline  # what `ps` shows
        api = f"http://127.0.0.1:{port}"
        r = _run("proxies", "--api", api)
        assert r.returncode == 2 and "missing or wrong token (HTTP 401)" in r.stderr
        r = _run("proxies", "--api", api, "--token-file", str(token_file))
        assert r.returncode == 0 and r.stdout.strip() == "no proxies", r.stderr
        env = {**os.environ, "FAULTNET_TOKEN": secret}
        r = subprocess.run(
            [sys.executable, "-m", "faultnet", "proxies", "--api", api],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert r.returncode == 0 and r.stdout.strip() == "no proxies", r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
