"""Classic BPF socket filters the fault modes attach (``SO_ATTACH_FILTER``, unprivileged).

A filter on a TCP socket sees every segment the kernel is about to deliver to it, with
the packet's data starting at the TCP header (offset 0 is the source port) and the IP
header reachable at ``SKF_NET_OFF``. Returning 0 drops the segment: its sender's TCP
sees loss and retransmits (measured: the dropped count in ``SO_MEMINFO`` equalled the
sender's ``tcpi_total_retrans``, 47 and 47 for 64 MiB at 5 %). On a listener the
segments are SYNs (and handshake ACKs), so dropping one makes a connect wait for the
kernel's SYN retry (1 s, then 3 s, 7 s ... after the first send).

The programs, all built here and nowhere else:

* :func:`drop_all` -- every segment (blackhole, drop_syn);
* :func:`pure_acks_only` -- every segment but a bare ACK (no payload, no SYN, FIN or
  RST): a blackhole's first filter, until the client has acknowledged what the proxy's
  kernel had already sent it (see ``Proxy.blackhole``);
* :func:`drop_fraction` -- each segment independently with probability *fraction*, from
  the kernel's random (``ld rand``, SKF_AD_RANDOM; it cannot be seeded, so what happened
  is measured, not assumed);
* :func:`drop_bare_fraction` -- each bare segment (a keepalive or window probe, a bare
  ACK) with probability *fraction*, every other segment kept: two-way loss's client leg;
* :func:`listener_program` -- the listener's: peers whose SYNs are dropped (partition),
  then a random fraction (syn_loss), or everything (drop_syn).

A socket has one filter: attaching replaces the previous one (:func:`attach`),
:func:`faultnet.sockopts.detach_filter` removes it.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Program",
    "attach",
    "drop_all",
    "drop_bare_fraction",
    "drop_fraction",
    "listener_program",
    "pure_acks_only",
]

SO_ATTACH_FILTER = 26
# Opcodes (linux/filter.h): load word/half-word absolute, jump if equal/greater-or-equal
# to a constant, return a constant.
_LD_W_ABS, _LD_H_ABS, _LD_B_ABS, _LD_W_LEN = 0x20, 0x28, 0x30, 0x80
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45
_RET_K = 0x06
# ALU on A: and, right shift by a constant; subtract X; and copy A to X.
_AND_K, _RSH_K, _SUB_X, _TAX = 0x54, 0x74, 0x1C, 0x07
# TCP header: the data offset (high nibble of byte 12, in 32-bit words) and the flags
# byte (13): FIN 0x01, SYN 0x02, RST 0x04.
_TCP_DOFF, _TCP_FLAGS, _FIN_SYN_RST = 12, 13, 0x07
_SKF_AD_OFF, _SKF_AD_RANDOM = -0x1000, 56
_SKF_NET_OFF = -0x100000
_ACCEPT, _DROP = 0xFFFFFFFF, 0
# Offsets of the source address in the IPv4 and IPv6 headers.
_SRC_V4, _SRC_V6 = 12, 8

Instruction = tuple[int, int, int, int]  # code, jt, jf, k


@dataclass(frozen=True)
class Program:
    """A classic BPF program; ``what`` says what it drops (for logs and errors)."""

    instructions: tuple[Instruction, ...]
    what: str

    def packed(self) -> bytes:
        return b"".join(
            struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)
            for code, jt, jf, k in self.instructions
        )


class _Sock(Protocol):
    def setsockopt(self, level: int, opt: int, value: int | bytes, /) -> None: ...


def attach(sock: _Sock, program: Program) -> None:
    """Attach *program* to *sock* (replacing any filter); it acts on the next segment."""
    code = program.packed()
    buf = ctypes.create_string_buffer(code, len(code))
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; } (padded to
    # 16); the kernel copies the program during the call, so buf may go afterwards.
    fprog = struct.pack("HxxxxxxQ", len(program.instructions), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def drop_all() -> Program:
    return Program(((_RET_K, 0, 0, _DROP),), "every segment")


def pure_acks_only() -> Program:
    """Drop every segment that carries a payload or a SYN, FIN or RST; let bare ACKs in.

    The proxy's kernel then still learns what the client has received (so it has
    nothing left to retransmit to it) while no byte, close or reset of the client's
    gets in. A bare ACK is also what a keepalive or window probe is: one that arrives
    under this filter is answered, so it is meant for the moment it takes the client's
    (delayed) ACK to arrive, not longer."""
    return Program(
        (
            *_bare_or_jump(1),  # a payload, a SYN, FIN or RST: drop
            (_RET_K, 0, 0, _ACCEPT),
            (_RET_K, 0, 0, _DROP),
        ),
        "every segment but bare ACKs",
    )


def _bare_or_jump(skip: int) -> list[Instruction]:
    """Fall through on a bare segment (no payload, no SYN, FIN or RST); else jump over
    the next *skip* instructions."""
    return [
        # X = the TCP header's length in bytes: (byte 12 & 0xf0) >> 2.
        (_LD_B_ABS, 0, 0, _TCP_DOFF),
        (_AND_K, 0, 0, 0xF0),
        (_RSH_K, 0, 0, 2),
        (_TAX, 0, 0, 0),
        # A = the segment's length (from the TCP header on) less the header: payload.
        (_LD_W_LEN, 0, 0, 0),
        (_SUB_X, 0, 0, 0),
        (_JEQ_K, 0, skip + 2, 0),  # a payload
        (_LD_B_ABS, 0, 0, _TCP_FLAGS),
        (_JSET_K, skip, 0, _FIN_SYN_RST),  # SYN, FIN or RST
    ]


def _random_tail(fraction: float) -> list[Instruction]:
    """Drop with probability *fraction*, else accept (ends the program)."""
    if fraction <= 0:
        return [(_RET_K, 0, 0, _ACCEPT)]
    if fraction >= 1:
        return [(_RET_K, 0, 0, _DROP)]
    threshold = int(fraction * 2**32)
    return [
        (_LD_W_ABS, 0, 0, _SKF_AD_OFF + _SKF_AD_RANDOM),  # A = a kernel random u32
        (_JGE_K, 0, 1, threshold),  # A >= threshold: accept, else drop
        (_RET_K, 0, 0, _ACCEPT),
        (_RET_K, 0, 0, _DROP),
    ]


def drop_fraction(fraction: float) -> Program:
    """Drop each segment independently with probability *fraction* (0 to 1)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be between 0 and 1, not {fraction}")
    return Program(tuple(_random_tail(fraction)), f"{fraction * 100:g} % of segments")


