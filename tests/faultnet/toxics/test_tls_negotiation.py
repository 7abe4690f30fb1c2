"""TLS that negotiates (issue 33, 7): ALPN offered upstream and answered as the upstream
chose, the client's SNI sent upstream, a leaf made for the name the client asked, a
client certificate towards the upstream (mTLS), an alert for a client the 502 cannot
reach, and close_notify on a clean close. Real clients (curl, trio's SSLStream over
Python's ssl) and a real TLS upstream (hypercorn, or the small server below, which
says what it was asked)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trustme

from faultnet.eventlog import read_jsonl
from faultnet.proxy import Proxy
from faultnet.toxics import HttpAbort, TlsOriginate, TlsTerminate
from tests.faultnet.http_app import Address
from tests.faultnet.toxics.test_tls import (
    Unverified,
    curl,
    https,
    https_proxy,
    terminate,
    tls_app,
    unverified,
)

__all__ = ["https_proxy", "tls_app", "unverified"]  # fixtures used here

Factory = Callable[..., Awaitable[Proxy]]


@dataclass
class Upstream:
    """A TLS server that answers each request with what its handshake saw."""

    address: Address
    cafile: str
    #: (SNI, ALPN chosen, client certificate's common name), one per connection.
    seen: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)


async def serve_tls(
    nursery: trio.Nursery, tmp_path: Path, client_ca: trustme.CA | None = None
) -> Upstream:
    """The server, on a free loopback port: ALPN h2 then http/1.1; a client certificate
    from *client_ca* required when given."""
    ca = trustme.CA()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "api.example.test").configure_cert(ctx)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    if client_ca is not None:
        client_ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    names: list[str | None] = []
    ctx.sni_callback = lambda obj, name, c: names.append(name)  # type: ignore[func-returns-value]
    cafile = str(tmp_path / "upstream-ca.pem")
    ca.cert_pem.write_to_path(cafile)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    upstream = Upstream(listeners[0].socket.getsockname()[:2], cafile)

    async def handle(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, ctx, server_side=True)
        try:
            await stream.do_handshake()
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(65536)
            peer = stream.getpeercert()
            cn = dict(x[0] for x in peer["subject"])["commonName"] if peer else None
            upstream.seen.append(
                (names[-1] if names else None, stream.selected_alpn_protocol(), cn)
            )
            body = repr(upstream.seen[-1]).encode()
            head = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            await stream.send_all(head % len(body) + body)
            await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return upstream


async def tls_client(
    proxy: Proxy, cafile: str, name: str | None, alpn: list[str]
) -> trio.SSLStream[trio.SocketStream]:
    """A client's TLS through *proxy*, trusting *cafile*, asking *name* (SNI and the name
    checked; None: 127.0.0.1 with no SNI), offering *alpn*; handshake done."""
    assert proxy.address is not None
    ctx = ssl.create_default_context(cafile=cafile)
    if alpn:
        ctx.set_alpn_protocols(alpn)
    tcp = await trio.open_tcp_stream(*proxy.address)
    stream = trio.SSLStream(tcp, ctx, server_hostname=name or "127.0.0.1")
    with trio.fail_after(10):
        await stream.do_handshake()
    return stream


async def get(stream: trio.SSLStream[trio.SocketStream], host: str = "x") -> bytes:
    """One HTTP/1.1 request with Connection: close; the whole answer, to the end."""
    await stream.send_all(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    out = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            out += chunk
    return out


async def test_curl_over_http2_gets_h2_because_the_upstream_chose_it(
    https_proxy: tuple[Proxy, str],
) -> None:
    # Was HTTP/1.1 whatever curl asked: the terminator offered no ALPN at all.
    proxy, upstream_ca = https_proxy
    cacert = terminate(proxy, TlsOriginate(ca=upstream_ca))
    for flag, version in (("--http2", b"2"), ("--http1.1", b"1.1")):
        done = await curl(flag, "--cacert", cacert, "-w", " %{http_version}", https(proxy, "/x"))
        assert done.stdout == b"GET /x ok " + version, done.stderr


async def test_the_upstream_sees_the_name_and_protocols_the_client_asked(
    faultnet_proxy: Factory, nursery: trio.Nursery, tmp_path: Path
) -> None:
    upstream = await serve_tls(nursery, tmp_path)
    log = tmp_path / "events.jsonl"
    proxy = await faultnet_proxy(upstream.address, event_log=str(log))
    cacert = terminate(proxy, TlsOriginate(ca=upstream.cafile))
    # The client checks the leaf against the name it asked: a leaf for localhost (as
    # before) fails here with a hostname mismatch.
    client = await tls_client(proxy, cacert, "api.example.test", ["h2", "http/1.1"])
    assert client.selected_alpn_protocol() == "h2"
    assert b"('api.example.test', 'h2', None)" in await get(client)
    client = await tls_client(proxy, cacert, "localhost", ["http/1.1"])
    assert client.selected_alpn_protocol() == "http/1.1"
    assert b"('localhost', 'http/1.1', None)" in await get(client)
    shakes = [r for r in read_jsonl(log).records if r["event"] == "tls_handshake"]
    assert {(r["server_name"], r["alpn"]) for r in shakes} == {
        ("api.example.test", "h2"),
        ("localhost", "http/1.1"),
    }


async def test_curl_trusts_a_leaf_made_for_the_name_it_resolved(
    faultnet_proxy: Factory, nursery: trio.Nursery, tmp_path: Path
) -> None:
    upstream = await serve_tls(nursery, tmp_path)
    proxy = await faultnet_proxy(upstream.address)
    cacert = terminate(proxy, TlsOriginate(ca=upstream.cafile))
    assert proxy.address is not None
    port = proxy.address[1]
    url = f"https://api.example.test:{port}/"
    resolve = f"api.example.test:{port}:127.0.0.1"
    done = await curl("--http1.1", "--resolve", resolve, "--cacert", cacert, url)
    assert b"'api.example.test'" in done.stdout, done.stderr


async def test_server_name_overrides_the_name_sent_upstream(
    faultnet_proxy: Factory, nursery: trio.Nursery, tmp_path: Path
) -> None:
    upstream = await serve_tls(nursery, tmp_path)
    proxy = await faultnet_proxy(upstream.address)
    cacert = terminate(proxy, TlsOriginate(ca=upstream.cafile, server_name="localhost"))
    client = await tls_client(proxy, cacert, "api.example.test", [])
    assert b"('localhost', None, None)" in await get(client)


async def test_a_client_certificate_reaches_an_upstream_that_asks_for_one(
    faultnet_proxy: Factory, nursery: trio.Nursery, tmp_path: Path
) -> None:
    client_ca = trustme.CA()
    leaf = client_ca.issue_cert("faultnet-client", common_name="faultnet-client")
    cert, key = str(tmp_path / "client.pem"), str(tmp_path / "client.key")
    leaf.cert_chain_pems[0].write_to_path(cert)
    leaf.private_key_pem.write_to_path(key)
    upstream = await serve_tls(nursery, tmp_path, client_ca)
    proxy = await faultnet_proxy(upstream.address, event_log=str(tmp_path / "e.jsonl"))
    cacert = terminate(proxy, TlsOriginate("mtls", ca=upstream.cafile, cert=cert, key=key))
    client = await tls_client(proxy, cacert, "localhost", [])
    assert b"('localhost', None, 'faultnet-client')" in await get(client)
    # Without it the upstream refuses it after the client's handshake (TLS 1.3), so
    # after ours with the client, and closes (this one without its alert): still a 502.
    proxy.update_toxic("mtls", {"cert": "", "key": ""})
    client = await tls_client(proxy, cacert, "localhost", [])
    refused = await get(client)
    failed = [r for r in read_jsonl(tmp_path / "e.jsonl").records if r["event"] == "tls_failed"]
    assert len(failed) == 1, failed
    assert refused.startswith(b"HTTP/1.1 502 Bad Gateway\r\n"), refused
    assert b"closed the connection before answering" in refused
    assert len(upstream.seen) == 1


def test_a_client_certificate_that_does_not_load_is_a_400(tmp_path: Path) -> None:
    from faultnet.server.toxic_codec import BadToxicBody, toxic_from_json

    (tmp_path / "junk.pem").write_text("not a certificate")
    for attributes in (
        {"cert": str(tmp_path / "missing.pem")},
        {"cert": str(tmp_path / "junk.pem")},
    ):
        with pytest.raises(BadToxicBody, match="cannot load"):
            toxic_from_json({"type": "tls_originate", "attributes": attributes})


async def test_a_client_that_offers_only_h2_gets_an_alert_from_a_failed_upstream(
    unverified: Unverified,
) -> None:
    # A 502 cannot be said in HTTP/1 to a gRPC client: a real gateway's alert instead.
    with pytest.raises(trio.BrokenResourceError) as caught:
        await tls_client(unverified.proxy, unverified.cacert, "localhost", ["h2"])
    assert "HANDSHAKE_FAILURE" in repr(caught.value.__cause__)
    unverified.assert_failed_once()


async def test_a_clean_close_is_a_close_notify_to_the_client(
    https_proxy: tuple[Proxy, str],
) -> None:
    # trio's SSLStream reads a FIN without close_notify as a broken stream (ragged EOF).
    proxy, upstream_ca = https_proxy
    cacert = terminate(proxy, TlsOriginate(ca=upstream_ca))
    client = await tls_client(proxy, cacert, "localhost", ["http/1.1"])
    assert (await get(client, "localhost")).endswith(b"GET / ok")


async def test_terminate_alone_answers_alpn_from_its_own_list(
    faultnet_proxy: Factory, nursery: trio.Nursery
) -> None:
    from tests.faultnet.http_app import serve_app

    proxy = await faultnet_proxy(await serve_app(nursery))
    toxic = TlsTerminate(alpn="http/1.1")
    proxy.add_toxic(toxic)
    cacert = str(toxic.attributes()["ca_cert"])
    client = await tls_client(proxy, cacert, "localhost", ["h2", "http/1.1"])
    assert client.selected_alpn_protocol() == "http/1.1"
    assert (await get(client, "localhost")).endswith(b"GET / ok")
    client = await tls_client(proxy, cacert, None, ["h2"])  # no SNI: the hostnames' leaf
    assert client.selected_alpn_protocol() is None


async def test_an_http_toxic_faults_http2_inside_tls(https_proxy: tuple[Proxy, str]) -> None:
    # The HTTP toxics read HTTP/2 by its preface, which, once ALPN chose h2, is the
    # first thing the terminator hands on: curl --http2 gets the abort as HTTP/2.
    proxy, upstream_ca = https_proxy
    abort = HttpAbort(status=503, path="/api/*", count=1)
    cacert = terminate(proxy, abort, TlsOriginate(ca=upstream_ca))
    args = ("--http2", "--cacert", cacert, "-w", " %{http_code} %{http_version}")
    done = await curl(*args, https(proxy, "/api/x"))
    assert done.stdout.endswith(b" 503 2"), (done.stdout, done.stderr)
    done = await curl(*args, https(proxy, "/api/x"))  # count=1: the next one passes
    assert done.stdout == b"GET /api/x ok 200 2", (done.stdout, done.stderr)
    assert abort.faulted == 1
