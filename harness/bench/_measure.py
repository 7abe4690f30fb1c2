"""Measurements, on the load generator's side: bulk throughput, ping-pong RTT, holding
and verifying many connections, and watching frozen ones for silence."""

from __future__ import annotations

import errno
import json
import os
import selectors
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from faultnet.sockopts import tcp_retransmits, tcp_retransmits_needed
from faultnet.testing import recv_until
from harness.bench._stream import (
    BATCH,
    BATCH_S,
    HOLD_PING,
    IO_TIMEOUT_S,
    MODE_ECHO,
    MODE_HOLD,
    MODE_SINK,
    MODE_SINK_SHA,
    PING_LEN,
    RAMP_S,
    _set_io_timeout,
)

# ---------------------------------------------------------------------------------------
# Measurements (load generator side)


def bulk_once(
    addr: tuple[str, int],
    block: bytes,
    total: int,
    verify: str,
    expected_sha: str | None,
    corrupt: bool = False,
    on_connected: Callable[[socket.socket], None] | None = None,
) -> dict[str, Any]:
    """Send *total* bytes of the repeated block; return timing and the receiver's verdict
    (a transfer that fails is returned as not verified, with why), and the segments the
    sender's own TCP retransmitted: all of them, and those the receiver lacked. *on_connected(sock)* runs once the connection is open,
    before the first byte (the loss line applies its loss there)."""
    t0 = time.perf_counter()
    try:
        return _bulk(addr, block, total, verify, expected_sha, corrupt, on_connected)
    except OSError as exc:
        return {"bytes": None, "seconds": time.perf_counter() - t0, "mbps": None,
                "verified": False, "why": f"transfer failed: {exc}"}  # fmt: skip


