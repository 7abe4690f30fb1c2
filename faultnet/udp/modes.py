"""The UDP proxy's fault modes, declared once: the README's UDP table, the server's UDP
fault dispatch and validation, and the UDP control test's real arms come from
:data:`UDP_MODES` (tests/faultnet/udp/test_udp_modes.py goes red when one disagrees).

Every mode is a :class:`~faultnet.udp.UdpProxy` method of the same name, taking
``stream`` ("both", "upstream", "downstream") and the keyword arguments its row lists;
``thaw`` and ``clear`` undo them. The rows have the TCP table's shape
(:class:`faultnet.modes.Mode`).
"""

from __future__ import annotations

from typing import Any

from faultnet.modes import Mode

__all__ = ["UDP_MODES", "udp_markdown_table"]


def _udp(name: str, undone_by: str | None, **fields: Any) -> Mode:
    """A row of the one mode shape (faultnet.modes.Mode) for the UDP proxy: every one
    takes ``stream``; an undo has no ``undone_by``."""
    acts_on = "datagrams" if undone_by is not None else "undo"
    return Mode(name, acts_on, undone_by=undone_by, takes_stream=True, protocol="udp", **fields)


UDP_MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        _udp(
            "freeze",
            "thaw",
            effect="held (up to hold_limit per session and direction)",
            summary="requests unanswered; on thaw every held datagram arrives, in order",
            control="assert_udp_held",
        ),
        _udp(
            "blackhole",
            "thaw",
            effect="dropped, and any a freeze held",
            summary="silence, as from a dead route; nothing comes back after thaw",
            control="assert_udp_silent",
        ),
        _udp(
            "loss",
            "clear",
            params=("percent",),
            required=("percent",),
            effect="that share dropped, chosen by the seed (replayable)",
            summary="some requests or answers never arrive",
            control="assert_udp_lossy",
        ),
        _udp(
            "latency",
            "clear",
            params=("latency_ms", "jitter_ms"),
            required=("latency_ms",),
            effect="delayed by latency ± jitter, order kept",
            summary="answers late",
            control="assert_udp_delayed",
        ),
        _udp(
            "duplicate",
            "clear",
            params=("percent",),
            required=("percent",),
            effect="that share sent twice",
            summary="some datagrams arrive twice",
            control="assert_udp_duplicated",
        ),
        _udp(
            "reorder",
            "clear",
            params=("percent", "gap_ms"),
            required=("percent",),
            effect="that share held back until after the next one (at most gap_ms)",
            summary="datagrams arrive out of order",
            control="assert_udp_reordered",
        ),
        _udp(
            "size_limit",
            "clear",
            params=("limit", "action"),
            required=("limit",),
            effect="payloads over limit bytes truncated (action truncate) or dropped (drop)",
            summary="long datagrams arrive cut short, or not at all",
            control="assert_udp_truncated",
        ),
        _udp(
            "thaw",
            None,
            undoes=("freeze", "blackhole"),
            summary="held datagrams released in order; freeze/blackhole end",
        ),
        _udp(
            "clear",
            None,
            undoes=("loss", "latency", "duplicate", "reorder", "size_limit"),
            summary="loss, latency, duplicate, reorder and size limit end",
        ),
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
