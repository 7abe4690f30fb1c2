"""The two roles the benchmark runs in their own processes (``--role upstream`` and
``--role proxy``): the upstream server and one faultnet proxy, each driven by JSON lines."""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from faultnet.sockopts import raise_fd_limit
from faultnet.testing import receive_until
from harness.bench._stream import (
    HOST,
    IO_TIMEOUT_S,
    MODE_ECHO,
    MODE_HOLD,
    MODE_SINK,
    MODE_SINK_SHA,
    PUSH,
    _emit,
    _set_io_timeout,
    make_block,
    matches_block,
)

if TYPE_CHECKING:
    from faultnet.proxy import Proxy

# ---------------------------------------------------------------------------------------
# Role: upstream server (its own process)


class _Held:
    __slots__ = ("mode", "out", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.mode: bytes | None = None
        self.out = bytearray()


def _sink(sock: socket.socket, block: bytes, digest: bool) -> None:
    """Receive until EOF, verifying; answer one JSON line, then FIN."""
    n, mismatch_at = 0, None
    buf = bytearray(len(block))
    view = memoryview(buf)
    h = hashlib.sha256() if digest else None
    t0 = None
    try:
        _set_io_timeout(sock, IO_TIMEOUT_S)
        while True:
            # MSG_WAITALL: one syscall per block, so the compare is one memcmp per block.
            k = sock.recv_into(buf, len(buf), socket.MSG_WAITALL)
            if t0 is None:
                t0 = time.perf_counter()
            if k == 0:
                break
            if h is not None:
                h.update(view[:k])
            elif mismatch_at is None:
                if k == len(block) and n % len(block) == 0:
                    ok = buf == block
                else:
                    ok = matches_block(view[:k], block, n)
                if not ok:
                    mismatch_at = n
            n += k
        report = {
            "bytes": n,
            "mismatch_at": mismatch_at,
            "sha256": h.hexdigest() if h is not None else None,
            "recv_s": time.perf_counter() - (t0 or time.perf_counter()),
        }
        sock.sendall((json.dumps(report) + "\n").encode())
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()


def _echo(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := sock.recv(65536):
            sock.sendall(data)
    except OSError:
        pass
    finally:
        sock.close()


def _upstream_main(seed: int) -> int:
    """Serve on 127.0.0.1:0. First byte of a connection: S/D bulk sink (compare/sha256),
    E echo (thread per connection, for RTT), H held echo (one epoll loop, for thousands).
    Control lines on stdin: ``stats``, ``push``; EOF on stdin ends the process."""
    raise_fd_limit()
    block = make_block(seed)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    listener.listen(4096)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    sel.register(0, selectors.EVENT_READ, "ctl")
    held: dict[int, _Held] = {}
    stats = {"bytes_in": 0, "bytes_out": 0}

    def close(h: _Held) -> None:
        held.pop(h.sock.fileno(), None)
        try:
            sel.unregister(h.sock)
        except (KeyError, ValueError):
            pass
        h.sock.close()

    def flush(h: _Held) -> None:
        while h.out:
            try:
                n = h.sock.send(h.out)
            except BlockingIOError:
                break
            stats["bytes_out"] += n
            del h.out[:n]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if h.out else 0)
        if sel.get_key(h.sock).events != events:
            sel.modify(h.sock, events, h)

    def on_held(h: _Held, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            if h.mode is None:
                mode = h.sock.recv(1)
                h.mode = mode
                if mode in (MODE_SINK, MODE_SINK_SHA, MODE_ECHO):
                    held.pop(h.sock.fileno(), None)
                    sel.unregister(h.sock)
                    h.sock.setblocking(True)
                    target: Callable[..., None]
                    args: tuple[Any, ...]
                    if mode == MODE_ECHO:
                        target, args = _echo, (h.sock,)
                    else:
                        target, args = _sink, (h.sock, block, mode == MODE_SINK_SHA)
                    threading.Thread(target=target, args=args, daemon=True).start()
                elif mode != MODE_HOLD:
                    close(h)  # EOF before a mode (a readiness probe), or unknown
                return
            data = h.sock.recv(65536)
            if not data:
                close(h)
                return
            stats["bytes_in"] += len(data)
            h.out += data
            flush(h)
        if mask & selectors.EVENT_WRITE:
            flush(h)

    def command(line: str) -> None:
        if line == "stats":
            n = sum(1 for h in held.values() if h.mode == MODE_HOLD)
            _emit({"held": n, **stats})
        elif line == "push":
            n = 0
            for h in list(held.values()):
                if h.mode == MODE_HOLD:
                    h.out += PUSH
                    try:
                        flush(h)
                    except OSError:
                        close(h)
                    n += 1
            _emit({"pushed": n})
        else:
            _emit({"error": f"unknown command {line!r}"})

    _emit({"port": listener.getsockname()[1], "pid": os.getpid()})
    ctl = b""
    running = True
    while running:
        for key, mask in sel.select(timeout=1.0):
            if key.data is None:
                for _ in range(512):
                    try:
                        sock, _addr = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # EMFILE: leave the rest in the backlog
                        break
                    sock.setblocking(False)
                    h = _Held(sock)
                    held[sock.fileno()] = h
                    sel.register(sock, selectors.EVENT_READ, h)
            elif key.data == "ctl":
                chunk = os.read(0, 4096)
                if not chunk:
                    running = False
                    break
                ctl += chunk
                while b"\n" in ctl:
                    line, _, ctl = ctl.partition(b"\n")
                    command(line.decode().strip())
            else:
                h = key.data
                try:
                    on_held(h, mask)
                except OSError:
                    close(h)
    for h in list(held.values()):
        close(h)
    listener.close()
    return 0


# ---------------------------------------------------------------------------------------
# Role: the faultnet proxy (its own process)


async def _add_toxic(proxy: Proxy, arg: str) -> int:
    """``toxic {"type": T, "name": N, "stream": S, "attributes": {...}}``: add it to the
    proxy (live connections and new ones)."""
    from faultnet.toxics import TOXICS

    spec = json.loads(arg)
    toxic = TOXICS[spec["type"]](spec["name"], spec["stream"], 1.0, **spec["attributes"])
    proxy.add_toxic(toxic)
    return len(proxy.connections())


async def _remove_toxic(proxy: Proxy, arg: str) -> int:
    """``untoxic NAME``: remove the toxic from the proxy and every connection."""
    proxy.remove_toxic(arg)
    return len(proxy.connections())


async def _hop(proxy: Proxy, arg: str) -> int:
    """``hop PERCENT``: two-way loss (the internal hop) on every connection, new ones too,
    until ``thaw`` (which takes the loss off; the hop stays on connections it carried)."""
    return await proxy.loss(float(arg), both_ways=True, include_new=True)


_TOXIC_COMMANDS: dict[str, Callable[[Proxy, str], Awaitable[int]]] = {
    "toxic": _add_toxic,
    "untoxic": _remove_toxic,
    "hop": _hop,
}


def _proxy_main(
    upstream_port: int,
    sabotage: Sequence[str],
    event_log: str | None,
    dataplane: str | None = None,
) -> int:
    """Run one faultnet Proxy to 127.0.0.1:*upstream_port*; print its address; obey
    stdin lines ``freeze`` / ``thaw`` / ``stats`` (one JSON line each). Freeze and thaw
    are timed here, around the proxy's own call. EOF on stdin closes the proxy."""
    import trio

    from faultnet.proxy import Proxy

    async def serve() -> None:
        proxy = Proxy(
            (HOST, upstream_port),
            (HOST, 0),
            name="bench",
            event_log=event_log,
            dataplane=dataplane,
        )

        def counters() -> dict[str, int]:
            infos = proxy.connections()
            return {
                "connections": len(infos),
                "bytes_upstream": sum(i.bytes_upstream for i in infos),
                "bytes_downstream": sum(i.bytes_downstream for i in infos),
                "dropped_upstream": sum(i.dropped_upstream for i in infos),
                "dropped_downstream": sum(i.dropped_downstream for i in infos),
            }

        async with trio.open_nursery() as nursery:
            address = await nursery.start(proxy.serve)
            _emit({"address": list(address), "pid": os.getpid(), "fd_limit": proxy.fd_limit})
            stdin = trio.lowlevel.FdStream(os.dup(0))
            buf = b""
            while True:
                buf = await receive_until(stdin, b"\n", buf, piece=4096)
                if b"\n" not in buf:
                    break
                raw, _, buf = buf.partition(b"\n")
                cmd = raw.decode().strip()
                if cmd in ("freeze", "thaw"):
                    t0 = time.perf_counter()
                    if cmd == "freeze" and "freeze" in sabotage:
                        n = len(proxy.connections())  # sabotaged: claims, does nothing
                    elif cmd == "freeze":
                        n = await proxy.freeze()
                    else:
                        n = await proxy.thaw()
                    elapsed_ms = (time.perf_counter() - t0) * 1000
                    _emit({"elapsed_ms": elapsed_ms, "affected": n, **counters()})
                elif cmd.startswith("loss "):
                    # ``loss PERCENT PEER``: the client at PEER (host:port) loses this
                    # percent each way ("loss" sabotaged: claims it, does nothing).
                    _, percent, peer = cmd.split()
                    n = await proxy.loss(float(percent), peer=peer)
                    if "loss" in sabotage:
                        await proxy.thaw(peer=peer)
                    _emit({"affected": n, **counters()})
                elif cmd.split(" ", 1)[0] in _TOXIC_COMMANDS:
                    # The toxic lines' commands (toxic JSON, untoxic NAME, hop PERCENT).
                    verb, _, arg = cmd.partition(" ")
                    n = await _TOXIC_COMMANDS[verb](proxy, arg)
                    _emit({"affected": n, **counters()})
                elif cmd == "stats":
                    _emit(counters())
                elif cmd == "quit":
                    break
                else:
                    _emit({"error": f"unknown command {cmd!r}"})
            await stdin.aclose()
            await proxy.aclose()

    trio.run(serve)
    return 0


# ---------------------------------------------------------------------------------------
# Roles: a UDP echo, and one faultnet UDP proxy in front of it


def _udp_echo_main() -> int:
    """Echo every datagram on 127.0.0.1:0 to its sender; print the port; EOF on stdin
    ends the process."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((HOST, 0))

    def echo() -> None:
        while True:
            try:
                data, peer = sock.recvfrom(65536)
                sock.sendto(data, peer)
            except OSError:  # closed at exit, or an ICMP error from a gone sender
                if sock.fileno() < 0:
                    return

    threading.Thread(target=echo, daemon=True).start()
    _emit({"port": sock.getsockname()[1], "pid": os.getpid()})
    while os.read(0, 4096):
        pass
    sock.close()
    return 0


def _udp_proxy_main(upstream_port: int) -> int:
    """Run one faultnet UdpProxy to 127.0.0.1:*upstream_port*; print its address; EOF on
    stdin closes it."""
    import trio

    from faultnet.udp import open_udp_proxy

    async def serve() -> None:
        async with open_udp_proxy((HOST, upstream_port), name="bench-udp") as proxy:
            _emit({"address": list(proxy.address), "pid": os.getpid()})
            stdin = trio.lowlevel.FdStream(os.dup(0))
            while await stdin.receive_some(4096):
                pass
            await stdin.aclose()

    trio.run(serve)
    return 0
