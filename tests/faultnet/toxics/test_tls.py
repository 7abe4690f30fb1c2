"""HTTPS: the HTTP toxics inside TLS terminated with the throwaway CA (curl --cacert,
httpx verify=), TLS re-originated towards an HTTPS upstream (verified against its CA,
or refused when it cannot be), and the handshake faults without termination."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.toxics import (
    HttpAbort,
    HttpTruncate,
    TlsHandshake,
    TlsOriginate,
    TlsTerminate,
    Toxic,
)
from tests.faultnet.http_app import BIG, Address, serve_app
from tests.faultnet.http_app import curl as http_curl

Factory = Callable[..., Awaitable[Proxy]]


def https(proxy: Proxy, path: str) -> str:
    assert proxy.address is not None
    return f"https://localhost:{proxy.address[1]}{path}"


async def curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await http_curl(*args, max_time=10)


def terminate(proxy: Proxy, *inner: Toxic) -> str:
    """Terminate the clients' TLS on *proxy* (outermost), then add *inner*; return the
    path of the throwaway CA's certificate, which the clients are to trust."""
    toxic = TlsTerminate()
    proxy.add_toxic(toxic)
    for t in inner:
        proxy.add_toxic(t)
    return str(toxic.attributes()["ca_cert"])


@pytest.fixture
async def app(nursery: trio.Nursery) -> Address:
    return await serve_app(nursery)


@pytest.fixture
async def tls_app(nursery: trio.Nursery, tmp_path: Path) -> tuple[Address, str]:
    """hypercorn over TLS with its own CA (not the proxy's); returns (address, CA file)."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    certfile, keyfile, cafile = (str(tmp_path / n) for n in ("c.pem", "k.pem", "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(certfile)
    cert.private_key_pem.write_to_path(keyfile)
    ca.cert_pem.write_to_path(cafile)
    return await serve_app(nursery, tls=(certfile, keyfile)), cafile


@pytest.fixture
async def https_proxy(faultnet_proxy: Factory, tls_app: tuple[Address, str]) -> tuple[Proxy, str]:
    """A proxy in front of the HTTPS upstream, and the CA file that signed the upstream."""
    address, upstream_ca = tls_app
    return await faultnet_proxy(address), upstream_ca


async def test_curl_with_the_throwaway_ca_gets_http_faults_inside_https(
    faultnet_proxy: Factory, app: Address, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(app, event_log=str(log))
    cacert = terminate(proxy, HttpAbort("api", path="/api/*", status=503, body="busy", count=1))
    assert (await trio.Path(cacert).read_text()).startswith("-----BEGIN CERTIFICATE-----")
    first = await curl("--cacert", cacert, "-w", " %{http_code}", https(proxy, "/api/x"))
    assert first.stdout == b"busy 503", first.stderr
    again = await curl("--cacert", cacert, https(proxy, "/api/x"))
    assert again.stdout == b"GET /api/x ok", again.stderr
    # Without the CA, curl refuses the certificate (exit 60): it is not a public one.
    assert (await curl(https(proxy, "/"))).returncode == 60
    faults = [r for r in read_jsonl(log).records if r["event"] == "http_fault"]
    assert [(r["method"], r["path"], r["action"]) for r in faults] == [("GET", "/api/x", "abort")]


async def test_httpx_verifying_the_ca_sees_a_truncated_body_over_https(
    faultnet_proxy: Factory, app: Address
) -> None:
    proxy = await faultnet_proxy(app)
    cacert = terminate(proxy, HttpTruncate("cut", path="/big", bytes=1000, count=1))
    verify = ssl.create_default_context(cafile=cacert)
    async with httpx.AsyncClient(verify=verify, timeout=10) as client:
        assert (await client.get(https(proxy, "/small"))).text == "GET /small ok"
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(https(proxy, "/big"))
        r = await client.get(https(proxy, "/big"))  # count=1: whole, on a new connection
        assert r.content == BIG


async def test_tls_is_re_originated_to_an_https_upstream_verified_against_its_ca(
    https_proxy: tuple[Proxy, str],
) -> None:
    proxy, upstream_ca = https_proxy
    cacert = terminate(
        proxy,
        HttpAbort("api", path="/api/*", status=502),
        TlsOriginate(ca=upstream_ca, server_name="localhost"),
    )
    verify = ssl.create_default_context(cafile=cacert)
    async with httpx.AsyncClient(verify=verify, timeout=10) as client:
        r = await client.get(https(proxy, "/through"))
        assert (r.status_code, r.text) == (200, "GET /through ok")
        assert (await client.post(https(proxy, "/echo"), content=BIG)).content == BIG
        assert (await client.get(https(proxy, "/api/x"))).status_code == 502


@dataclass
class Unverified:
    """A proxy that terminates the client's TLS and verifies the HTTPS upstream against
    the system's CAs, which never signed it (:func:`tls_app`'s own CA did); the CA file
    of the proxy's leaves; its event log."""

    proxy: Proxy
    cacert: str
    log: Path

    def assert_failed_once(self) -> None:
        """One ``tls_failed`` record, and it names the failed verification."""
        failed = [r for r in read_jsonl(self.log).records if r["event"] == "tls_failed"]
        assert len(failed) == 1 and "CERTIFICATE_VERIFY_FAILED" in failed[0]["reason"]


