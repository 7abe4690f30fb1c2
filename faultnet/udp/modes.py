"""The UDP proxy's fault modes, declared once: the README's UDP table, the server's UDP
fault dispatch and validation, and the UDP control test's real arms come from
:data:`UDP_MODES` (tests/faultnet/udp/test_udp_modes.py goes red when one disagrees).

Every mode is a :class:`~faultnet.udp.UdpProxy` method of the same name, taking
``stream`` ("both", "upstream", "downstream") and the keyword arguments its row lists;
``thaw`` and ``clear`` undo them. This module imports nothing else from faultnet.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UDP_MODES", "UdpMode", "udp_markdown_table"]


@dataclass(frozen=True)
class UdpMode:
    name: str
    #: The undo that ends it ("thaw" or "clear"); None for the undos themselves.
    undone_by: str | None
    #: Its arguments besides ``stream``: the required ones first, as the method names them.
    params: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    #: What it does to datagrams, and what a client sees.
    effect: str = ""
    summary: str = ""
    #: The function in :mod:`faultnet.udp.controls` that proves it is in force.
    control: str | None = None


UDP_MODES: dict[str, UdpMode] = {
    m.name: m
    for m in (
        UdpMode(
            "freeze",
            "thaw",
            effect="held (up to hold_limit per session and direction)",
            summary="requests unanswered; on thaw every held datagram arrives, in order",
            control="assert_udp_held",
        ),
        UdpMode(
            "blackhole",
            "thaw",
            effect="dropped, and any a freeze held",
            summary="silence, as from a dead route; nothing comes back after thaw",
            control="assert_udp_silent",
        ),
        UdpMode(
            "loss",
            "clear",
            params=("percent",),
            required=("percent",),
            effect="that share dropped, chosen by the seed (replayable)",
            summary="some requests or answers never arrive",
            control="assert_udp_lossy",
        ),
        UdpMode(
            "latency",
            "clear",
            params=("latency_ms", "jitter_ms"),
            required=("latency_ms",),
            effect="delayed by latency ± jitter, order kept",
            summary="answers late",
            control="assert_udp_delayed",
        ),
        UdpMode(
            "duplicate",
            "clear",
            params=("percent",),
            required=("percent",),
            effect="that share sent twice",
            summary="some datagrams arrive twice",
            control="assert_udp_duplicated",
        ),
        UdpMode(
            "reorder",
            "clear",
            params=("percent", "gap_ms"),
            required=("percent",),
            effect="that share held back until after the next one (at most gap_ms)",
            summary="datagrams arrive out of order",
            control="assert_udp_reordered",
        ),
        UdpMode(
            "size_limit",
            "clear",
            params=("limit", "action"),
            required=("limit",),
            effect="payloads over limit bytes truncated (action truncate) or dropped (drop)",
            summary="long datagrams arrive cut short, or not at all",
            control="assert_udp_truncated",
        ),
        UdpMode("thaw", None, summary="held datagrams released in order; freeze/blackhole end"),
        UdpMode("clear", None, summary="loss, latency, duplicate, reorder and size limit end"),
    )
}


def udp_markdown_table() -> str:
    """The README's UDP mode table (undos have no row)."""
    rows = ["| mode | datagrams | what a client sees |", "|---|---|---|"]
    for m in UDP_MODES.values():
        if m.undone_by is None:
            continue
        args = ", ".join((*m.params, "stream="))
        rows.append(f"| `{m.name}({args})` / `{m.undone_by}` | {m.effect} | {m.summary} |")
    return "\n".join(rows)