def drop_bare_fraction(fraction: float) -> Program:
    """Drop each bare segment (no payload, no SYN, FIN or RST: a keepalive or window
    probe, a bare ACK) independently with probability *fraction* (0 to 1); keep the
    rest. On a client-facing socket under two-way loss (see
    faultnet/proxy/_faultstate.py) it is what loses a client's probes."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be above 0 and at most 1, not {fraction}")
    tail = _random_tail(fraction)
    return Program(
        (*_bare_or_jump(len(tail)), *tail, (_RET_K, 0, 0, _ACCEPT)),
        f"{fraction * 100:g} % of bare segments",
    )


def _peer_rule(host: str, port: int | None) -> list[Instruction]:
    """Drop a segment whose source is *host* (and *port*, if given); else fall through."""
    addr = ipaddress.ip_address(host)
    words = struct.unpack(f"!{len(addr.packed) // 4}I", addr.packed)
    base = _SRC_V4 if addr.version == 4 else _SRC_V6
    conditions = [(_LD_W_ABS, _SKF_NET_OFF + base + 4 * i, w) for i, w in enumerate(words)]
    if port is not None:
        conditions.append((_LD_H_ABS, 0, port))  # the TCP source port
    out: list[Instruction] = []
    for i, (load, offset, value) in enumerate(conditions):
        remaining = 2 * (len(conditions) - 1 - i)  # instructions left before the drop
        out += [(load, 0, 0, offset), (_JEQ_K, 0, remaining + 1, value)]
    out.append((_RET_K, 0, 0, _DROP))
    return out


def listener_program(
    *,
    drop_everything: bool = False,
    syn_loss: float = 0.0,
    peers: Iterable[tuple[str, int | None]] = (),
) -> Program | None:
    """The listener's filter: SYNs from *peers* dropped, then a *syn_loss* fraction of
    the rest; or every SYN with *drop_everything*. None when nothing is dropped."""
    if drop_everything:
        return drop_all()
    rules: Sequence[tuple[str, int | None]] = sorted(set(peers), key=str)
    if not rules and syn_loss <= 0:
        return None
    code: list[Instruction] = []
    for host, port in rules:
        code += _peer_rule(host, port)
    code += _random_tail(syn_loss)
    parts = [f"SYNs from {', '.join(h if p is None else f'{h}:{p}' for h, p in rules)}"] * bool(
        rules
    )
    if syn_loss > 0:
        parts.append(f"{syn_loss * 100:g} % of SYNs")
    return Program(tuple(code), " and ".join(parts))
