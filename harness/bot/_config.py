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
    "AUTH_MODES",
    "DEFECTS",
    "ENV_DOC",
    "TIMINGS",
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

#: How the bot logs in (``BOT_AUTH``). ``auto`` is what real bots do: SASL PLAIN when
#: the server's ``CAP LS`` offers it, else ``PASS`` (the server password, e.g. Debian's
#: ngircd, which has no SASL), and nothing at all when no token is configured.
AUTH_MODES: dict[str, str] = {
    "auto": "SASL PLAIN if the server offers it, else PASS; none without a token",
    "sasl": "SASL PLAIN only (a server without it is a failed attempt)",
    "pass": "PASS <token> before NICK/USER, even where SASL is offered",
    "none": "no credentials (a guest on the enclave; any open server)",
}

#: The timing settings, each written once: (BotConfig field, variable, default seconds,
#: meaning). BotConfig's fields, config_from_env and --help all come from this table.
TIMINGS: tuple[tuple[str, str, str, str], ...] = (
    (
        "keepalive_idle_s",
        "BOT_KEEPALIVE_IDLE_S",
        "60",
        "PING after this long with no INBOUND traffic",
    ),
    (
        "pong_timeout_s",
        "BOT_PONG_TIMEOUT_S",
        "30",
        "no PONG this long after a keepalive PING: drop the link",
    ),
    (
        "confirm_budget_s",
        "BOT_CONFIRM_BUDGET_S",
        "3",
        "a post waits this long for its confirming PONG",
    ),
    (
        "reconnect_base_s",
        "BOT_RECONNECT_BASE_S",
        "1",
        "first reconnect back-off; doubles per failed attempt",
    ),
    ("reconnect_max_s", "BOT_RECONNECT_MAX_S", "16", "back-off ceiling"),
    (
        "register_timeout_s",
        "BOT_REGISTER_TIMEOUT_S",
        "10",
        "bound on TCP connect + CAP/auth + registration + JOIN",
    ),
    (
        "service_timeout_s",
        "BOT_SERVICE_TIMEOUT_S",
        "10",
        "spawn-worker/revoke-worker wait this long for EnclaveServ",
    ),
)

#: (variable, default or None if required, meaning) -- the single source for --help and
#: the package docstring's table.
ENV_DOC: tuple[tuple[str, str | None, str], ...] = (
    ("ENCLAVE_HOST", "127.0.0.1", "IRC server host (the enclave, or any IRC server)"),
    ("ENCLAVE_PORT", None, "IRC server port"),
    ("ENCLAVE_TOKEN", "", "this bot's token: its SASL PLAIN password, or its PASS"),
    ("ENCLAVE_NICK", None, "this bot's nick, as registered (the SASL authcid)"),
    ("ENCLAVE_CHANNEL", "#enclave", "the channel the bot joins and posts to"),
    (
        "BOT_AUTH",
        "auto",
        "auto: SASL PLAIN if offered, else PASS, none without a token; or sasl|pass|none",
    ),
    *((var, default, text) for _field, var, default, text in TIMINGS),
    ("BOT_EVENT_LOG", "", "optional path: BOTEVENT records are also appended there as JSONL"),
)

_NICK_RE = re.compile(r"^[A-Za-z\[\]\\`_^{|}][A-Za-z0-9\[\]\\`_^{|}-]{0,29}$")
_CHANNEL_RE = re.compile(r"^[#&][^\s,\x07\x00]{1,49}$")


class ConfigError(Exception):
    """The environment or the command line is unusable; the message is one line."""


@dataclass(frozen=True)
class BotConfig:
    """Everything the bot needs, already validated. Times are seconds (floats); their
    defaults are in :data:`TIMINGS`. ``token`` is None when none is configured, and
    ``auth`` is a key of :data:`AUTH_MODES`."""

    host: str
    port: int
    token: str | None
    nick: str
    channel: str
    auth: str
    keepalive_idle_s: float
    pong_timeout_s: float
    confirm_budget_s: float
    reconnect_base_s: float
    reconnect_max_s: float
    register_timeout_s: float
    service_timeout_s: float
    event_log: str | None
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

    token = env.get("ENCLAVE_TOKEN", "").strip() or None
    if token is not None and any(ch.isspace() for ch in token):
        raise ConfigError("ENCLAVE_TOKEN contains whitespace")
    auth = env.get("BOT_AUTH", "").strip().lower() or "auto"
    if auth not in AUTH_MODES:
        raise ConfigError(f"BOT_AUTH={auth!r} is not one of {', '.join(AUTH_MODES)}")
    if auth in ("sasl", "pass") and token is None:
        raise ConfigError(f"BOT_AUTH={auth} needs ENCLAVE_TOKEN (it is not set)")
    nick = _required(env, "ENCLAVE_NICK")
    if not _NICK_RE.match(nick):
        raise ConfigError(f"ENCLAVE_NICK={nick!r} is not a valid IRC nick")
    channel = env.get("ENCLAVE_CHANNEL", "").strip() or "#enclave"
    if not _CHANNEL_RE.match(channel):
        raise ConfigError(f"ENCLAVE_CHANNEL={channel!r} is not a channel name (#name)")

    timings = {f: _positive_seconds(env, var, default) for f, var, default, _ in TIMINGS}
    if timings["reconnect_max_s"] < timings["reconnect_base_s"]:
        raise ConfigError(
            f"BOT_RECONNECT_MAX_S={timings['reconnect_max_s']:g} is below "
            f"BOT_RECONNECT_BASE_S={timings['reconnect_base_s']:g}"
        )
    return BotConfig(
        host=env.get("ENCLAVE_HOST", "").strip() or "127.0.0.1",
        port=port,
        token=token,
        nick=nick,
        channel=channel,
        auth=auth,
        event_log=env.get("BOT_EVENT_LOG", "").strip() or None,
        defects=chosen,
        **timings,
    )
