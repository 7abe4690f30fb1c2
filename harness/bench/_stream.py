"""What every part of the benchmark shares: the wire between the load generator and
the upstream (service bytes, the bulk stream's block), sizes, targets, bounds, presets."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import struct
import sys
from typing import Any

from faultnet.errors import UsageError

SCHEMA = "faultnet.bench/1"
HOST = "127.0.0.1"
#: The bulk stream is this block repeated. Odd-sized so that no 2^k chunking (splice uses
#: 256 KiB) lines up with it: a dropped or repeated chunk shifts the content and is seen.
BLOCK_LEN = (1 << 20) + 13
PING_LEN = 64
#: First byte of every upstream connection picks its service.
MODE_SINK, MODE_SINK_SHA, MODE_ECHO, MODE_HOLD = b"S", b"D", b"E", b"H"
HOLD_PING = bytes(range(PING_LEN))
PUSH = b"P" * PING_LEN  # sent down every held connection while frozen
UP = b"Q" * PING_LEN  # sent up every held connection while frozen
SOCAT_BUFFER = 262144
GIB = 1 << 30
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: Targets (issue 2, item 6; issue 14, item 5; issue 22's list, the newest, where they
#: differ). Reported with MET/MISSED; never asserted by tests.
TARGET_TPUT_VS_SOCAT = 1.0
TARGET_TPUT_VS_DIRECT = 0.6
TARGET_RTT_ADDED_VS_SOCAT = 0.9
#: Proxy user-space instructions per 64-byte round trip, under callgrind (issue 22).
TARGET_INSTR_VS_SOCAT = 0.35
TARGET_CONNECTIONS = 5000
TARGET_FREEZE_MS = 50.0
TARGET_REQRESP_VS_SOCAT = 1.1
TARGET_CHURN_VS_SOCAT = 1.2
TARGET_FROZEN_CPU_PCT = 5.0

#: Bounds: every wait in this module ends.
CHILD_START_S = 20.0
COMMAND_S = 60.0
IO_TIMEOUT_S = 60.0  # SO_RCVTIMEO/SO_SNDTIMEO on bulk and ping sockets
BATCH = 250  # connections opened per batch
BATCH_S = 15.0  # a batch not verified in this long ends the ramp
RAMP_S = 300.0  # the whole ramp
THAW_DELIVERY_S = 30.0

PRESETS: dict[str, dict[str, Any]] = {
    "default": {
        "bytes": GIB,
        "pings": 20000,
        "connections": TARGET_CONNECTIONS,
        "rounds": 3,
        "freeze_window": 0.5,
        "requests": 100000,
        "churn": 3000,
        # Per transfer of the loss line (at 5 % loss, ~134 MB/s measured: ~2 s).
        "loss_bytes": 256 << 20,
        "datagrams": 50000,
        # Round trips counted under callgrind (each arm ~50x slower there: ~10 s).
        "callgrind": 2000,
        # Per bulk transfer of the toxic lines (bandwidth's 50 MB/s: ~1.3 s a round).
        "toxic_bytes": 64 << 20,
    },
    # Under a minute on 2 vCPUs (measured ~10 s).
    "quick": {
        "bytes": 256 << 20,
        "pings": 3000,
        "connections": 500,
        "rounds": 3,
        "freeze_window": 0.2,
        "requests": 20000,
        "churn": 500,
        "loss_bytes": 64 << 20,
        "datagrams": 10000,
        "callgrind": 500,
        "toxic_bytes": 16 << 20,
    },
}


def parse_size(text: str) -> int:
    """``1G``, ``256M``, ``64K``, ``1000`` -> bytes (binary multiples). Raises UsageError."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"not a size: {text!r} (use e.g. 1G, 256M, 4096)") from None
    n = int(value * mult)
    if n < 1:
        raise UsageError(f"size must be at least 1 byte: {text!r}")
    return n


def human_size(n: int) -> str:
    """1073741824 -> '1 GiB', 8388608 -> '8 MiB', 1000 -> '1000 B'."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{n} B"


def make_block(seed: int) -> bytes:
    """The bulk stream's repeating block: BLOCK_LEN random bytes from *seed*."""
    return random.Random(seed).randbytes(BLOCK_LEN)


def stream_sha256(block: bytes, total: int) -> str:
    """SHA-256 of the first *total* bytes of *block* repeated."""
    h = hashlib.sha256()
    full, tail = divmod(total, len(block))
    for _ in range(full):
        h.update(block)
    h.update(block[:tail])
    return h.hexdigest()


def matches_block(data: memoryview | bytes, block: bytes, offset: int) -> bool:
    """True if *data* equals the repeated *block* starting at stream *offset*."""
    n = len(block)
    pos, off = 0, offset % n
    while pos < len(data):
        take = min(len(data) - pos, n - off)
        if bytes(data[pos : pos + take]) != block[off : off + take]:
            return False
        pos += take
        off = 0
    return True


def _set_io_timeout(sock: socket.socket, seconds: float) -> None:
    # Kernel timeouts keep the socket in plain blocking mode: Python's own timeout would
    # add a poll() before every recv, which shows in a 30 us RTT.
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