def _bulk(
    addr: tuple[str, int],
    block: bytes,
    total: int,
    verify: str,
    expected_sha: str | None,
    corrupt: bool,
    on_connected: Callable[[socket.socket], None] | None = None,
) -> dict[str, Any]:
    s = socket.create_connection(addr, timeout=IO_TIMEOUT_S)
    s.settimeout(None)
    _set_io_timeout(s, IO_TIMEOUT_S)
    try:
        s.sendall(MODE_SINK_SHA if verify == "sha256" else MODE_SINK)
        if on_connected is not None:
            on_connected(s)
        full, tail = divmod(total, len(block))
        bad = bytearray(block)
        bad[min(total, len(block)) // 2] ^= 0xFF  # --sabotage corrupt: one byte flipped
        t0 = time.perf_counter()
        for i in range(full):
            s.sendall(bad if corrupt and i == full // 2 else block)
        if tail:
            s.sendall(bad[:tail] if corrupt and full == 0 else block[:tail])
        s.shutdown(socket.SHUT_WR)
        reply = recv_until(s, b"\n", piece=4096)
        elapsed = time.perf_counter() - t0
        retransmits = tcp_retransmits(s)
        needed = tcp_retransmits_needed(s)
    finally:
        s.close()
    try:
        report = json.loads(reply)
    except ValueError:
        return {"bytes": None, "seconds": elapsed, "mbps": None, "verified": False,
                "why": f"no report from the receiver (got {reply[:80]!r})"}  # fmt: skip
    why = _verdict(report, total, verify, expected_sha)
    return {
        "bytes": report["bytes"],
        "seconds": elapsed,
        "mbps": total / elapsed / 1e6,
        "verified": why is None,
        "why": why,
        "receiver_s": report["recv_s"],
        "retransmits": retransmits,
        "retransmits_needed": needed,
    }


def _verdict(
    report: dict[str, Any], total: int, verify: str, expected_sha: str | None
) -> str | None:
    """Why the receiver's *report* says the transfer was wrong, or None."""
    if report["bytes"] != total:
        return f"receiver got {report['bytes']} bytes, sent {total}"
    if verify == "sha256" and report["sha256"] != expected_sha:
        return "sha256 differs from the sender's"
    if verify == "compare" and report["mismatch_at"] is not None:
        return f"content differs near byte {report['mismatch_at']}"
    return None


def pingpong(addr: tuple[str, int], count: int, warmup: int) -> list[int]:
    """RTT samples in ns: *count* 64-byte round trips after *warmup* untimed ones."""
    s = socket.create_connection(addr, timeout=IO_TIMEOUT_S)
    s.settimeout(None)
    _set_io_timeout(s, IO_TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = os.urandom(PING_LEN)
    buf = bytearray(PING_LEN)
    view = memoryview(buf)
    samples: list[int] = []
    clock = time.perf_counter_ns
    try:
        s.sendall(MODE_ECHO)
        for i in range(warmup + count):
            t0 = clock()
            s.sendall(msg)
            got = 0
            while got < PING_LEN:
                k = s.recv_into(view[got:])
                if not k:
                    raise ConnectionError("echo closed the connection")
                got += k
            t1 = clock()
            if buf != msg:
                raise ConnectionError("echo returned different bytes")
            if i >= warmup:
                samples.append(t1 - t0)
    finally:
        s.close()
    return samples


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None if there are none)."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return float(sorted_values[k])


def _us(ns: float | None) -> float | None:
    return None if ns is None else ns / 1000


def open_held(
    addr: tuple[str, int], n: int, batch: int = BATCH, budget_s: float = RAMP_S
) -> tuple[list[socket.socket], dict[str, Any]]:
    """Open up to *n* connections in batches, each verified by one 64-byte echo.

    Stops at the first failure (connect error, descriptor limit, a batch not verified
    within BATCH_S) and says why in ``stopped_by``. Returns the verified sockets.
    """
    held: list[socket.socket] = []
    stop: str | None = None
    t0 = time.perf_counter()
    with selectors.DefaultSelector() as sel:
        while len(held) < n and stop is None:
            if time.perf_counter() - t0 > budget_s:
                stop = f"ramp took over {budget_s:g} s"
                break
            pending: dict[int, tuple[socket.socket, bytearray | None]] = {}
            for _ in range(min(batch, n - len(held))):
                try:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                except OSError as exc:
                    stop = f"client socket(): {exc.strerror}"
                    break
                s.setblocking(False)
                err = s.connect_ex(addr)
                if err not in (0, errno.EINPROGRESS):
                    s.close()
                    stop = f"connect: {os.strerror(err)}"
                    break
                pending[s.fileno()] = (s, None)
                sel.register(s, selectors.EVENT_WRITE)
            stop = _verify_batch(sel, pending, held) or stop
    return held, {
        "requested": n,
        "held": len(held),
        "stopped_by": stop,
        "open_s": round(time.perf_counter() - t0, 3),
    }


def _verify_batch(
    sel: selectors.BaseSelector,
    pending: dict[int, tuple[socket.socket, bytearray | None]],
    held: list[socket.socket],
) -> str | None:
    """Finish the connects in *pending*, one echo each; move the good ones to *held*.
    Returns why one failed (the first reason), or None."""
    stop: str | None = None

    def fail(fd: int, why: str) -> None:
        nonlocal stop
        s = pending.pop(fd)[0]
        sel.unregister(s)
        s.close()
        stop = stop or why

    deadline = time.perf_counter() + BATCH_S
    while pending:
        left = deadline - time.perf_counter()
        if left <= 0:
            why = f"{len(pending)} connections not verified within {BATCH_S:g} s"
            for fd in list(pending):
                fail(fd, why)
            break
        for key, _mask in sel.select(left):
            fd = key.fd
            if fd not in pending:
                continue
            s, got = pending[fd]
            try:
                if got is None:
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(fd, f"connect: {os.strerror(err)}")
                        continue
                    s.send(MODE_HOLD + HOLD_PING)  # 65 bytes: fits an empty send buffer
                    pending[fd] = (s, bytearray())
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                data = s.recv(256)
            except OSError as exc:
                fail(fd, f"connection failed: {exc.strerror or exc}")
                continue
            if not data:
                fail(fd, "closed before its echo")
                continue
            got += data
            if len(got) >= PING_LEN:
                if bytes(got) != HOLD_PING:
                    fail(fd, "wrong echo")
                    continue
                sel.unregister(s)
                del pending[fd]
                held.append(s)
    return stop


def watch_silence(socks: Sequence[socket.socket], window: float) -> int:
    """How many of *socks* turned readable (data, EOF or error) within *window* s."""
    noisy = 0
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.perf_counter() + window
        while (left := deadline - time.perf_counter()) > 0:
            for key, _mask in sel.select(left):
                noisy += 1
                sel.unregister(key.fileobj)
    return noisy


def collect(socks: Sequence[socket.socket], expect: bytes, timeout: float) -> dict[str, Any]:
    """Read len(*expect*) bytes from each socket (bounded); count right, wrong, missing."""
    bufs: dict[int, bytearray] = {s.fileno(): bytearray() for s in socks}
    right = wrong = 0
    sample: bytes | None = None
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.perf_counter() + timeout
        while bufs and (left := deadline - time.perf_counter()) > 0:
            for key, _mask in sel.select(left):
                buf = bufs[key.fd]
                try:
                    data = key.fileobj.recv(len(expect) - len(buf))  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError as exc:
                    data = b""
                    sample = sample or f"<{errno.errorcode.get(exc.errno or 0, exc)}>".encode()
                done = not data
                buf += data
                if len(buf) >= len(expect):
                    done = True
                if done:
                    if bytes(buf) == expect:
                        right += 1
                    else:
                        wrong += 1
                        sample = sample or bytes(buf)
                    del bufs[key.fd]
                    sel.unregister(key.fileobj)
    out: dict[str, Any] = {"right": right, "wrong": wrong, "missing": len(bufs)}
    if sample is not None:
        out["first_wrong"] = sample.decode("latin-1")
    return out


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()
    socks.clear()
