"""The bot's configuration: environment variables and defect switches.

Every timing is read from the environment so an experiment can run the bot at real time
or scaled down by orders of magnitude; nothing here has a side effect. A bad value raises
:class:`ConfigError` with one line naming the variable, which the command prints and
turns into exit status 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "DEFECTS",
    "ENV_DOC",
    "BotConfig",
    "ConfigError",
    "config_from_env",
]

#: The defect switches, each off by default. Switching one on changes exactly one
#: behaviour, so that the two arms of a matched pair differ by one command-line flag.
DEFECTS: dict[str, str] = {
    "outbound-refreshes-idle": (
        "outbound traffic also refreshes the keepalive idle clock: a bot that writes more "
        "often than the idle threshold never PINGs and never notices a dead link"
    ),
    "no-confirm": (
        "send-channel claims 'Broadcast to ...' as soon as the PRIVMSG is written, "
        "without waiting for the server to confirm it"
    ),
    "leak-fd-on-reconnect": (
        "the socket of each dropped link is dup()ed before it is closed and the copy is "
        "never closed: one descriptor leaks per reconnect"
    ),
    "drop-caps-on-reconnect": (
        "after a reconnect only 'sasl' is requested again; echo-message, message-tags and "
        "server-time are lost on every connection but the first"
    ),
    "stall-loop-on-confirm": (
        "after writing a post and its PING, the event loop is blocked (a synchronous sleep) "
        "for 60% of the confirmation budget: confirmations still arrive within the budget, "
        "but only once the loop runs again"
    ),
}

#: (variable, default or None if required, meaning) -- the single source for --help and
#: the package docstring's table.
ENV_DOC: tuple[tuple[str, str | None, str], ...] = (
    ("ENCLAVE_HOST", "127.0.0.1", "enclave server host"),
    ("ENCLAVE_PORT", None, "enclave server port"),
    ("ENCLAVE_TOKEN", None, "this bot's registry token, 64 hex (the SASL PLAIN password)"),
    ("ENCLAVE_NICK", None, "this bot's nick, as registered (the SASL authcid)"),
    ("ENCLAVE_CHANNEL", "#enclave", "the channel the bot joins and posts to"),
    ("BOT_KEEPALIVE_IDLE_S", "60", "PING after this long with no INBOUND traffic"),
    ("BOT_PONG_TIMEOUT_S", "30", "no PONG this long after a keepalive PING: drop the link"),
    ("BOT_CONFIRM_BUDGET_S", "3", "a post waits this long for its confirming PONG"),
    ("BOT_RECONNECT_BASE_S", "1", "first reconnect back-off; doubles per failed attempt"),
    ("BOT_RECONNECT_MAX_S", "16", "back-off ceiling"),
    ("BOT_REGISTER_TIMEOUT_S", "10", "bound on TCP connect + CAP/SASL + registration + JOIN"),
    ("BOT_SERVICE_TIMEOUT_S", "10", "spawn-worker/revoke-worker wait this long for EnclaveServ"),
    ("BOT_EVENT_LOG", "", "optional path: BOTEVENT records are also appended there as JSONL"),
)

_NICK_RE = re.compile(r"^[A-Za-z\[\]\\`_^{|}][A-Za-z0-9\[\]\\`_^{|}-]{0,29}$")
_CHANNEL_RE = re.compile(r"^[#&][^\s,\x07\x00]{1,49}$")


class ConfigError(Exception):
    """The environment or the command line is unusable; the message is one line."""


@dataclass(frozen=True)
class BotConfig:
    """Everything the bot needs, already validated. Times are seconds (floats)."""

    host: str
    port: int
    token: str
    nick: str
    channel: str = "#enclave"
    keepalive_idle_s: float = 60.0
    pong_timeout_s: float = 30.0
    confirm_budget_s: float = 3.0
    reconnect_base_s: float = 1.0
    reconnect_max_s: float = 16.0
    register_timeout_s: float = 10.0
    service_timeout_s: float = 10.0
    event_log: str | None = None
    defects: frozenset[str] = field(default_factory=frozenset)

    def has(self, defect: str) -> bool:
        """Is the defect switch *defect* on? (KeyError for a name that is no defect.)"""
        if defect not in DEFECTS:
            raise KeyError(defect)
        return defect in self.defects


def _positive_seconds(env: Mapping[str, str], name: str, default: str) -> float:
    raw = env.get(name, "").strip() or default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={raw!r} must be a positive, finite number of seconds")
    return value


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set (see --help for the environment the bot needs)")
    return value


def config_from_env(env: Mapping[str, str], defects: Iterable[str] = ()) -> BotConfig:
    """Build a :class:`BotConfig` from *env* (e.g. ``os.environ``) and defect names.

    Raises :class:`ConfigError` naming the first variable that is missing or malformed.
    """
    chosen = frozenset(defects)
    unknown = sorted(chosen - DEFECTS.keys())
    if unknown:
        raise ConfigError(f"unknown defect {unknown[0]!r} (known: {', '.join(DEFECTS)})")

    raw_port = _required(env, "ENCLAVE_PORT")
    try:
        port = int(raw_port)
    except ValueError:
        raise ConfigError(f"ENCLAVE_PORT={raw_port!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"ENCLAVE_PORT={raw_port!r} is outside 1..65535")

    token = _required(env, "ENCLAVE_TOKEN")
    if any(ch.isspace() for ch in token):
        raise ConfigError("ENCLAVE_TOKEN contains whitespace")
    nick = _required(env, "ENCLAVE_NICK")
    if not _NICK_RE.match(nick):
        raise ConfigError(f"ENCLAVE_NICK={nick!r} is not a valid IRC nick")
    channel = env.get("ENCLAVE_CHANNEL", "").strip() or "#enclave"
    if not _CHANNEL_RE.match(channel):
        raise ConfigError(f"ENCLAVE_CHANNEL={channel!r} is not a channel name (#name)")

    base = _positive_seconds(env, "BOT_RECONNECT_BASE_S", "1")
    ceiling = _positive_seconds(env, "BOT_RECONNECT_MAX_S", "16")
    if ceiling < base:
        raise ConfigError(f"BOT_RECONNECT_MAX_S={ceiling:g} is below BOT_RECONNECT_BASE_S={base:g}")

    return BotConfig(
        host=env.get("ENCLAVE_HOST", "").strip() or "127.0.0.1",
        port=port,
        token=token,
        nick=nick,
        channel=channel,
        keepalive_idle_s=_positive_seconds(env, "BOT_KEEPALIVE_IDLE_S", "60"),
        pong_timeout_s=_positive_seconds(env, "BOT_PONG_TIMEOUT_S", "30"),
        confirm_budget_s=_positive_seconds(env, "BOT_CONFIRM_BUDGET_S", "3"),
        reconnect_base_s=base,
        reconnect_max_s=ceiling,
        register_timeout_s=_positive_seconds(env, "BOT_REGISTER_TIMEOUT_S", "10"),
        service_timeout_s=_positive_seconds(env, "BOT_SERVICE_TIMEOUT_S", "10"),
        event_log=env.get("BOT_EVENT_LOG", "").strip() or None,
        defects=chosen,
    )
