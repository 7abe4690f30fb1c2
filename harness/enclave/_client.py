"""A leader's side of EnclaveServ: spawn and revoke workers over an IRC connection.

Both helpers send one ``PRIVMSG EnclaveServ :...`` on an authenticated leader's
:class:`drivers.irc.Observer` and wait for the matching NOTICE (only notices that arrive
after the request are considered). An ``ERROR`` reply raises :class:`EnclaveServError`
carrying the contract's code; no reply within *timeout* raises ``TimeoutError``.
"""

from __future__ import annotations

import re

from drivers.irc import Observer
from harness.enclave._registry import SERVICE_NICK

__all__ = ["EnclaveServError", "revoke_worker", "spawn_worker"]


class EnclaveServError(Exception):
    """EnclaveServ refused a request: ``verb``, ``nick``, ``code`` and its ``text``."""

    def __init__(self, verb: str, nick: str, code: str, text: str) -> None:
        super().__init__(f"{verb} {nick} refused: {code}: {text}")
        self.verb = verb
        self.nick = nick
        self.code = code
        self.text = text


def _seconds(value: float) -> str:
    # Plain decimal, never an exponent: the server accepts digits with an optional point.
    return format(float(value), "f").rstrip("0").rstrip(".") or "0"


async def _request(
    obs: Observer, verb: str, nick: str, request: str, ok: str, timeout: float
) -> re.Match[str]:
    mark = len(obs.notices)
    await obs.privmsg(SERVICE_NICK, request)
    n = re.escape(nick)
    pattern = re.compile(
        rf"^(?:{ok} {n}(?: (?P<rest>.*))?$|ERROR {verb} {n} (?P<code>\S+) :(?P<text>.*)$)"
    )
    reply = await obs.wait_notice(pattern, timeout, since=mark)
    if reply is None:
        raise TimeoutError(f"{verb} {nick}: no reply from {SERVICE_NICK} within {timeout} s")
    m = pattern.search(reply.text)
    assert m is not None
    if m.group("code"):
        raise EnclaveServError(verb, nick, m.group("code"), m.group("text"))
    return m


async def spawn_worker(obs: Observer, nick: str, expires_s: float, *, timeout: float = 10.0) -> str:
    """Ask EnclaveServ to mint worker *nick* living *expires_s* seconds; return its token.

    The expiry the server enforces is in ``SPAWNED``; use :func:`spawn_worker_full` to
    get it too.
    """
    token, _ = await spawn_worker_full(obs, nick, expires_s, timeout=timeout)
    return token


async def spawn_worker_full(
    obs: Observer, nick: str, expires_s: float, *, timeout: float = 10.0
) -> tuple[str, int]:
    """Like :func:`spawn_worker`, returning ``(token, expires_unix)``."""
    m = await _request(
        obs, "SPAWN", nick, f"SPAWN {nick} {_seconds(expires_s)}", "SPAWNED", timeout
    )
    token, _, expires = (m.group("rest") or "").partition(" ")
    return token, int(expires)


async def revoke_worker(obs: Observer, nick: str, *, timeout: float = 10.0) -> None:
    """Ask EnclaveServ to revoke *nick* (its connection is dropped, the nick burned)."""
    await _request(obs, "REVOKE", nick, f"REVOKE {nick}", "REVOKED", timeout)
