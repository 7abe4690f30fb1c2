"""The enclave server: a small, real IRC server for bots, with a bot registry.

Run it with ``enclave-server --state DIR`` (or ``python -m harness.enclave``); in tests
use :func:`open_server`. It listens on loopback only and speaks RFC 1459/2812 lines
(CRLF, 512 bytes) plus IRCv3 ``CAP LS 302``/``REQ``/``END``, SASL ``PLAIN``,
``echo-message``, ``message-tags`` and ``server-time``; any ordinary IRC client can
connect. The last parameter of every line it sends is a trailing parameter (``:``), so
a one-word message body arrives intact.

Commands: NICK, USER, PASS, CAP, AUTHENTICATE, JOIN, PART, PRIVMSG, NOTICE, TAGMSG,
PING, PONG, QUIT, plus minimal NAMES, WHO, MODE, MOTD so common clients are content.

Inside: :mod:`._engine` is the command engine, pure (lines in; lines, closes and events
out; tested by tables), and :mod:`._server` its trio shell (sockets, send queues, flood
control, keepalive); :mod:`._registry` the bot registry, :mod:`._flood` the flood
bucket, :mod:`._client` the leader's side of EnclaveServ.

Authentication
==============

A nick that has a row in the registry (``DIR/registry.sqlite3``) can only be used with
its token: SASL PLAIN (authcid = nick, password = token) or ``PASS <token>`` before
registration. A wrong, expired or revoked token, or none, gets
``464 * :Password incorrect: <reason>`` and the connection is closed. Any other nick
connects as a guest (observers, plain clients). A bot that reconnects with valid
credentials while a dead connection still holds its nick takes the nick over; the old
connection is closed ("Ghost replaced").

The leader's commands (EnclaveServ)
===================================

A leader (the bot whose token ``mint-leader`` or ``harness.env up`` created) sends::

    PRIVMSG EnclaveServ :SPAWN <nick> <expires-in-seconds>
    PRIVMSG EnclaveServ :REVOKE <nick>
    PRIVMSG EnclaveServ :HELP

and EnclaveServ answers with one NOTICE addressed to the leader:

=================================================  ==========================================
reply                                              meaning
=================================================  ==========================================
``SPAWNED <nick> <token> <expires-unix>``          worker minted; token is 64 hex; the bot
                                                   must connect before ``expires-unix``
                                                   (integer Unix seconds, the requested
                                                   lifetime rounded up to a whole second)
``REVOKED <nick>``                                 row disabled, live connection dropped
``ERROR SPAWN <nick> QUOTA_EXCEEDED :<text>``      the owner already has 3 live bots (the
                                                   leader counts; revoked or expired ones
                                                   do not)
``ERROR SPAWN <nick> NAME_TAKEN :<text>``          the nick was registered before (revoked
                                                   and expired nicks stay burned) or a
                                                   connected guest holds it
``ERROR <SPAWN|REVOKE> <nick> NOT_ALLOWED :<t>``   the sender is not an authenticated live
                                                   leader; or REVOKE of another owner's bot
                                                   or of the leader itself
``ERROR REVOKE <nick> NOT_FOUND :<text>``          no such bot, or already revoked
``ERROR <VERB> <nick> BAD_REQUEST :<text>``        malformed request: invalid nick, lifetime
                                                   not a positive number of seconds
                                                   (``30``, ``1.5``, ``30s``/``30m``/``2h``/
                                                   ``1d`` also accepted), unknown verb
=================================================  ==========================================

From Python, on a leader's observer connection: :func:`spawn_worker` and
:func:`revoke_worker` (an ERROR reply raises :class:`EnclaveServError` with ``.code``).

Keepalive
=========

After ``--ping-interval`` seconds (default 90) with no bytes from a client the server
sends ``PING :<token>``; a client that sends nothing within ``--ping-timeout`` seconds
more (default 60) is dropped with ``ERROR :Closing Link: <host> (Ping timeout: N
seconds)``. A client's own ``PING <token>`` is answered ``PONG enclave :<token>`` after
every earlier line of that client has been processed, so the PONG proves the server
consumed what was sent before it.

Flood control
=============

Each client may send a burst of ``--flood-burst`` lines (default 500), then
``--flood-rate`` lines per second (default 100; 0 switches it off). Lines beyond that
are not lost: the server stops reading that client until it may take the next one, so
the flooder's own writes block. A client whose lines have all had to wait for
``--excess-flood`` seconds running (default 10) is dropped with ``ERROR :Closing Link:
<host> (Excess Flood)``. Its channel peers, reading at any ordinary pace, are not
dropped for SendQ on its account.

Event log
=========

One JSON object per line on stderr per connection event (``listening``, ``accepted``,
``registered``, ``auth_failed``, ``joined``, ``ping_sent``, ``ping_timeout``, ``excess_flood``,
``ghost_replaced``, ``spawned``, ``revoked``, ``expired``, ``service_error``,
``closed``, ``signal``, ``stopped``), plus one plain line ``LISTENING <host> <port>``.
:func:`read_events` reads them back. Records are written synchronously, so stderr must
be a file (``harness.env`` uses ``DIR/server.log``) or a pipe that someone drains: a full
pipe would stall the server.
"""

from drivers.irc import IrcLine, format_line, parse_line
from harness.enclave._client import (
    EnclaveServError,
    revoke_worker,
    spawn_worker,
    spawn_worker_full,
)
from harness.enclave._events import read_events
from harness.enclave._flood import FloodLimits
from harness.enclave._registry import (
    QUOTA,
    REGISTRY_FILE,
    SERVICE_NICK,
    BotRecord,
    Registry,
    RegistryError,
)
from harness.enclave._server import EnclaveServer, ServerConfig, open_server

__all__ = [
    "QUOTA",
    "REGISTRY_FILE",
    "SERVICE_NICK",
    "BotRecord",
    "EnclaveServError",
    "EnclaveServer",
    "FloodLimits",
    "IrcLine",
    "Registry",
    "RegistryError",
    "ServerConfig",
    "format_line",
    "open_server",
    "parse_line",
    "read_events",
    "revoke_worker",
    "spawn_worker",
    "spawn_worker_full",
]
