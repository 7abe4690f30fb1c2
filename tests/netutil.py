"""Loopback peers for the proxy tests: an echo server and a sink, both half-close aware."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


async def _echo(stream: trio.SocketStream) -> None:
    # Echo until EOF, then answer the client's FIN with our own (half-close kept).
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()


@asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[str, int]]:
    """An echo server on 127.0.0.1; yields its address."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _echo, 0, host="127.0.0.1")
        )
        yield listeners[0].socket.getsockname()[:2]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def accept_server() -> AsyncIterator[tuple[tuple[str, int], trio.MemoryReceiveChannel]]:
    """A server that hands every accepted stream to the test; yields (address, channel)."""
    send, receive = trio.open_memory_channel[trio.SocketStream](100)

    async def handler(stream: trio.SocketStream) -> None:
        await send.send(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        )
        yield listeners[0].socket.getsockname()[:2], receive
        nursery.cancel_scope.cancel()


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += data
    return bytes(buf)
