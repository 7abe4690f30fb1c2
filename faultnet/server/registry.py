"""The server's model: named proxies with Toxiproxy's semantics, and faultnet's modes.

A :class:`ProxyRegistry` owns every proxy of one server and the nursery they run in.
Each entry (:class:`ManagedProxy`) has Toxiproxy's fields (name, listen, upstream,
enabled, toxics); while enabled it runs one :class:`faultnet.Proxy`. Disabling closes
the listener and every connection (and waits until both are done); enabling listens again
on the same address: the bound one, so a proxy created on port 0 keeps its real port.
The toxics belong to the entry and survive disable/enable; fault modes belong to the
running proxy and end with it.

Every method that changes state runs under one lock, so concurrent API calls apply one
after the other and each sees the previous one complete. Errors a client can cause are
:class:`ApiError` with Toxiproxy's status and message; nothing else is expected.

Randomness: the server has one seed (chosen and logged when not given); each proxy's seed
is derived from it and the proxy's name, so the same seed, names and connection order
replay the same toxicity and jitter decisions.
"""

from __future__ import annotations

import collections
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from faultnet import addresses
from faultnet.addresses import AddressError, format_address, is_loopback
from faultnet.eventlog import JsonlWriter
from faultnet.events import EVENTS
from faultnet.modes import TABLES, ModeArgumentError, ModeArgumentTypeError
from faultnet.proxy import AddressInUse, ConnectionInfo, Proxy, ProxyError
from faultnet.seeds import derive_seed
from faultnet.server.names import name_problem
from faultnet.server.toxic_codec import ToxicError, check_update, toxic_from_json, toxic_to_json
from faultnet.toxics import STREAMS, Toxic
from faultnet.udp.modes import UDP  # noqa: F401 -- registers the UDP table in TABLES
from faultnet.udp.proxy import SessionInfo, UdpProxy

__all__ = [
    "ApiError",
    "EventLog",
    "ManagedProxy",
    "ProxyRegistry",
    "format_address",
    "open_registry",
    "parse_address",
]

#: Records kept in memory for ``GET /events`` (the file, if any, keeps them all).
EVENT_RING_SIZE = 10_000

Address = tuple[str, int]


