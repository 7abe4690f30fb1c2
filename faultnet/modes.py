"""The fault modes, declared once: every list that names a mode comes from :data:`MODES`.

Everything that affects which modes exist, what they take and how they are undone lives
in this table. The proxy's dispatch (:meth:`faultnet.Proxy.apply`), the server's
validation and dispatch, the CLI's choices, the OpenAPI enum and its prose, the
control-test's real arms and the README's mode table are built from it; the controls
list (:data:`faultnet.controls.__all__`) is tested against it (tests/faultnet/test_modes.py
goes red when any of them disagrees).

One spelling per mode: ``drop_syn``. :func:`mode` also accepts the CLI's ``drop-syn``.

Adding a fault mode touches:

1. a :class:`faultnet.Proxy` method named as the mode, total when it returns (and its
   undo, if it has a new one);
2. one row here;
3. its control in :mod:`faultnet.controls` (named in the row's ``control``) with a test
   that breaks the mode and sees the control go red;
4. its breakages in :data:`faultnet.controltest.BREAKAGES` (at least one);
5. the README table, regenerated from :func:`markdown_table` (the test says so when it
   is stale).

This module imports nothing from faultnet but :mod:`faultnet.addresses` (to parse a peer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from faultnet.addresses import parse_peer

__all__ = [
    "MODES",
    "STREAM_CHOICES",
    "Mode",
    "FaultRequest",
    "ModeArgumentError",
    "ModeArgumentTypeError",
    "markdown_table",
    "mode",
    "modes_that",
    "request",
]

#: What ``stream=`` accepts where a mode takes it (Toxiproxy's stream names, plus both).
STREAM_CHOICES = ("both", "upstream", "downstream")
STREAMS = ("upstream", "downstream")


class ModeArgumentError(ValueError):
    """A mode name, or an argument a mode does not take; the message says which."""


class ModeArgumentTypeError(ModeArgumentError):
    """An argument of the wrong type (the API answers "bad request body")."""


def _type_name(value: object) -> str:
    # JSON's names, since most requests come from JSON; Python's read the same.
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", tuple: "array"}.get(type(value), "object")


@dataclass(frozen=True)
class Mode:
    """One fault mode (or one undo), of the TCP proxy (:data:`MODES`) or the UDP proxy
    (:data:`faultnet.udp.modes.UDP_MODES`): one shape for both tables."""

    #: The one spelling, also the proxy method's name.
    name: str
    #: "connections": the connections open at the call (or named by id); "listener":
    #: new connections; "datagrams": a UDP proxy's datagrams; "undo": undoes the modes
    #: in ``undoes``.
    acts_on: Literal["connections", "listener", "datagrams", "undo"]
    #: The keyword arguments it takes besides ``stream`` (TCP: include_new, only,
    #: percent, peer; UDP: its impairment's attributes), and those it requires.
    params: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    #: Takes ``stream=`` ("both", "upstream", "downstream").
    takes_stream: bool = False
    #: For an undo: the modes it ends.
    undoes: tuple[str, ...] = ()
    #: The mode that ends this one, or None (sever and reset cannot be undone).
    undone_by: str | None = None
    #: The percent used when none is given (felt, not fatal, as on a poor real link).
    default_percent: float | None = None
    #: One line: what a client sees.
    summary: str = ""
    #: The control that proves it is in force (in :mod:`faultnet.controls`, or
    #: :mod:`faultnet.udp.controls`), or None.
    control: str | None = None
    #: What it does to open connections (TCP) or to datagrams (UDP), and to new
    #: connections: the README tables' columns.
    effect: str = "unchanged"
    new_connections: str = "unchanged"
    protocol: Literal["tcp", "udp"] = "tcp"

    @property
    def takes_include_new(self) -> bool:
        """Takes ``include_new=`` (also catch connections accepted later, until the undo)."""
        return "include_new" in self.params

    @property
    def per_connection(self) -> bool:
        """Takes ``only=[ids]`` (connection ids), and returns how many it acted on."""
        return "only" in self.params

    @property
    def takes_percent(self) -> bool:
        """Takes ``percent=`` (0-100)."""
        return "percent" in self.params

    @property
    def takes_peer(self) -> bool:
        """Takes ``peer="HOST[:PORT]"`` (the client's address), and returns how many
        connections it acted on."""
        return "peer" in self.params

    @property
    def counts_connections(self) -> bool:
        """Whether applying it returns how many open connections it acted on."""
        return self.per_connection or self.takes_peer

    def check(
        self,
        *,
        stream: str = "both",
        include_new: bool = False,
        only: Iterable[int] | None = None,
        percent: float | None = None,
        peer: str | None = None,
    ) -> None:
        """Raise :class:`ModeArgumentError` for an argument this mode does not take, or
        a bad value (the one validation: :func:`request` returns what it checked)."""
        self.request(stream=stream, include_new=include_new, only=only, percent=percent, peer=peer)

    def request(
        self,
        *,
        stream: object = "both",
        include_new: object = False,
        only: object = None,
        percent: object = None,
        peer: object = None,
    ) -> FaultRequest:
        """Check every argument against this row, once, with one message for each
        mistake, and return the request normalised: the streams it names, *only* as a
        tuple of ids, the row's default percent where none is given, *peer* parsed.
        Values may come from JSON (the API) or Python (the methods) alike."""
        if peer is not None:
            if not self.takes_peer:
                raise ModeArgumentError(
                    f"peer applies to {_names('takes_peer')} only, not {self.name}"
                )
            if include_new:
                raise ModeArgumentError("peer and include_new cannot be combined")
            if not isinstance(peer, str):
                raise ModeArgumentTypeError(
                    f"peer must be HOST or HOST:PORT, not {_type_name(peer)}"
                )
        if stream not in STREAM_CHOICES:
            raise ModeArgumentError(
                f"stream was invalid: it must be one of {', '.join(STREAM_CHOICES)}, not {stream!r}"
            )
        if stream != "both" and not self.takes_stream:
            raise ModeArgumentError(
                f"stream applies to {_names('takes_stream')} only, not {self.name}"
            )
        if not isinstance(include_new, bool):
            raise ModeArgumentTypeError(
                f"include_new must be true or false, not {_type_name(include_new)}"
            )
        if include_new and not self.takes_include_new:
            raise ModeArgumentError(
                f"include_new applies to {_names('takes_include_new')} only, not {self.name}"
            )
        ids: tuple[int, ...] | None = None
        if only is not None:
            if not self.per_connection:
                raise ModeArgumentError(
                    f"connections applies to {_names('per_connection')} only, not {self.name}"
                )
            if include_new:
                raise ModeArgumentError("connections and include_new cannot be combined")
            listed = not isinstance(only, str | bytes | Mapping) and isinstance(only, Iterable)
            ids = tuple(only) if listed else ()  # type: ignore[call-overload]
            if not listed or not all(type(i) is int for i in ids):  # bool is not an id
                raise ModeArgumentTypeError(
                    f"connections must be a list of connection ids, not {only!r}"
                )
        if percent is not None and not self.takes_percent:
            raise ModeArgumentError(
                f"percent applies to {_names('takes_percent')} only, not {self.name}"
            )
        if percent is None:
            percent = self.default_percent
        elif isinstance(percent, bool) or not isinstance(percent, int | float):
            raise ModeArgumentError(f"percent must be a number, not {percent!r}")
        elif not 0 <= percent <= 100:
            raise ModeArgumentError(f"percent must be between 0 and 100, not {percent}")
        # A bad peer raises parse_peer's AddressError (a ValueError too).
        selector = parse_peer(peer) if peer is not None else None
        return FaultRequest(
            mode=self,
            stream=stream,
            streams=STREAMS if stream == "both" else (stream,),
            include_new=include_new,
            only=ids,
            percent=percent,
            peer=selector,
            peer_text=peer,
        )


@dataclass(frozen=True)
class FaultRequest:
    """One fault request, checked against its mode's row (made by :func:`request`)."""

    mode: Mode
    #: As asked ("both", "upstream" or "downstream"), and the streams that names.
    stream: str
    streams: tuple[str, ...]
    include_new: bool
    #: Connection ids, or None for every open connection.
    only: tuple[int, ...] | None
    #: The percent (the row's default where none was given), or None.
    percent: Any
    #: The client selector (host, port or None), and as written.
    peer: tuple[str, int | None] | None
    peer_text: str | None


def request(name: object, **arguments: Any) -> FaultRequest:
    """The request to apply mode *name* with *arguments* (stream, include_new, only,
    percent, peer), checked once: :class:`ModeArgumentError` says what is wrong, or
    :class:`~faultnet.addresses.AddressError` for a peer that is not ``HOST[:PORT]``."""
    return mode(name).request(**arguments)


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode(
            "freeze",
            "connections",
            params=(
                "include_new",
                "only",
                "peer",
            ),
            undone_by="thaw",
            takes_stream=True,
            summary="writes succeed until buffers fill, reads hang",
            control="assert_frozen",
            effect="nothing forwarded; FIN/RST held",
            new_connections="unchanged (`include_new=True` catches them)",
        ),
        Mode(
            "blackhole",
            "connections",
            params=(
                "include_new",
                "only",
                "peer",
            ),
            undone_by="thaw",
            summary="a dead route: keepalive and TCP_USER_TIMEOUT fire",
            control="assert_blackholed",
            effect="freeze + a drop-all filter on the client's socket",
            new_connections="unchanged (`include_new`)",
        ),
        Mode(
            "thaw",
            "undo",
            params=(
                "only",
                "peer",
            ),
            undoes=("freeze", "blackhole", "loss", "partition"),
            takes_stream=True,
            summary="held bytes delivered in order, then any held FIN or RST; loss and "
            "partitions end",
        ),
        Mode(
            "sever",
            "connections",
            params=(
                "only",
                "peer",
            ),
            summary="EOF within ms",
            control="assert_severed",
            effect="clean FIN both ways, even with unread bytes",
        ),
        Mode(
            "reset",
            "connections",
            params=(
                "only",
                "peer",
            ),
            summary="ECONNRESET within ms",
            control="assert_reset",
            effect="RST both ways",
        ),
        Mode(
            "loss",
            "connections",
            params=(
                "only",
                "percent",
                "peer",
            ),
            undone_by="thaw",
            takes_stream=True,
            default_percent=5.0,
            summary="real segment loss: its own TCP retransmits, bytes arrive intact but late",
            control="assert_lossy",
            effect="each arriving segment dropped with p = percent "
            "(a random socket filter); retransmits reported",
        ),
        Mode(
            "partition",
            "connections",
            params=("peer",),
            undone_by="thaw",
            summary="one client (or all) cut off as by a dead route, the others unaffected",
            control="assert_partitioned",
            effect="the peer's (`peer=`) or all: blackholed",
            new_connections="the peer's SYNs dropped (all, with no peer)",
        ),
        Mode(
            "drop_syn",
            "listener",
            undone_by="restore",
            summary="connect hangs; a retrying client gets in after restore",
            control="assert_syn_dropped",
            new_connections="SYN dropped",
        ),
        Mode(
            "syn_loss",
            "listener",
            params=("percent",),
            undone_by="restore",
            default_percent=20.0,
            summary="slow, flaky connects: a dropped SYN is retried after ~1 s, then as the "
            "kernel says (`syn_retry_schedule()`)",
            control="assert_syn_lossy",
            new_connections="each SYN dropped with p = percent",
        ),
        Mode(
            "refuse",
            "listener",
            undone_by="restore",
            summary="ECONNREFUSED at once (one already queued, not yet accepted: ECONNRESET)",
            control="assert_refusing",
            new_connections="listener closed; restore re-listens on the same port",
        ),
        Mode(
            "restore",
            "undo",
            undoes=("drop_syn", "syn_loss", "refuse"),
            summary="new connects accepted again",
        ),
    )
}


