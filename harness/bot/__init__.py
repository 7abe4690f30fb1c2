"""The reference bot under test: an MCP stdio server that lives in the enclave.

It also runs on a standard IRC server (tested against Debian's ngircd): it logs in as
real bots do (``BOT_AUTH``, see :data:`AUTH_MODES`): SASL PLAIN when the server offers
it, ``PASS`` otherwise, nothing when no token is configured. The leader tools need the
enclave's EnclaveServ; everything else is plain IRC.

Run it as ``enclave-bot [--defect NAME ...]`` or ``python -m harness.bot``. It speaks MCP
(official SDK, low-level ``Server``, on trio) on stdin/stdout and IRC to the enclave
server; the two run concurrently in one trio nursery, so a dead IRC link never stalls
the MCP loop and every tool call returns within its own budget.

Environment (times are seconds, floats allowed, so experiments can scale them down):

=========================  ===========  ==================================================
``ENCLAVE_HOST``           127.0.0.1    server host (the enclave, or any IRC server)
``ENCLAVE_PORT``           (required)   server port
``ENCLAVE_TOKEN``          (optional)   this bot's token (SASL PLAIN password, or PASS)
``ENCLAVE_NICK``           (required)   this bot's registered nick (SASL authcid)
``ENCLAVE_CHANNEL``        #enclave     channel joined and posted to
``BOT_AUTH``               auto         SASL PLAIN if offered, else PASS; none w/o token
``BOT_KEEPALIVE_IDLE_S``   60           PING after this long with no INBOUND traffic
``BOT_PONG_TIMEOUT_S``     30           no PONG in this long: ``pong_timeout``, reconnect
``BOT_CONFIRM_BUDGET_S``   3            a post waits this long for its confirming PONG
``BOT_RECONNECT_BASE_S``   1            first back-off after a failed attempt; doubles ...
``BOT_RECONNECT_MAX_S``    16           ... up to this ceiling
``BOT_REGISTER_TIMEOUT_S`` 10           bound on one attempt: connect, CAP, auth, JOIN
``BOT_SERVICE_TIMEOUT_S``  10           spawn-/revoke-worker wait for EnclaveServ
``BOT_EVENT_LOG``          (none)       also append the BOTEVENT records to this JSONL file
=========================  ===========  ==================================================

A missing or malformed variable is one line on stderr and exit status 2.

MCP tools: ``status`` (JSON: connected, session, caps, reconnects, timings, counters),
``send-channel {text}`` ("Broadcast to #chan (1 line); confirmed ..." or a text
containing ``UNCONFIRMED``, then with ``isError``), ``spawn-worker {nick, expires-in}``
(returns the worker's 64-hex token), ``revoke-worker {nick}``. Each channel PRIVMSG the
bot receives (its own too, while echo-message is active) becomes the notification
``notifications/message {level: "info", logger: "channel", data: {channel, from, text,
time}}``.

stderr carries one ``BOTEVENT {json}`` line per transport event (see
:mod:`harness.bot._events`): connected, reconnected, disconnected, pong_timeout,
connect_failed, post_confirm.

Defects (``--defect NAME``, repeatable, each off by default): outbound-refreshes-idle,
no-confirm, leak-fd-on-reconnect, drop-caps-on-reconnect, stall-loop-on-confirm; see
:data:`DEFECTS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultnet.lazyexports import lazy_exports

if TYPE_CHECKING:
    from harness.bot._config import (
        AUTH_MODES,
        DEFECTS,
        ENV_DOC,
        TIMINGS,
        BotConfig,
        ConfigError,
        config_from_env,
    )
    from harness.bot._events import EventSink
    from harness.bot._irc_link import (
        SERVICE_NICK,
        WANTED_CAPS,
        ChannelMessage,
        ConnectFailed,
        IrcLink,
        PostResult,
        ServiceReply,
    )
    from harness.bot._server import BotServer, parse_expires_in, serve

# Names are loaded on first use: the MCP SDK takes ~1 s to import, and `--help` or a
# configuration error must not pay for it.
_WHERE = {
    "AUTH_MODES": "harness.bot._config",
    "TIMINGS": "harness.bot._config",
    "DEFECTS": "harness.bot._config",
    "ENV_DOC": "harness.bot._config",
    "BotConfig": "harness.bot._config",
    "ConfigError": "harness.bot._config",
    "config_from_env": "harness.bot._config",
    "EventSink": "harness.bot._events",
    "SERVICE_NICK": "harness.bot._irc_link",
    "WANTED_CAPS": "harness.bot._irc_link",
    "ChannelMessage": "harness.bot._irc_link",
    "ConnectFailed": "harness.bot._irc_link",
    "IrcLink": "harness.bot._irc_link",
    "PostResult": "harness.bot._irc_link",
    "ServiceReply": "harness.bot._irc_link",
    "BotServer": "harness.bot._server",
    "parse_expires_in": "harness.bot._server",
    "serve": "harness.bot._server",
}

__all__ = [
    "AUTH_MODES",
    "DEFECTS",
    "ENV_DOC",
    "SERVICE_NICK",
    "TIMINGS",
    "WANTED_CAPS",
    "BotConfig",
    "BotServer",
    "ChannelMessage",
    "ConfigError",
    "ConnectFailed",
    "EventSink",
    "IrcLink",
    "PostResult",
    "ServiceReply",
    "config_from_env",
    "parse_expires_in",
    "serve",
]


assert set(__all__) == set(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
