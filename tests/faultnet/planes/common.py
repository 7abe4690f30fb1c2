"""What the planes' own tests (test_native.py, test_thread.py) do alike, through a proxy:
find the one link, freeze a lane from another thread while its write is held, see one
connection ended while the others go on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trio

from faultnet.testing import read_exactly, wait_until


async def only_link(proxy: Any) -> Any:
    """The link of the proxy's one connection, once the plane has it."""
    await wait_until(lambda: any(c.link for c in proxy._connections.values()))
    (conn,) = proxy._connections.values()
    assert conn.link is not None
    return conn.link


async def freeze_while_held(
    link: Any, counted: Callable[[], int], let_go: Callable[[], None]
) -> tuple[int, bool]:
    """Freeze *link*'s upstream lane from a thread of its own while the plane is held
    inside that lane's write; let the write go after 0.2 s (the scenario's window).
    Return (*counted*() when freeze() returned, whether it returned within the window,
    that is before the held write was let go)."""
    returned = threading.Event()
    at_return: list[int] = []

    def freeze() -> None:
        link.freeze(["upstream"])
        at_return.append(counted())
        returned.set()

    freezer = threading.Thread(target=freeze)
    freezer.start()
    try:
        early = await trio.to_thread.run_sync(returned.wait, 0.2)
    finally:
        let_go()
    await trio.to_thread.run_sync(freezer.join, 5)
    assert at_return, "freeze() never returned"
    return at_return[0], early


async def ended_and_another_forwards(proxy: Any, victim: trio.SocketStream) -> None:
    """*victim*'s connection was ended (reset, or EOF: nothing more to read), and a new
    connection through *proxy* still forwards."""
    with trio.fail_after(5):
        try:  # ended: the proxy resets it
            got = await victim.receive_some(10)
        except trio.BrokenResourceError:
            got = b""
    assert got == b""
    other = await trio.open_tcp_stream(*proxy.address)
    await other.send_all(b"still forwarding")
    with trio.fail_after(5):
        assert await read_exactly(other, 16) == b"still forwarding"
