"""The UDP proxy's fault modes, declared once: the README's UDP table, the server's UDP
fault dispatch and validation, and the UDP control test's real arms come from
:data:`UDP_MODES` (tests/faultnet/udp/test_udp_modes.py goes red when one disagrees).

Every mode is a :class:`~faultnet.udp.UdpProxy` method of the same name, taking
``stream`` ("both", "upstream", "downstream") and the keyword arguments its row lists;
``thaw`` and ``clear`` undo them. The rows have the TCP table's shape
(:class:`faultnet.modes.Mode`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from faultnet import modes as tcp_modes
from faultnet.modes import TCP, Argument, Mode, ModeTable
from faultnet.udp.impairments import SIZE_ACTIONS

__all__ = ["UDP", "UDP_MODES", "UDP_ONLY_ARGUMENTS", "udp_markdown_table"]

# The arguments, each named in its messages by the impairment attribute it sets (the
# messages are the impairment's own: faultnet.udp.impairments.Impairment checks the
# same again for a direct call of UdpProxy.impair).
# The TCP table's stream argument, said as a direction.
STREAM = replace(
    tcp_modes.STREAM,
    protocol="udp",
    wrong_type="stream must be one of {choices}, not {value!r}",
    doc="the direction it acts on",
)
_NUMBER = "{label} must be a number, not {value!r}"
_NOT_NEGATIVE = "{label} must not be negative, not {value}"


def _percent(attribute: str) -> Argument:
    return Argument(
        "percent",
        "number",
        "udp",
        minimum=0,
        maximum=100,
        required=True,
        label=attribute,
        wrong_type=_NUMBER,
        out_of_range="{label} must be a percentage 0-100, not {value}",
        doc="the share of datagrams (0-100)",
    )


def _ms(name: str, label: str = "", **fields: Any) -> Argument:
    return Argument(
        name,
        "number",
        "udp",
        minimum=0,
        label=label,
        wrong_type=_NUMBER,
        out_of_range=_NOT_NEGATIVE,
        **fields,
    )


LIMIT = Argument(
    "limit",
    "whole",
    "udp",
    minimum=0,
    required=True,
    label="size_limit",
    wrong_type="{label} must be a whole number of bytes, not {value!r}",
    out_of_range=_NOT_NEGATIVE,
    doc="bytes of UDP payload",
)
ACTION = Argument(
    "action",
    "choice",
    "udp",
    default="truncate",
    choices=SIZE_ACTIONS,
    label="size_action",
    wrong_type="{label} must be one of {choices}, not {value!r}",
    doc="what is done to a longer payload",
)

# The DNS row's arguments (faultnet.protocols.dns.DnsRule checks them again for a direct
# UdpProxy.dns call; its ACTIONS and QTYPES are these choices, kept in sync by hand so that
# the CLI's parser does not import dnspython: tests/faultnet/udp/test_udp_dns_faults.py
# compares them).
DNS_ACTIONS = ("servfail", "nxdomain", "refused", "drop", "delay", "truncate", "rewrite")
DNS_QTYPES = ("any", "A", "AAAA", "CNAME", "MX", "TXT", "NS", "SOA", "PTR", "SRV", "SVCB", "HTTPS")
DNS_ARGUMENTS = (
    Argument(
        "action",
        "choice",
        "udp",
        required=True,
        choices=DNS_ACTIONS,
        wrong_type="action must be one of {choices}, not {value!r}",
        doc="what is done to a matching query",
    ),
    Argument(
        "qname",
        "text",
        "udp",
        default="*",
        wrong_type="qname must be a glob of query names, not {type}",
        doc="a glob on the query name, any case, trailing dot or not (default *)",
    ),
    Argument(
        "qtype",
        "choice",
        "udp",
        default="any",
        choices=DNS_QTYPES,
        wrong_type="qtype must be one of {choices}, not {value!r}",
        doc="the query type matched (default any)",
    ),
    Argument(
        "percent",
        "number",
        "udp",
        default=100.0,
        minimum=0,
        maximum=100,
        wrong_type=_NUMBER,
        out_of_range="{label} must be a percentage 0-100, not {value}",
        doc="the share of matching queries faulted, drawn from the seed, name, type and id",
    ),
    Argument(
        "count",
        "whole",
        "udp",
        default=0,
        minimum=0,
        wrong_type="{label} must be a whole number, not {value!r}",
        out_of_range=_NOT_NEGATIVE,
        doc="fault only the first this many matching queries (0: no limit)",
    ),
    _ms("delay_ms", default=0.0, doc="action delay: forwarded this late, ms"),
    Argument(
        "address",
        "text",
        "udp",
        default="",
        wrong_type="address must be an IP address, not {type}",
        doc="action rewrite: the address A (or AAAA) answers become",
    ),
)


def _udp(
    name: str,
    undone_by: str | None,
    arguments: tuple[Argument, ...] = (),
    stream: Argument = STREAM,
    **fields: Any,
) -> Mode:
    """A row of the one mode shape (faultnet.modes.Mode) for the UDP proxy: every one
    takes ``stream``; an undo has no ``undone_by``."""
    acts_on: Literal["datagrams", "undo"] = "datagrams" if undone_by is not None else "undo"
    return Mode(
        name,
        acts_on,
        arguments=(stream, *arguments),
        undone_by=undone_by,
        protocol="udp",
        **fields,
    )


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
            (_percent("loss"),),
            effect="that share dropped, chosen by the seed (replayable)",
            summary="some requests or answers never arrive",
            control="assert_udp_lossy",
        ),
        _udp(
            "latency",
            "clear",
            (
                _ms("latency_ms", required=True, doc="the delay, ms"),
                _ms("jitter_ms", default=0.0, doc="up to this much more or less, ms"),
            ),
            effect="delayed by latency ± jitter, order kept",
            summary="answers late",
            control="assert_udp_delayed",
        ),
        _udp(
            "duplicate",
            "clear",
            (_percent("duplicate"),),
            effect="that share sent twice",
            summary="some datagrams arrive twice",
            control="assert_udp_duplicated",
        ),
        _udp(
            "reorder",
            "clear",
            (
                _percent("reorder"),
                _ms("gap_ms", "reorder_gap_ms", default=100.0, doc="held at most this long, ms"),
            ),
            effect="that share held back until after the next one (at most gap_ms)",
            summary="datagrams arrive out of order",
            control="assert_udp_reordered",
        ),
        _udp(
            "size_limit",
            "clear",
            (LIMIT, ACTION),
            effect="payloads over limit bytes truncated (action truncate) or dropped (drop)",
            summary="long datagrams arrive cut short, or not at all",
            control="assert_udp_truncated",
        ),
        _udp(
            "dns",
            "clear",
            DNS_ARGUMENTS,
            # A rule judges queries (upstream) and acts on their answers (downstream):
            # one fault of both directions.
            stream=replace(
                STREAM,
                choices=("both",),
                wrong_type="dns acts on queries and their answers: stream must be both, "
                "not {value!r}",
            ),
            effect="DNS queries matching name and qtype: answered SERVFAIL, NXDOMAIN or "
            "REFUSED, dropped, delayed, or their answer truncated (TC) or rewritten",
            summary="a resolver's failure (faultnet.protocols.dns); one dns_fault record "
            "per faulted query",
        ),
        _udp(
            "thaw",
            None,
            undoes=("freeze", "blackhole"),
            result_key="released",
            summary="held datagrams released in order; freeze/blackhole end",
        ),
        _udp(
            "clear",
            None,
            undoes=("loss", "latency", "duplicate", "reorder", "size_limit", "dns"),
            summary="loss, latency, duplicate, reorder and size limit end (DNS faults too, "
            "with stream both or upstream)",
        ),
    )
}

#: The UDP proxy's table: a request names only arguments its mode takes (a null one
#: too), checked in the order of the rows.
UDP = ModeTable(
    "udp",
    UDP_MODES,
    invalid_mode="invalid fault mode for a UDP proxy: {name!r}, one of {names}",
    not_taken="{mode} on a UDP proxy takes no {key!r}",
    not_taken_is_body=True,
    strict=True,
)

#: The UDP arguments the TCP table lacks: the fault request's (and ``faultnet fault``'s)
#: fields for UDP proxies alone.
UDP_ONLY_ARGUMENTS = tuple(a for name, a in UDP.declared.items() if name not in TCP.declared)


def udp_markdown_table() -> str:
    """The README's UDP mode table (undos have no row)."""
    rows = ["| mode | datagrams | what a client sees |", "|---|---|---|"]
    for m in UDP_MODES.values():
        if m.undone_by is None:
            continue
        args = ", ".join((*m.params, "stream="))
        rows.append(f"| `{m.name}({args})` / `{m.undone_by}` | {m.effect} | {m.summary} |")
    return "\n".join(rows)