@pytest.fixture
async def unverified(
    faultnet_proxy: Factory, tls_app: tuple[Address, str], tmp_path: Path
) -> Unverified:
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(tls_app[0], event_log=str(log))
    cacert = terminate(proxy, TlsOriginate(server_name="localhost"))  # the system's CAs
    return Unverified(proxy, cacert, log)


async def test_an_upstream_the_system_cas_cannot_verify_is_a_502_naming_why(
    unverified: Unverified,
) -> None:
    # Issue 33, 7: the client saw a reset and no reason; a real gateway (nginx with
    # proxy_ssl_verify) answers 502. One tls_failed event says why.
    url = https(unverified.proxy, "/")
    done = await curl("--cacert", unverified.cacert, "-w", "\n%{http_code}", url)
    body, _, status = done.stdout.rpartition(b"\n")
    assert (done.returncode, status) == (0, b"502"), done.stderr
    assert b"CERTIFICATE_VERIFY_FAILED" in body and b"local issuer" in body
    unverified.assert_failed_once()


async def test_a_stalled_handshake_hangs_the_client_until_its_own_timeout(
    https_proxy: tuple[Proxy, str],
) -> None:
    proxy, upstream_ca = https_proxy
    proxy.add_toxic(TlsHandshake("stall", action="stall"))
    t0 = trio.current_time()
    done = await curl("--cacert", upstream_ca, "--max-time", "1", https(proxy, "/"))
    assert done.returncode == 28, done.stderr  # CURLE_OPERATION_TIMEDOUT
    assert trio.current_time() - t0 >= 1.0


async def test_a_reset_during_the_handshake_is_a_connection_reset(
    https_proxy: tuple[Proxy, str],
) -> None:
    proxy, upstream_ca = https_proxy
    proxy.add_toxic(TlsHandshake("rst", action="reset"))
    done = await curl("--cacert", upstream_ca, https(proxy, "/"))
    assert done.returncode == 35, done.stderr  # CURLE_SSL_CONNECT_ERROR
    assert b"reset" in done.stderr.lower()
    proxy.remove_toxic("rst")
    ok = await curl("--cacert", upstream_ca, https(proxy, "/"))
    assert ok.stdout == b"GET / ok", ok.stderr


async def test_reset_delay_slow_body_and_hold_inside_https(
    faultnet_proxy: Factory, app: Address
) -> None:
    from faultnet.toxics import HttpDelay, HttpHold, HttpReset, HttpSlowBody

    proxy = await faultnet_proxy(app)
    cacert = terminate(
        proxy,
        HttpReset("rst", path="/big", method="GET", bytes=5000),
        HttpDelay("late", path="/late", delay=300),
        HttpSlowBody("slow", path="/big", method="POST", rate=400_000),
        HttpHold("hold", path="/stuck"),
    )
    reset = await curl("--cacert", cacert, https(proxy, "/big"))
    assert reset.returncode == 56 and b"reset" in reset.stderr.lower(), reset.stderr
    verify = ssl.create_default_context(cafile=cacert)
    async with httpx.AsyncClient(verify=verify, timeout=httpx.Timeout(10, read=1)) as client:
        t0 = trio.current_time()
        assert (await client.get(https(proxy, "/late"))).text == "GET /late ok"
        assert trio.current_time() - t0 >= 0.3
        t0 = trio.current_time()
        # POST /big echoes the body sent; the echo is paced at the rate.
        assert (await client.post(https(proxy, "/big"), content=BIG)).content == BIG
        assert trio.current_time() - t0 >= (len(BIG) - 400_000 // 20) / 400_000
        with pytest.raises(httpx.ReadTimeout):
            await client.get(https(proxy, "/stuck"))


async def test_tls_originated_with_no_verification_reaches_any_upstream(
    https_proxy: tuple[Proxy, str],
) -> None:
    # ca="none": no chain, no name checked (a self-signed test server, say).
    proxy, _ = https_proxy
    cacert = terminate(proxy, TlsOriginate(ca="none"))
    done = await curl("--cacert", cacert, https(proxy, "/any"))
    assert done.stdout == b"GET /any ok", done.stderr


def test_tls_originate_refuses_a_ca_file_it_cannot_read(tmp_path: Path) -> None:
    # A ValueError, which the API answers with 400 (an OSError would be its 500).
    from faultnet.server.toxic_codec import BadToxicBody, toxic_from_json

    with pytest.raises(ValueError, match="cannot load"):
        TlsOriginate(ca=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(BadToxicBody, match="cannot load"):
        toxic_from_json({"type": "tls_originate", "attributes": {"ca": str(tmp_path / "junk.pem")}})
