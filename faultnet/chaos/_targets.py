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
    async def apply_mode(self, mode: str, *, stream: str, include_new: bool) -> dict[str, Any]:
        """Apply a fault mode (or an undoing mode such as thaw or restore)."""

    @abstractmethod
    async def add_toxic(
        self, name: str, type_name: str, stream: str, attributes: dict[str, Any]
    ) -> dict[str, Any]: ...

    @abstractmethod
    async def remove_toxic(self, name: str) -> dict[str, Any]:
        """Remove a toxic; ``{"already_gone": True}`` if it was not there."""


class LocalTarget(ProxyTarget):
    """A :class:`faultnet.Proxy` running in this process."""

    def __init__(self, key: str, proxy: Any) -> None:
        super().__init__(key)
        self.proxy = proxy

    async def hosts(self) -> list[str]:
        listen = self.proxy.address or self.proxy.listen
        return [listen[0], self.proxy.upstream[0]]

    async def apply_mode(self, mode: str, *, stream: str, include_new: bool) -> dict[str, Any]:
        try:
            n = await self.proxy.apply(mode, stream=stream, include_new=include_new)
        except Exception as exc:  # ProxyError, ValueError: one line in the log
            raise TargetFailed(f"{mode}: {exc}") from None
        return {"connections": n} if isinstance(n, int) else {}

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

    async def apply_mode(self, mode: str, *, stream: str, include_new: bool) -> dict[str, Any]:
        body = fault_body(mode, stream=stream, include_new=include_new)
        r = await self._call("POST", f"{self._path}/faults", body)
        return {"connections": r["connections"]} if "connections" in r else {}

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
