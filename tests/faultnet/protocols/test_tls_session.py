"""The TLS ends (faultnet.protocols.tls) over memory, with no socket: a real
:class:`ssl.SSLObject` client against a :class:`Terminator`."""

from __future__ import annotations

import ssl

import trio
import trio.testing

from faultnet.protocols.tls import Terminator, ca_cert_path, server_context


class _Recording:
    """An Out that keeps what it is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False

    async def inject(self, data: bytes, t_read: float | None = None) -> None:
        self.data += data

    async def inject_eof(self) -> None:
        self.eof = True

    async def reset(self) -> None:
        pass


async def test_a_server_that_speaks_first_is_held_until_the_client_handshakes() -> None:
    # Issue 33, 5: what the upstream sent before the client's handshake ended was kept
    # without limit (+621 MB in 2 s); now the downstream waits past 64 KiB, and every
    # byte reaches the client, in order, once the handshake is done.
    records, plain = _Recording(), _Recording()
    end = Terminator(server_context(["localhost"]), plain, records, lambda event, **f: None)
    spoken = bytes(i % 249 for i in range(1024 * 1024))
    sent = 0

    async def server_speaks() -> None:
        nonlocal sent
        for i in range(0, len(spoken), 16384):
            await end.plain_in(spoken[i : i + 16384])
            sent = i + 16384

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = ssl.create_default_context(cafile=ca_cert_path())
    client = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    got = bytearray()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server_speaks)
            await trio.testing.wait_all_tasks_blocked()
            assert sent < len(spoken), "the server was never held"
            assert 0 < sent <= 128 * 1024
            while len(got) < len(spoken):
                try:
                    client.do_handshake()
                    got += client.read(1 << 20)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                if out := outgoing.read():
                    await end.records_in(out)
                await trio.testing.wait_all_tasks_blocked()
                incoming.write(bytes(records.data))
                records.data.clear()
    assert bytes(got) == spoken
