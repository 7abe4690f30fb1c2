"""The TLS ends (faultnet.protocols.tls) as pure sessions, with no socket: real
:class:`ssl.SSLObject` clients and servers over memory, events in, commands out."""

from __future__ import annotations

import ssl

import pytest
import trustme

from faultnet.protocols.http import Close, Eof, Hold, Inject, Resume
from faultnet.protocols.tls import (
    MAX_EARLY,
    Ask,
    Hello,
    Originator,
    Settled,
    State,
    Terminator,
    TlsCommand,
    ca_cert_path,
    client_hello_end,
    read_client_hello,
)


def nolog(event: str, **fields: object) -> None:
    pass


def client(name: str | None, alpn: list[str]) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """A client trusting the throwaway CA: (its SSLObject, its incoming, its outgoing)."""
    ctx = ssl.create_default_context(cafile=ca_cert_path())
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    return ctx.wrap_bio(incoming, outgoing, server_hostname=name), incoming, outgoing


def hello_of(name: str | None, alpn: list[str]) -> bytes:
    obj, _, outgoing = client(name, alpn)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize(
    ("name", "alpn"),
    [
        ("localhost", ["h2", "http/1.1"]),
        ("api.example.test", ["http/1.1"]),
        ("a" * 63 + "." + "b" * 63 + ".test", []),
        (None, ["grpc-exp", "h2"]),
    ],
)
def test_the_hello_reads_as_ssl_wrote_it(name: str | None, alpn: list[str]) -> None:
    # Conformance: the name and protocols Python's ssl (OpenSSL) put in its ClientHello.
    record = hello_of(name, alpn)
    end = client_hello_end(record)
    assert end is not None and end > 0
    assert read_client_hello(record[:end]) == Hello(name, tuple(alpn))


@pytest.mark.parametrize("cut", [0, 5, 9, 50, 120])
def test_a_truncated_or_foreign_hello_reads_as_empty(cut: int) -> None:
    record = hello_of("localhost", ["h2"])
    assert read_client_hello(record[:cut]) == Hello()
    assert read_client_hello(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00") == Hello()


def sends(cmds: list[TlsCommand], stream: str) -> bytes:
    return b"".join(c.data for c in cmds if isinstance(c, Inject) and c.stream == stream)


def written(end: Terminator, cmds: list[TlsCommand]) -> bytes:
    """What *cmds* and what each write hands over after it put on the downstream, as a
    carrier does: each write, then :meth:`sent`."""
    out = b""
    while writes := [c for c in cmds if isinstance(c, Inject | Eof) and c.stream == "downstream"]:
        out += sends(cmds, "downstream")
        cmds = end.sent(writes[0].stream)
    return out


def test_the_terminator_asks_upstream_and_answers_with_its_choice() -> None:
    obj, incoming, outgoing = client("api.example.test", ["h2", "http/1.1"])
    end = Terminator(("localhost",), (), nolog)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    cmds = end.records_in(outgoing.read())
    assert cmds == [Ask(Hello("api.example.test", ("h2", "http/1.1")))]
    assert end.state is State.ASKING and end.offer() == ("h2", "http/1.1")
    cmds = end.settled("h2")
    incoming.write(sends(cmds, "downstream"))
    obj.do_handshake()  # the leaf is for api.example.test, or this raises
    assert obj.selected_alpn_protocol() == "h2"
    # One write out at a time: the next records wait for sent().
    end.records_in(outgoing.read())
    assert end.state is State.OPEN and end.alpn == "h2"


def test_records_leave_in_order_one_write_at_a_time() -> None:
    obj, incoming, outgoing = client("localhost", [])
    end = Terminator(("localhost",), (), nolog)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    end.records_in(outgoing.read())
    first = end.settled(None)
    assert [type(c) for c in first] == [Inject]  # the server's flight, out
    # Plaintext comes while that write is out: kept, in order, not a second write.
    assert end.plain_in(b"one ") == []
    incoming.write(first[0].data)  # type: ignore[union-attr]
    obj.do_handshake()
    end.records_in(outgoing.read())
    assert end.plain_in(b"two") == []
    after = end.sent("downstream")
    assert [type(c) for c in after] == [Inject]
    incoming.write(after[0].data)  # type: ignore[union-attr]
    assert obj.read(100) + obj.read(100) == b"one two"
    assert end.sent("downstream") == []  # free again
    cmds = end.plain_eof()  # close_notify, then the FIN
    incoming.write(sends(cmds, "downstream"))
    assert end.sent("downstream") == [Eof("downstream")]
    assert obj.read(100) == b""  # close_notify (without it: SSLWantReadError)


def test_a_server_that_speaks_first_is_held_until_the_client_handshakes() -> None:
    # Issue 33, 5: what the upstream sent before the client's handshake ended was kept
    # without limit (+621 MB in 2 s); past 64 KiB the downstream is held, then resumed.
    end = Terminator(("localhost",), (), nolog)
    cmds = end.plain_in(b"x" * (MAX_EARLY + 1))
    assert cmds == [Hold("downstream", None)]
    obj, incoming, outgoing = client("localhost", [])
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    end.records_in(outgoing.read())
    incoming.write(sends(end.settled(None), "downstream"))
    obj.do_handshake()
    cmds = end.records_in(outgoing.read())
    incoming.write(sends(cmds, "downstream"))
    cmds = end.sent("downstream")
    assert Resume("downstream") in cmds
    incoming.write(written(end, cmds))
    got = b""
    while len(got) < MAX_EARLY + 1:
        got += obj.read(1 << 20)
    assert got == b"x" * (MAX_EARLY + 1)


def test_a_failed_upstream_is_a_502_to_an_http_client() -> None:
    obj, incoming, outgoing = client("localhost", ["h2", "http/1.1"])
    end = Terminator(("localhost",), (), nolog)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    end.records_in(outgoing.read())
    incoming.write(written(end, end.settled(None, "CERTIFICATE_VERIFY_FAILED: expired")))
    obj.do_handshake()
    assert obj.selected_alpn_protocol() == "http/1.1"  # not h2: the 502 is HTTP/1
    incoming.write(written(end, end.records_in(outgoing.read())))
    obj.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    cmds = end.records_in(outgoing.read())
    incoming.write(sends(cmds, "downstream"))
    answer = obj.read(4096)
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert answer.endswith(b"failed: CERTIFICATE_VERIFY_FAILED: expired\n")
    assert end.sent("downstream") == [Eof("downstream")]
    assert end.sent("downstream") == [Close()]


def test_the_originator_offers_the_clients_name_and_protocols() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.example.test").configure_cert(server_ctx)
    server_ctx.set_alpn_protocols(["http/1.1", "h2"])
    seen: list[str] = []
    server_ctx.sni_callback = lambda o, name, c: seen.append(name)  # type: ignore[func-returns-value]
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    def wrap(
        i: ssl.MemoryBIO, o: ssl.MemoryBIO, name: str | None, alpn: tuple[str, ...]
    ) -> ssl.SSLObject:
        client_ctx.set_alpn_protocols(list(alpn))
        return client_ctx.wrap_bio(i, o, server_hostname=name)

    end = Originator(wrap, None, nolog)
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    cmds = end.start(Hello("api.example.test", ("h2",)), ("h2",))
    while not any(isinstance(c, Settled) for c in cmds):
        s_in.write(sends(cmds, "upstream"))
        end.sent("upstream")
        try:
            server.do_handshake()
        except ssl.SSLWantReadError:
            pass
        cmds = end.records_in(s_out.read())
    assert Settled("h2") in cmds and seen == ["api.example.test"]
