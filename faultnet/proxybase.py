"""What every faultnet proxy is made with, the TCP one (:class:`faultnet.proxy.Proxy`)
and the UDP one (:class:`faultnet.udp.UdpProxy`) alike: its name in the event log, the
upstream, the address it listens on, the seed of its random decisions, its event log
and a descriptor limit raised for thousands of peers. Each proxy adds its own knobs."""

from __future__ import annotations

import random

from faultnet.addresses import Address, format_address
from faultnet.eventlog import JsonlWriter
from faultnet.events import EVENTS
from faultnet.sockopts import raise_fd_limit

__all__ = ["ProxyBase"]


class ProxyBase:
    """The attributes both proxies share, set from their common arguments."""

    def __init__(
        self,
        upstream: Address,
        listen: Address,
        *,
        name: str,
        event_log: str | None | JsonlWriter,
        seed: int | None,
    ) -> None:
        self.name = name
        self.upstream = (upstream[0], int(upstream[1]))
        self.listen = (listen[0], int(listen[1]))
        #: Drawn (and logged) when not given, so every run can be replayed.
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.log = (
            event_log
            if isinstance(event_log, JsonlWriter)
            else JsonlWriter(event_log, vocabulary=EVENTS, proxy=name)
        )
        #: The bound address, once listening (port 0 becomes the real port).
        self.address: Address | None = None
        self.fd_limit = raise_fd_limit()

    def log_listening(self, **knobs: object) -> None:
        """The ``listening`` record, once bound: the address, the upstream and the seed
        (what replays the run), then *knobs*, the proxy's own."""
        assert self.address is not None
        self.log.write(
            "listening",
            listen=format_address(self.address),
            upstream=format_address(self.upstream),
            seed=self.seed,
            **knobs,
        )