class ApiError(Exception):
    """A request the server refuses: the HTTP status and Toxiproxy's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def bad_body(detail: str) -> ApiError:
    return ApiError(400, f"bad request body: {detail}")


PROXY_NOT_FOUND = (404, "proxy not found")
TOXIC_NOT_FOUND = (404, "toxic not found")


# -- event log ---------------------------------------------------------------------------


class EventLog:
    """The server's event log: an optional JSONL file plus the last records in memory.

    Every component writes through its own writer (:meth:`writer`, tagged with its
    name: a proxy passes ``proxy=<name>``) into one descriptor of the file, opened
    once for the server however many proxies it has (a descriptor per proxy was 1,000
    descriptors of a server with 1,000 proxies: issue 36); each record is one ``write``
    on O_APPEND, whole. Every record is also kept, numbered, in a ring of
    :data:`EVENT_RING_SIZE` for reading over HTTP.

    A record the file refuses (disk full, a file-size limit) is still kept in the ring;
    :attr:`dropped` counts those the file lost, over every writer of this log.
    """

    def __init__(self, path: str | None, ring_size: int = EVENT_RING_SIZE) -> None:
        self.path = path
        self._ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=ring_size)
        self._seq = 0
        #: Records the file could not take (every writer's: they share the file).
        self.dropped = 0
        #: Why the last of them failed, e.g. ``"[Errno 28] No space left on device"``;
        #: None while none has.
        self.last_error: str | None = None
        #: Called with each record as it is kept (the metrics' counters, in this loop).
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.file = _SharedFile(self, path)
        self.server = self.writer(component="server")

    def writer(self, **static: Any) -> JsonlWriter:
        """A writer for one component (a proxy passes ``proxy=<name>``)."""
        return _TeeWriter(self, **static)

    def _keep(self, record: dict[str, Any]) -> None:
        self._seq += 1
        self._ring.append({"seq": self._seq, **record})
        for listener in self.listeners:
            listener(record)

    def read(
        self, *, since: int = 0, limit: int = 1000, proxy: str | None = None
    ) -> list[dict[str, Any]]:
        """Records numbered after *since* (oldest first), at most *limit*."""
        out: list[dict[str, Any]] = []
        for rec in self._ring:
            if rec["seq"] > since and (proxy is None or rec.get("proxy") == proxy):
                out.append(rec)
                if len(out) >= limit:
                    break
        return out

    @property
    def last_seq(self) -> int:
        return self._seq

    def close(self) -> None:
        self.file.close()


class _SharedFile(JsonlWriter):
    """The log's one descriptor of its file; what it drops is the log's count."""

    def __init__(self, log: EventLog, path: str | None) -> None:
        super().__init__(path)
        self._log = log

    def _drop(self, exc: OSError) -> None:
        super()._drop(exc)
        self._log.dropped += 1
        self._log.last_error = self.last_error


class _TeeWriter(JsonlWriter):
    """A component's writer: no descriptor of its own; each record goes to the log's
    file and to its ring. Its own ``dropped`` counts its records the file lost."""

    def __init__(self, log: EventLog, **static: Any) -> None:
        super().__init__(None, vocabulary=EVENTS, **static)
        self.path = log.file.path  # where its records go (a proxy shows it)
        self._log = log

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = super().write(event, **fields)  # checked and built: no file here
        if not self._log.file.append(record):
            self.dropped += 1
            self.last_error = self._log.file.last_error
        self._log._keep(record)
        return record


# -- addresses ---------------------------------------------------------------------------


def parse_address(value: Any, what: str, *, default: str | None = None) -> Address:
    """Parse Toxiproxy's ``host:port`` (IPv6 as ``[::1]:port``) into ``(host, port)``,
    with :func:`faultnet.addresses.parse_address`.

    An empty host means 127.0.0.1 (Toxiproxy binds every interface there; faultnet does
    not bind beyond loopback unless asked by name). Raises :class:`ApiError` 400.
    """
    if value is None or value == "":
        if default is None:
            raise ApiError(400, f"missing required field: {what}")
        value = default
    if not isinstance(value, str):
        raise bad_body(f"{what} must be a string, not {type(value).__name__}")
    try:
        return addresses.parse_address(value, default_host="127.0.0.1")
    except addresses.AddressError as exc:
        raise bad_body(f"{what} address {exc}") from None


# -- proxies -----------------------------------------------------------------------------


_T = TypeVar("_T")

#: What a proxy may proxy: TCP (Toxiproxy's kind, the default) or UDP (an extension).
PROTOCOLS = ("tcp", "udp")


class _Started:
    """A task status that remembers it was reported (a proxy that fails after is
    disabled, not raised). A class of its own, not one built per proxy's start: that
    took 6 us of each create, of ~250 us (issue 36)."""

    def __init__(self, task_status: trio.TaskStatus[Any]) -> None:
        self.task_status = task_status
        self.done = False

    def started(self, value: Any = None) -> None:
        self.done = True
        self.task_status.started(value)


class ManagedProxy:
    """One named proxy of the server (Toxiproxy's proxy object)."""

    def __init__(
        self,
        registry: ProxyRegistry,
        name: str,
        listen: Address,
        upstream: str,
        protocol: str = "tcp",
    ):
        self.registry = registry
        self.name = name
        self.listen = listen  # the bound address once started
        self.upstream = upstream
        #: "tcp" (Toxiproxy's only kind) or "udp" (a faultnet extension: a UdpProxy).
        self.protocol = protocol
        self.proxy: Proxy | UdpProxy | None = None
        self._toxics: list[Toxic] = []
        self._stopped: trio.Event | None = None
        self._writer: JsonlWriter | None = None

    @property
    def enabled(self) -> bool:
        return self.proxy is not None

    @property
    def listen(self) -> Address:
        return self._listen

    @listen.setter
    def listen(self, address: Address) -> None:
        # Its text is kept: the listing shows every proxy's (issue 36).
        self._listen, self._listen_text = address, format_address(address)

    @property
    def toxics(self) -> list[Toxic]:
        """In Toxiproxy's order: the upstream chain, then the downstream chain."""
        source = self.proxy.toxics if isinstance(self.proxy, Proxy) else self._toxics
        if not source:
            return []
        return [t for s in STREAMS for t in source if t.stream == s]

    def find_toxic(self, name: str) -> Toxic | None:
        return next((t for t in self.toxics if t.name == name), None)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "name": self.name,
            "listen": self._listen_text,
            "upstream": self.upstream,
            "enabled": self.proxy is not None,
            "toxics": [toxic_to_json(t) for t in self.toxics],
        }
        if self.protocol != "tcp":
            doc["protocol"] = self.protocol
        return doc

    # -- lifecycle (callers hold the registry lock) --

    async def start(self) -> None:
        """Listen on ``listen`` and proxy to ``upstream``; ApiError if it cannot bind."""
        if self.proxy is not None:
            return
        reg = self.registry
        assert reg._nursery is not None, "registry is not running"
        upstream = parse_address(self.upstream, "upstream")
        if self._writer is None:
            self._writer = reg.events.writer(proxy=self.name)
        seed = derive_seed("faultnet", reg.seed, self.name)
        proxy: Proxy | UdpProxy
        if self.protocol == "udp":
            proxy = UdpProxy(
                upstream, self.listen, name=self.name, event_log=self._writer, seed=seed
            )
        else:
            proxy = Proxy(upstream, self.listen, name=self.name, event_log=self._writer, seed=seed)
            for t in self._toxics:
                proxy.add_toxic(t)
        stopped = trio.Event()
        try:
            await reg._nursery.start(self._run, proxy, stopped)
        except ProxyError as exc:
            raise _proxy_error(exc) from None
        except OSError as exc:  # e.g. a listen host that does not resolve
            raise ApiError(400, f"cannot listen on {format_address(self.listen)}: {exc}") from None
        assert proxy.address is not None
        self.listen = (proxy.address[0], proxy.address[1])
        self.proxy, self._stopped = proxy, stopped

    async def _run(
        self, proxy: Proxy | UdpProxy, stopped: trio.Event, *, task_status: trio.TaskStatus[Any]
    ) -> None:
        status = _Started(task_status)
        try:
            await proxy.serve(task_status=status)
        except Exception as exc:
            if not status.done:
                raise
            # A running proxy that fails is reported and disabled, never the server's end.
            self.registry.events.server.write("proxy_failed", name=self.name, error=repr(exc))
            if self.proxy is proxy:
                if isinstance(proxy, Proxy):
                    self._toxics = list(proxy.toxics)
                self.proxy = None
        finally:
            stopped.set()

    async def stop(self) -> None:
        """Close the listener and every connection; return when both are done."""
        proxy, stopped = self.proxy, self._stopped
        if proxy is None or stopped is None:
            return
        if isinstance(proxy, Proxy):
            self._toxics = list(proxy.toxics)
        self.proxy = self._stopped = None
        await proxy.aclose()
        await stopped.wait()

    def close_log(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- toxics --

    def add_toxic(self, toxic: Toxic) -> None:
        if self.protocol == "udp":
            raise ApiError(
                400, "toxics are for TCP proxies: a UDP proxy's impairments are fault modes"
            )
        if isinstance(self.proxy, Proxy):
            self.proxy.add_toxic(toxic)
        else:
            self._toxics.append(toxic)

    def update_toxic(
        self, toxic: Toxic, attributes: dict[str, Any], toxicity: float | None
    ) -> None:
        if isinstance(self.proxy, Proxy):
            self.proxy.update_toxic(toxic.name, attributes, toxicity)
        else:
            if attributes:
                toxic.update(attributes)
            if toxicity is not None:
                toxic.toxicity = toxicity

    def remove_toxic(self, name: str) -> None:
        if isinstance(self.proxy, Proxy):
            self.proxy.remove_toxic(name)
        else:
            self._toxics = [t for t in self._toxics if t.name != name]

    def remove_all_toxics(self) -> None:
        for t in self.toxics:
            self.remove_toxic(t.name)


class ProxyRegistry:
    """Every proxy of one server. Run it with :func:`open_registry`.

    ``listen_hosts``, if given, is the set of hosts a proxy may listen on (e.g. loopback
    only); any other listen address is a 400. Otherwise, unless ``beyond_loopback``,
    proxies listen on loopback only: a wildcard (0.0.0.0, as chaostoolkit-toxiproxy asks
    by default, or ::) is put on loopback (127.0.0.1, ::1) and the answer shows the real
    address; any other non-loopback host is a 400.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        event_log: str | None = None,
        listen_hosts: Collection[str] | None = None,
        beyond_loopback: bool = False,
    ) -> None:
        self.beyond_loopback = beyond_loopback
        self.seed = seed if seed is not None else secrets.randbits(63)
        self.events = EventLog(event_log)
        self.listen_hosts = frozenset(listen_hosts) if listen_hosts is not None else None
        self.proxies: dict[str, ManagedProxy] = {}
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None

    # -- lookups --

    def get(self, name: str) -> ManagedProxy:
        mp = self.proxies.get(name)
        if mp is None:
            raise ApiError(*PROXY_NOT_FOUND)
        return mp

    def get_toxic(self, proxy: str, toxic: str) -> tuple[ManagedProxy, Toxic]:
        mp = self.get(proxy)
        t = mp.find_toxic(toxic)
        if t is None:
            raise ApiError(*TOXIC_NOT_FOUND)
        return mp, t

    def index(self) -> dict[str, Any]:
        return {name: mp.to_json() for name, mp in self.proxies.items()}

    # -- validation --

    def _listen(self, value: Any) -> Address:
        addr = parse_address(value, "listen", default="127.0.0.1:0")
        if self.listen_hosts is not None and addr[0] not in self.listen_hosts:
            raise ApiError(
                400,
                f"listen address {format_address(addr)} not allowed: this server listens "
                f"only on {', '.join(sorted(self.listen_hosts))}",
            )
        if self.listen_hosts is None and not self.beyond_loopback:
            host = _LOOPBACK_FOR.get(addr[0], addr[0])
            if not is_loopback(host):
                raise ApiError(
                    400,
                    f"listen address {format_address(addr)} not allowed: this server puts "
                    "proxies on loopback (start it with --proxies-beyond-loopback)",
                )
            addr = (host, addr[1])
        return addr

    @staticmethod
    def _field(body: Mapping[str, Any], key: str, kind: type) -> Any:
        """``body[key]`` if it is a *kind* (str or bool) or absent/null; else a 400."""
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            what = "a string" if kind is str else "true or false"
            raise bad_body(f"{key} must be {what}, not {_json_type(value)}")
        return value

    def _protocol(self, body: Mapping[str, Any], where: str = "") -> str:
        """The ``protocol`` extension field: "tcp" (the default) or "udp"."""
        protocol = self._field(body, "protocol", str) or "tcp"
        if protocol not in PROTOCOLS:
            raise bad_body(f"protocol must be tcp or udp, not {protocol!r}{where}")
        return protocol

    def _proxy_fields(self, body: Any, where: str = "") -> tuple[str, str, str | None, bool | None]:
        if not isinstance(body, Mapping):
            raise bad_body(f"expected a JSON object{where}, not {_json_type(body)}")
        name = self._field(body, "name", str)
        upstream = self._field(body, "upstream", str)
        listen = self._field(body, "listen", str)
        enabled = self._field(body, "enabled", bool)
        if not name:
            raise ApiError(400, f"missing required field: name{where}")
        problem = name_problem(name)
        if problem is not None:
            raise bad_body(f"proxy name {problem}{where}")
        if not upstream:
            raise ApiError(400, f"missing required field: upstream{where}")
        return name, upstream, listen, enabled

    # -- proxies --

    async def create(self, body: Any) -> ManagedProxy:
        name, upstream, listen, enabled = self._proxy_fields(body)
        protocol = self._protocol(body)
        async with self._lock:
            if name in self.proxies:
                raise ApiError(409, "proxy already exists")
            mp = self._new(name, listen, upstream, protocol)
            if enabled is not False:
                await mp.start()
            self.proxies[name] = mp
            self.events.server.write("proxy_created", name=name, **_brief(mp))
            return mp

    def _new(
        self, name: str, listen: str | None, upstream: str, protocol: str = "tcp"
    ) -> ManagedProxy:
        parse_address(upstream, "upstream")  # a malformed upstream is a 400 now
        return ManagedProxy(self, name, self._listen(listen), upstream, protocol)

    async def update(self, name: str, body: Any) -> ManagedProxy:
        async with self._lock:
            mp = self.get(name)
            if not isinstance(body, Mapping):
                raise bad_body(f"expected a JSON object, not {_json_type(body)}")
            upstream = self._field(body, "upstream", str)
            listen_s = self._field(body, "listen", str)
            enabled = self._field(body, "enabled", bool)
            if self._protocol(body) != mp.protocol and body.get("protocol") is not None:
                raise bad_body("protocol cannot change: delete the proxy and create it again")
            listen = self._listen(listen_s) if listen_s else mp.listen
            upstream = upstream or mp.upstream
            parse_address(upstream, "upstream")
            if listen != mp.listen or upstream != mp.upstream:
                # As Toxiproxy: a changed address restarts the proxy (connections drop).
                was_enabled = mp.enabled
                await mp.stop()
                mp.listen, mp.upstream = listen, upstream
                if enabled is None:
                    enabled = was_enabled
            if enabled is not None and enabled != mp.enabled:
                await (mp.start() if enabled else mp.stop())
            self.events.server.write("proxy_updated", name=name, **_brief(mp))
            return mp

    async def delete(self, name: str) -> None:
        async with self._lock:
            mp = self.get(name)
            await mp.stop()
            del self.proxies[name]
            mp.close_log()
            self.events.server.write("proxy_deleted", name=name)

    async def populate(self, body: Any) -> tuple[list[ManagedProxy], ApiError | None]:
        """Create or replace the listed proxies; keep the others.

        All entries are checked before anything changes. An entry identical to an
        existing proxy (same listen and upstream) leaves it as it is, toxics included; a
        differing one replaces it. The first failure stops the run: the proxies done so
        far and the error are returned.
        """
        if not isinstance(body, list):
            raise bad_body(f"expected a JSON array of proxies, not {_json_type(body)}")
        entries: list[tuple[str, str, Address, bool, str]] = []
        for i, item in enumerate(body, 1):
            name, upstream, listen_text, enabled = self._proxy_fields(item, f" at proxy {i}")
            protocol = self._protocol(item, f" at proxy {i}")
            parse_address(upstream, "upstream")
            entries.append(
                (name, upstream, self._listen(listen_text), enabled is not False, protocol)
            )
        done: list[ManagedProxy] = []
        async with self._lock:
            for name, upstream, listen, start, protocol in entries:
                existing = self.proxies.get(name)
                if existing is not None:
                    if (
                        _same_listen(existing.listen, listen)
                        and existing.upstream == upstream
                        and existing.protocol == protocol
                    ):
                        done.append(existing)
                        continue
                    await existing.stop()
                    existing.close_log()
                    del self.proxies[name]
                mp = ManagedProxy(self, name, listen, upstream, protocol)
                try:
                    if start:
                        await mp.start()
                except ApiError as exc:
                    self.events.server.write("populate_failed", name=name, error=exc.message)
                    return done, exc
                self.proxies[name] = mp
                done.append(mp)
            self.events.server.write("populated", names=[mp.name for mp in done])
        return done, None

    async def reset(self) -> None:
        """Toxiproxy's reset: every proxy enabled, every toxic removed. faultnet also ends
        its own modes (thaw, restore)."""
        async with self._lock:
            for mp in list(self.proxies.values()):
                await mp.start()
                mp.remove_all_toxics()
                await self._undo_all(mp)
            self.events.server.write("reset", proxies=len(self.proxies))

    # -- toxics --

    def under_lock(self, fn: Callable[[], _T]) -> _T | Awaitable[_T]:
        """*fn*'s result under the registry's lock. When the lock is free that is *fn*
        called now, no await: nothing else runs in this loop meanwhile, so nothing the
        lock guards can interleave (a toxic's add from the API's thread then costs no
        task there, issue 36). Otherwise an awaitable of it, called once the lock is
        had. Call it in the registry's loop."""
        if not self._lock.locked():
            return fn()
        return self._when_locked(fn)

    async def _when_locked(self, fn: Callable[[], _T]) -> _T:
        async with self._lock:
            return fn()

    async def add_toxic(self, proxy: str, body: Any) -> Toxic:
        async with self._lock:
            return self.locked_add_toxic(proxy, body)

    def locked_add_toxic(self, proxy: str, body: Any) -> Toxic:
        """:meth:`add_toxic`, the lock held (:meth:`under_lock`)."""
        mp = self.get(proxy)
        try:
            toxic = toxic_from_json(body, taken=lambda n: mp.find_toxic(n) is not None)
        except ToxicError as exc:
            raise ApiError(exc.status, exc.message) from None
        mp.add_toxic(toxic)
        return toxic

    async def update_toxic(self, proxy: str, name: str, body: Any) -> Toxic:
        async with self._lock:
            return self.locked_update_toxic(proxy, name, body)

    def locked_update_toxic(self, proxy: str, name: str, body: Any) -> Toxic:
        """:meth:`update_toxic`, the lock held (:meth:`under_lock`)."""
        mp, toxic = self.get_toxic(proxy, name)
        try:
            attributes, toxicity = check_update(toxic, body)
        except ToxicError as exc:
            raise ApiError(exc.status, exc.message) from None
        mp.update_toxic(toxic, attributes, toxicity)
        return toxic

    async def remove_toxic(self, proxy: str, name: str) -> None:
        async with self._lock:
            self.locked_remove_toxic(proxy, name)

    def locked_remove_toxic(self, proxy: str, name: str) -> None:
        """:meth:`remove_toxic`, the lock held (:meth:`under_lock`)."""
        mp, toxic = self.get_toxic(proxy, name)
        mp.remove_toxic(toxic.name)

    # -- faultnet's modes --

    def fault_state(self, name: str) -> dict[str, Any]:
        mp = self.get(name)
        state: dict[str, Any] = {"proxy": name, "enabled": mp.enabled}
        p = mp.proxy
        if p is not None:
            state.update(p.state)
            # Kept counts: nothing is read per connection or session (issue 36).
            state["connections"] = p.connection_counts()
        return state

    def connections(
        self, name: str, *, after: int = 0, limit: int | None = None
    ) -> list[ConnectionInfo] | list[SessionInfo]:
        """The proxy's live connections (a UDP proxy's sessions), in the order they came:
        all, or a page of at most *limit* whose ids come after *after*."""
        p = self.get(name).proxy
        if isinstance(p, Proxy):
            return p.connections(after=after, limit=limit)  # only the page is read
        sessions = [s for s in (p.connections() if p is not None else []) if s.id > after]
        return sessions[:limit]

    async def apply_fault(self, name: str, body: Any) -> dict[str, Any]:
        """Apply one mode of the proxy's table (:data:`faultnet.modes.MODES`, or
        :data:`faultnet.udp.modes.UDP_MODES` on a UDP proxy) to the running proxy;
        return what it did. The mode's row says which arguments it takes.

        A request the table refuses is a 400; what the proxy raises besides a
        :class:`ProxyError` is a bug, not the client's: it goes up (the API answers 500
        and logs it)."""
        if not isinstance(body, Mapping):
            raise bad_body(f"expected a JSON object, not {_json_type(body)}")
        table = TABLES[self.get(name).protocol]
        try:
            # The one validation of a fault request: the mode table's.
            req = table.from_json(body)
        except ModeArgumentTypeError as exc:
            raise bad_body(str(exc)) from None
        except (ModeArgumentError, AddressError) as exc:
            raise ApiError(400, str(exc)) from None
        async with self._lock:
            mp = self.get(name)
            p = mp.proxy
            if p is None:
                raise ApiError(409, "proxy is disabled")
            if req.only is not None:
                # Acting on nothing is not a success: every id named must be live.
                if isinstance(p, Proxy):
                    missing = p.missing_connections(req.only)
                else:
                    live = {c.id for c in p.connections() if c.state != "closing"}
                    missing = [i for i in req.only if i not in live]
                if missing:
                    raise ApiError(
                        404, f"connection not found: {', '.join(str(i) for i in missing)}"
                    )
            try:
                done = await p.apply_request(req)
            except ProxyError as exc:
                raise _proxy_error(exc) from None
        result: dict[str, Any] = {
            "proxy": name,
            "mode": req.mode.name,
            "stream": req.stream,
            **req.echo,
        }
        if req.mode.result_key is not None:
            result[req.mode.result_key] = done
        result["state"] = self.fault_state(name)
        return result

    async def clear_faults(self, name: str) -> None:
        """Undo every mode: thaw both ways, then restore the listener."""
        async with self._lock:
            mp = self.get(name)
            await self._undo_all(mp)

    async def _undo_all(self, mp: ManagedProxy) -> None:
        """End every mode: each undo of the proxy's table, in its order (TCP: thaw, then
        restore the listener; UDP: thaw, clear)."""
        if mp.proxy is None:
            return
        table = TABLES[mp.protocol]
        for row in table.modes.values():
            if row.acts_on == "undo":
                try:
                    await mp.proxy.apply_request(table.check(row, {}))
                except ProxyError as exc:
                    raise _proxy_error(exc) from None

    # -- lifecycle --

    async def aclose(self) -> None:
        async with self._lock:
            for mp in list(self.proxies.values()):
                await mp.stop()
                mp.close_log()
            self.events.close()


#: A wildcard listen host, and the loopback address it is put on by default.
_LOOPBACK_FOR = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def _proxy_error(exc: ProxyError) -> ApiError:
    # The class chooses the status: a taken address is Toxiproxy's 500, the rest a 400.
    return ApiError(500 if isinstance(exc, AddressInUse) else 400, str(exc))


def _same_listen(current: Address, wanted: Address) -> bool:
    # Toxiproxy compares the bound address with the requested one: port 0 differs.
    return current == wanted


def _brief(mp: ManagedProxy) -> dict[str, Any]:
    return {
        "listen": format_address(mp.listen),
        "upstream": mp.upstream,
        "enabled": mp.enabled,
    }


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


@asynccontextmanager
async def open_registry(**kwargs: Any) -> AsyncIterator[ProxyRegistry]:
    """Run a :class:`ProxyRegistry` for the block; every proxy is stopped on exit."""
    registry = ProxyRegistry(**kwargs)
    registry.events.server.write("server_seed", seed=registry.seed)
    async with trio.open_nursery() as nursery:
        registry._nursery = nursery
        try:
            yield registry
        finally:
            with trio.CancelScope(shield=True):
                await registry.aclose()
            nursery.cancel_scope.cancel()
