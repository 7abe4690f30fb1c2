"""A small blocking client for the server's HTTP API (standard library only).

Used by the ``faultnet`` client commands. Any Toxiproxy server answers the Toxiproxy
routes too.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

__all__ = [
    "DEFAULT_API",
    "ApiClient",
    "ApiFailure",
    "ApiUnavailable",
    "BadApiUrl",
    "fault_body",
]

DEFAULT_API = "http://127.0.0.1:8474"


def fault_body(
    mode: str, *, stream: str = "both", include_new: bool = False, **params: Any
) -> dict[str, Any]:
    """The body of ``POST /proxies/{name}/faults`` for *mode*. What is at the server's
    default is left out: ``stream`` both, ``include_new`` false, and every other
    parameter given as None (``connections``, ``percent``, ``peer``, a UDP mode's own)."""
    body: dict[str, Any] = {"mode": mode}
    if stream != "both":
        body["stream"] = stream
    if include_new:
        body["include_new"] = True
    body.update((k, v) for k, v in params.items() if v is not None)
    return body


class ApiUnavailable(Exception):
    """The API could not be reached (refused, unresolvable, timed out)."""


class BadApiUrl(ApiUnavailable):
    """The API's URL is not an http(s) URL with a host."""


class ApiFailure(Exception):
    """The API answered with an error status; ``message`` is its ``error`` field."""

    def __init__(self, status: int, message: str, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


class ApiClient:
    """Blocking calls to one server; each returns the decoded JSON body (None if empty)."""

    def __init__(
        self, base_url: str = DEFAULT_API, timeout: float = 30.0, token: str | None = None
    ) -> None:
        """*token*, if given, is sent as ``Authorization: Bearer <token>`` (a server
        started with ``--token``). :class:`BadApiUrl` unless *base_url* is http(s)."""
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadApiUrl(f"the API URL must be http://HOST:PORT, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token = token

    def request(self, method: str, path: str, body: Any = None) -> Any:
        # Here, not at the top: urllib.request brings http.client and email (29 ms), which
        # `faultnet --help` and `--version` need not pay (they import this module).
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                "User-Agent": "faultnet-cli",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            message = (
                parsed.get("error")
                if isinstance(parsed, dict) and isinstance(parsed.get("error"), str)
                else raw.decode(errors="replace").strip() or exc.reason
            )
            raise ApiFailure(exc.code, str(message), parsed) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, timed out, unresolvable
            reason = getattr(exc, "reason", exc)
            why = str(reason) or type(reason).__name__
            raise ApiUnavailable(f"cannot reach the API at {self.base_url}: {why}") from None
        return json.loads(raw) if raw.strip() else None

    @staticmethod
    def quote(name: str) -> str:
        return urllib.parse.quote(name, safe="")
