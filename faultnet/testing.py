"""Helpers for testing programs through faultnet: loopback peers and bounded waits.

faultnet's own suite uses these, and so may anyone who writes tests with the pytest
plugin (the way ``trio.testing`` serves trio's users and its own tests alike).

* :func:`echo_server`, :func:`sink_server`, :func:`accept_server` -- real TCP peers on
  127.0.0.1, each yielding its address; all keep half-close (a FIN from the client is
  answered by the echo with its own FIN after the echoed bytes).
* :func:`udp_echo_server` -- a UDP peer on 127.0.0.1 that sends every datagram back to
  whoever sent it, counting them;
* :func:`start_server` -- the same peers' handlers (or yours) in a nursery you hold.
* :func:`open_link` -- a proxy in front of an accept server, and one connection
  through it: ``(proxy, client, server)``.
* :func:`read_line` -- one line from a child process's pipe, bounded.
* :func:`read_exactly` -- read *n* bytes or raise ``EOFError`` saying how many came.
* :func:`echo_back` -- send bytes to an echo while reading them back, both at once.
* :func:`wait_until` -- wait for a condition that has no event to wait on, bounded by
  a timeout; raises ``trio.TooSlowError`` naming what it waited for.
* :func:`wait_for_record` -- wait for a JSONL event-log record matching some fields.

Every wait here has a bound: a test that waits for an event that never comes fails on
its own bound, it does not hang.
"""

from __future__ import annotations

import functools
import selectors
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from faultnet.proxy import Proxy

__all__ = [
    "accept_server",
    "echo_back",
    "echo_server",
    "open_link",
    "read_exactly",
    "read_line",
    "receive_until",
    "recv_until",
    "sink_server",
    "start_server",
    "udp_echo_server",
    "wait_for_record",
    "wait_until",
]

Address = tuple[str, int]

#: How often :func:`wait_until` looks again. Small against every bound used with it;
#: the condition is cheap (a counter, a dict lookup, a file stat).
POLL_INTERVAL_S = 0.01


async def _echo(stream: trio.SocketStream) -> None:
    # Echo until EOF, then answer the client's FIN with our own (half-close kept).
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def _sink(counter: list[int], stream: trio.SocketStream) -> None:
    # Read and discard until EOF, counting bytes (counter[0]); then close.
    try:
        while data := await stream.receive_some(65536):
            counter[0] += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        await stream.aclose()


async def start_server(
    nursery: trio.Nursery,
    handler: Callable[[trio.SocketStream], Awaitable[Any]] | None = None,
    host: str = "127.0.0.1",
) -> Address:
    """Serve *handler* (default: :func:`echo_server`'s echo) on a free loopback port in
    *nursery* until it is cancelled; return the address. For fixtures that already hold
    a nursery; elsewhere use the context managers below."""
    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, handler or _echo, 0, host=host)
    )
    name = listeners[0].socket.getsockname()
    return name[0], name[1]


@asynccontextmanager
async def _serve(handler: Callable[[trio.SocketStream], Any], host: str) -> AsyncIterator[Address]:
    async with trio.open_nursery() as nursery:
        yield await start_server(nursery, handler, host)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def echo_server(host: str = "127.0.0.1") -> AsyncIterator[Address]:
    """An echo server on loopback for the duration of the block; yields its address."""
    async with _serve(_echo, host) as address:
        yield address


@asynccontextmanager
async def sink_server(host: str = "127.0.0.1") -> AsyncIterator[tuple[Address, list[int]]]:
    """A server that reads and discards; yields ``(address, counter)`` where
    ``counter[0]`` is the number of bytes received so far, over every connection."""
    counter = [0]
    async with _serve(functools.partial(_sink, counter), host) as address:
        yield address, counter


@asynccontextmanager
async def accept_server(
    host: str = "127.0.0.1",
) -> AsyncIterator[tuple[Address, trio.MemoryReceiveChannel[trio.SocketStream]]]:
    """A server that hands every accepted stream to the test; yields (address, channel).
    The streams stay open until the block ends."""
    send, receive = trio.open_memory_channel[trio.SocketStream](100)

    async def handler(stream: trio.SocketStream) -> None:
        await send.send(stream)
        await trio.sleep_forever()

    async with _serve(handler, host) as address:
        yield address, receive


