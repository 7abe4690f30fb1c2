"""Where faults land: a proxy in this process, or a proxy on a faultnet server.

Both offer the same five calls (:class:`ProxyTarget`), so the runner never asks which
kind it holds. A server proxy is driven over the HTTP API with the blocking
:class:`faultnet.server.client.ApiClient`, each call in a worker thread (not abandoned
on cancellation: an undo that was sent is waited for). Processes are not targets here:
signals go through the allowlist (:mod:`faultnet.chaos._allowlist`).

Errors: :class:`TargetAbsent` when the proxy does not exist (not given to this process,
or a 404 from its server); :class:`TargetFailed` for anything else that stopped a call,
with a one-line reason.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any

import trio

from faultnet.modes import MODES
from faultnet.server.client import ApiClient, ApiFailure, ApiUnavailable, fault_body
from faultnet.toxics import TOXICS

__all__ = ["LocalTarget", "ProxyTarget", "ServerTarget", "TargetAbsent", "TargetFailed"]

#: Seconds one API call may take before the step is logged as failed.
API_TIMEOUT_S = 10.0


class TargetAbsent(Exception):
    """The proxy is not there."""


class TargetFailed(Exception):
    """A call on a target failed; the message says why, in one line."""


def _host(hostport: str) -> str:
    host = hostport.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class ProxyTarget(ABC):
    """One proxy chaos may act on, named by its plan key (``NAME@local``/``NAME@URL``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    @abstractmethod
    async def hosts(self) -> list[str]:
        """The hosts it listens on and forwards to (for the loopback rail)."""

    @abstractmethod
    async def apply_mode(
        self, mode: str, *, stream: str, include_new: bool, only: list[int] | None = None
    ) -> dict[str, Any]:
        """Apply a fault mode (or an undoing mode such as thaw or restore), on the
        connections whose ids are in *only* if given (those no longer open are left out;
        none left: nothing is applied). A mode that acts on connections reports how many
        (``connections``) and which (``conns``: for a mode that holds them, those still
        open after it, i.e. the ones it took down)."""

    @abstractmethod
    async def add_toxic(
        self, name: str, type_name: str, stream: str, attributes: dict[str, Any]
    ) -> dict[str, Any]: ...

    @abstractmethod
    async def remove_toxic(self, name: str) -> dict[str, Any]:
        """Remove a toxic; ``{"already_gone": True}`` if it was not there."""


def _taken(mode: str, n: Any, before: set[int], only: list[int] | None, now: Any) -> dict[str, Any]:
    """A mode's result: how many connections it acted on and, for a mode on connections,
    which: those it was aimed at, and of a holding mode only those still open after it."""
    if not isinstance(n, int):
        return {}
    row = MODES.get(mode)
    if row is None or not row.per_connection:
        return {"connections": n}
    aimed = set(only) if only is not None else before
    taken = aimed & now() if row.undone_by else aimed
    return {"connections": n, "conns": sorted(taken)}


class LocalTarget(ProxyTarget):
    """A :class:`faultnet.Proxy` running in this process."""

    def __init__(self, key: str, proxy: Any) -> None:
        super().__init__(key)
        self.proxy = proxy

    async def hosts(self) -> list[str]:
        listen = self.proxy.address or self.proxy.listen
        return [listen[0], self.proxy.upstream[0]]

    def _open_ids(self) -> set[int]:
        return {c.id for c in self.proxy.connections() if c.state != "closing"}

    async def apply_mode(
        self, mode: str, *, stream: str, include_new: bool, only: list[int] | None = None
    ) -> dict[str, Any]:
        before = self._open_ids()
        if only is not None:
            only = sorted(before.intersection(only))
            if not only:
                return {"connections": 0, "conns": []}
        try:
            n = await self.proxy.apply(mode, stream=stream, include_new=include_new, only=only)
        except Exception as exc:  # ProxyError, ValueError: one line in the log
            raise TargetFailed(f"{mode}: {exc}") from None
        return _taken(mode, n, before, only, self._open_ids)

    async def add_toxic(
        self, name: str, type_name: str, stream: str, attributes: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            self.proxy.add_toxic(TOXICS[type_name](name, stream, 1.0, **attributes))
        except (KeyError, TypeError, ValueError) as exc:
            raise TargetFailed(f"toxic {name}: {exc}") from None
        return {"toxic": name}

    async def remove_toxic(self, name: str) -> dict[str, Any]:
        try:
            self.proxy.remove_toxic(name)
        except KeyError:
            return {"toxic": name, "already_gone": True}
        return {"toxic": name}


class ServerTarget(ProxyTarget):
    """A proxy on a faultnet server, by name, over the HTTP API."""

    def __init__(self, key: str, url: str, name: str) -> None:
        super().__init__(key)
        self.client = ApiClient(url, timeout=API_TIMEOUT_S)
        self.name = name

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        call = functools.partial(self.client.request, method, path, body)
        try:
            return await trio.to_thread.run_sync(call)
        except ApiFailure as exc:
            if exc.status == 404:
                raise TargetAbsent(f"{self.key}: {exc.message}") from None
            raise TargetFailed(f"{exc.message} (HTTP {exc.status})") from None
        except ApiUnavailable as exc:
            raise TargetFailed(str(exc)) from None

    @property
    def _path(self) -> str:
        return f"/proxies/{ApiClient.quote(self.name)}"

    async def hosts(self) -> list[str]:
        p = await self._call("GET", self._path)
        return [_host(p["listen"]), _host(p["upstream"])]

    async def _open_ids(self) -> set[int]:
        conns = await self._call("GET", f"{self._path}/connections")
        return {int(c["id"]) for c in conns if c.get("state") != "closing"}

    async def apply_mode(
        self, mode: str, *, stream: str, include_new: bool, only: list[int] | None = None
    ) -> dict[str, Any]:
        row = MODES.get(mode)
        if row is None or not row.per_connection:
            body = fault_body(mode, stream=stream, include_new=include_new)
            r = await self._call("POST", f"{self._path}/faults", body)
            return {"connections": r["connections"]} if "connections" in r else {}
        # The server answers 404 for an id no longer open, so the ids are read first;
        # one that closed between the read and the call is the same 404, and an error.
        before = await self._open_ids()
        if only is not None:
            only = sorted(before.intersection(only))
            if not only:
                return {"connections": 0, "conns": []}
        body = fault_body(mode, stream=stream, include_new=include_new, connections=only)
        r = await self._call("POST", f"{self._path}/faults", body)
        after = await self._open_ids() if row.undone_by else set()
        return _taken(mode, r.get("connections"), before, only, lambda: after)

    async def add_toxic(
        self, name: str, type_name: str, stream: str, attributes: dict[str, Any]
    ) -> dict[str, Any]:
        body = {"name": name, "type": type_name, "stream": stream, "attributes": attributes}
        await self._call("POST", f"{self._path}/toxics", body)
        return {"toxic": name}

    async def remove_toxic(self, name: str) -> dict[str, Any]:
        try:
            await self._call("DELETE", f"{self._path}/toxics/{ApiClient.quote(name)}")
        except TargetAbsent:
            return {"toxic": name, "already_gone": True}
        return {"toxic": name}
