"""The HTTP and TLS toxics through the front doors: the ``faultnet`` CLI against a
server (``toxic add`` with string attributes, ``faultnet ca``), the API's ``/ca`` route
and the OpenAPI document generated from the toxics' attribute declarations."""

from __future__ import annotations

import shutil

import httpx
import pytest
import trio

from faultnet.addresses import parse_address
from faultnet.server import RunningServer
from tests.conftest import require_program
from tests.faultnet.http_app import serve_app
from tests.faultnet.server.test_server_cli import Cli


@pytest.fixture
def cli(faultnet_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(faultnet_server.url, capsys)


async def test_the_cli_adds_https_faults_and_prints_the_ca(cli: Cli, nursery: trio.Nursery) -> None:
    curl = require_program(shutil.which("curl"), "curl")
    host, port = await serve_app(nursery)
    await cli.ok("create", "web", "--upstream", f"{host}:{port}")
    await cli.ok("toxic", "add", "web", "-t", "tls_terminate")
    out = await cli.ok(
        "toxic", "add", "web", "-t", "http_abort", "-a", "path=/api/*", "-a", "count=1"
    )
    assert out.strip() == "added http_abort_downstream (http_abort, downstream) to web"
    path = (await cli.ok("ca", "--path")).strip()
    pem = await cli.ok("ca")
    assert pem.startswith("-----BEGIN CERTIFICATE-----")
    assert pem == await trio.Path(path).read_text()
    listen = parse_address((await cli.json("proxies"))["web"]["listen"])
    got = await trio.run_process(
        [curl, "-sS", "--max-time", "10", "--cacert", path, "-w", " %{http_code}"]
        + [f"https://localhost:{listen[1]}/api/x"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert got.stdout.endswith(b" 503"), got.stderr
    # A string where a number belongs: the server's 400, one line, exit 2.
    code, _, err = await cli("toxic", "add", "web", "-t", "http_delay", "-a", "delay=soon")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "delay" in err
    code, _, err = await cli("toxic", "add", "web", "-t", "http_delay", "-a", "before=never")
    assert code == 2 and "before" in err
    await cli.ok("toxic", "remove", "web", "http_abort_downstream")


async def test_the_ca_route_and_the_openapi_document(faultnet_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=faultnet_server.url) as api:
        ca = (await api.get("/ca")).json()
        assert ca["pem"].startswith("-----BEGIN CERTIFICATE-----") and ca["path"]
        doc = (await api.get("/openapi.json")).json()
    assert "/ca" in doc["paths"]
    schemas = doc["components"]["schemas"]
    types = schemas["ToxicCreate"]["properties"]["type"]["enum"]
    assert {"http_abort", "http_delay", "tls_terminate", "tls_handshake"} <= set(types)
    attributes = schemas["Toxic"]["properties"]["attributes"]["properties"]
    assert attributes["path"]["type"] == "string"
    assert attributes["percent"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 100,
        "description": attributes["percent"]["description"],
        "nullable": True,  # as every toxic attribute: Toxiproxy's Go client sends null
    }
    assert "http_abort: " in attributes["status"]["description"]


def test_chaos_draws_protocol_toxics_only_when_a_plan_weighs_them() -> None:
    from faultnet.chaos import catalogue

    faults = catalogue()
    assert faults["toxic:http_abort"].weight == 0 and faults["toxic:tls_terminate"].weight == 0
    assert faults["toxic:http_abort"].attributes == {"status": 503, "percent": 20}
    assert faults["toxic:latency"].weight > 0
    weighed = catalogue({"toxic:http_delay": {"weight": 2, "attributes": {"path": "/api/*"}}})
    assert weighed["toxic:http_delay"].weight == 2
    assert weighed["toxic:http_delay"].attributes["path"] == "/api/*"


async def test_the_chaos_toolkit_extension_adds_and_removes_an_http_toxic(
    faultnet_server: RunningServer, nursery: trio.Nursery
) -> None:
    from faultnet.chaostoolkit import actions

    host, port = await serve_app(nursery)
    async with httpx.AsyncClient(base_url=faultnet_server.url) as api:
        r = await api.post("/proxies", json={"name": "web", "upstream": f"{host}:{port}"})
        listen = parse_address(r.json()["listen"])
        t = await trio.to_thread.run_sync(
            lambda: actions.add_toxic(
                "web",
                "http_abort",
                attributes={"path": "/api/*", "status": 418},
                api_url=faultnet_server.url,
            )
        )
        assert t["type"] == "http_abort" and t["attributes"]["status"] == 418
        web = f"http://{listen[0]}:{listen[1]}"
        assert (await api.get(web + "/api/tea")).status_code == 418
        await trio.to_thread.run_sync(
            lambda: actions.remove_toxic("web", t["name"], api_url=faultnet_server.url)
        )
        assert (await api.get(web + "/api/tea")).status_code == 200