@asynccontextmanager
async def udp_echo_server(host: str = "127.0.0.1") -> AsyncIterator[tuple[Address, list[int]]]:
    """A UDP server that echoes every datagram to its sender for the duration of the
    block; yields ``(address, counter)`` where ``counter[0]`` counts datagrams received
    (counted before the echo is sent, so a client that has its echo sees it counted)."""
    import socket

    counter = [0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with trio.socket.socket(family, socket.SOCK_DGRAM) as sock:
        await sock.bind((host, 0))

        async def echo() -> None:
            while True:
                data, peer = await sock.recvfrom(65536)
                counter[0] += 1
                try:
                    await sock.sendto(data, peer)
                except OSError:  # the sender is gone (ICMP): not the echo's business
                    continue

        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            yield sock.getsockname()[:2], counter
            nursery.cancel_scope.cancel()


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    """Read exactly *n* bytes; ``EOFError`` (saying how many came) at an early EOF."""
    buf = bytearray()
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += data
    return bytes(buf)


async def receive_until(
    stream: trio.abc.ReceiveStream, marker: bytes, buf: bytes = b"", piece: int = 65536
) -> bytes:
    """*buf* and what *stream* sends after it, read until *marker* is in it (all that
    was read: the caller splits at the marker); at EOF before it, what came."""
    while marker not in buf:
        data = await stream.receive_some(piece)
        if not data:
            break
        buf += data
    return buf


def recv_until(sock: socket.socket, marker: bytes, buf: bytes = b"", piece: int = 65536) -> bytes:
    """:func:`receive_until` for a blocking socket."""
    while marker not in buf:
        data = sock.recv(piece)
        if not data:
            break
        buf += data
    return buf


async def echo_back(stream: trio.abc.Stream, data: bytes, piece: int = 1 << 20) -> bytes:
    """Send *data* on *stream* in writes of *piece* bytes while reading back as many
    bytes as it holds (an echo's answer, :func:`echo_server`); return what came back.
    Both at once, so neither side's buffers fill and stall the other. Unbounded: the
    caller's cancel scope bounds it; an EOF first raises ``EOFError``."""

    async def send() -> None:
        for i in range(0, len(data), piece):
            await stream.send_all(data[i : i + piece])

    got = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while len(got) < len(data):
            # At most a piece per read: a recv of the whole rest allocates all of it.
            chunk = await stream.receive_some(min(piece, len(data) - len(got)))
            if not chunk:
                raise EOFError(f"EOF after {len(got)} of {len(data)} bytes")
            got += chunk
    return bytes(got)


async def wait_until(
    predicate: Callable[[], object], timeout: float = 5.0, what: str | None = None
) -> None:
    """Return once ``predicate()`` is true; ``trio.TooSlowError`` after *timeout* seconds.

    For state that has no event to wait on (a kernel counter, another process's file).
    Where there is an event, wait for the event instead.
    """
    try:
        with trio.fail_after(timeout):
            while not predicate():  # noqa: ASYNC110 - no event to wait on
                await trio.sleep(POLL_INTERVAL_S)
    except trio.TooSlowError:
        name = what or getattr(predicate, "__name__", "condition")
        raise trio.TooSlowError(f"{name} not true within {timeout} s") from None


def _matches(record: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    return all(record.get(k) == v for k, v in fields.items())


async def wait_for_record(path: str | Path, timeout: float = 5.0, **fields: Any) -> dict[str, Any]:
    """Wait until the JSONL event log at *path* holds a record whose fields equal
    *fields* (e.g. ``event="fault_applied", mode="freeze"``); return the first such.

    A truncated final line (a writer caught mid-record) is not an error here: it is
    read again on the next look. ``trio.TooSlowError`` after *timeout* seconds.
    """
    from faultnet.eventlog import read_jsonl

    found: list[dict[str, Any]] = []

    def look() -> bool:
        p = Path(path)
        if not p.exists():
            return False
        found[:] = [r for r in read_jsonl(p).records if _matches(r, fields)][:1]
        return bool(found)

    await wait_until(look, timeout, what=f"a record with {fields} in {path}")
    return found[0]


@asynccontextmanager
async def open_link(
    **proxy_kwargs: Any,
) -> AsyncIterator[tuple[Proxy, trio.SocketStream, trio.SocketStream]]:
    """A :class:`~faultnet.Proxy` in front of an :func:`accept_server`, and one
    connection through it: yields ``(proxy, client, server)``, the client's stream and
    the server's end of the same connection. Nothing has been sent yet."""
    from faultnet.proxy import open_proxy

    async with accept_server() as (addr, accepted), open_proxy(addr, **proxy_kwargs) as proxy:
        assert proxy.address is not None
        client = await trio.open_tcp_stream(*proxy.address)
        with trio.fail_after(5):
            server = await accepted.receive()
        yield proxy, client, server


def read_line(stream: IO[str] | IO[bytes], timeout: float) -> str:
    """One line from a child process's pipe (text or bytes), or ``TimeoutError`` after
    *timeout* seconds with nothing to read. Blocking: for a test's main thread."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"no line within {timeout} s")
    line = stream.readline()
    return line.decode() if isinstance(line, bytes) else line