def mode(name: object) -> Mode:
    """The mode named *name* (``drop_syn`` or the CLI's ``drop-syn``);
    :class:`ModeArgumentError` naming the valid ones otherwise."""
    found = MODES.get(name.replace("-", "_")) if isinstance(name, str) else None
    if found is None:
        raise ModeArgumentError(f"invalid fault mode: {name!r}, one of {', '.join(MODES)}")
    return found


def modes_that(flag: str) -> list[str]:
    """The names of the modes whose boolean field *flag* is true, in table order
    (e.g. ``modes_that("takes_stream") == ["freeze", "thaw"]``)."""
    return [m.name for m in MODES.values() if getattr(m, flag)]


def _names(flag: str) -> str:
    names = modes_that(flag)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def markdown_table() -> str:
    """The README's mode table (a mode and its undo per row; undos have no row)."""
    rows = [
        "| mode | open connections | new connections | what a client sees |",
        "|---|---|---|---|",
    ]
    for m in MODES.values():
        if m.acts_on == "undo":
            continue
        args = [
            a
            for a, takes in (
                ("percent", m.takes_percent),
                ("stream=", m.takes_stream),
                ("peer=", m.takes_peer),
            )
            if takes
        ]
        call = f"`{m.name}({', '.join(args)})`" if args else f"`{m.name}`"
        if m.undone_by:
            call += f" / `{m.undone_by}`"
        rows.append(f"| {call} | {m.effect} | {m.new_connections} | {m.summary} |")
    return "\n".join(rows)
