"""The bot contract, read: a delivery claim and a ``BOTEVENT`` line, as every consumer of a
bot's output reads them (the experiments while they run, the report afterwards from the
run directory).

The contract itself, what any bot under test (``BOT_BIN``) must offer for the
experiments to measure it:

* it is an MCP server on stdio, configured by its environment: the IRC server's host and
  port, its token, nick and channel, and its timings (keepalive idle, PONG timeout,
  confirmation budget, reconnect ceiling), so that a run can be real time or scaled;
* its tools are ``status``, ``send-channel {text}``, ``spawn-worker {nick, expires-in}``
  and ``revoke-worker {nick}``; a ``send-channel`` result that claims delivery says
  ``Broadcast to #chan`` (:func:`claims_delivery`), one that could not confirm it says
  ``UNCONFIRMED``;
* every channel message it receives reaches its MCP client as a notification;
* each transport event (connected, PONG timeout, reconnected, a post confirmed or
  unconfirmed with its elapsed milliseconds) is one ``BOTEVENT {json}`` line on its
  stderr (:func:`parse_botevents`).

``harness.bot`` is the reference implementation, with defect switches that break one
promise each (``python -m harness.bot --help``).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["BOTEVENT_RE", "claims_delivery", "parse_botevents"]

BOTEVENT_RE = re.compile(r"^BOTEVENT (\{.*\})\s*$")


def claims_delivery(text: str) -> bool:
    """Did a send-channel result claim the message was delivered?

    "Broadcast to" is the contract's delivery claim; a result that also says UNCONFIRMED
    claims nothing whatever verb it leads with.
    """
    return "UNCONFIRMED" not in text and "Broadcast to" in text


def parse_botevents(stderr_text: str) -> list[dict[str, Any]]:
    """Every ``BOTEVENT {json}`` line of a bot's stderr, in order (bad JSON skipped)."""
    out: list[dict[str, Any]] = []
    for line in stderr_text.splitlines():
        m = BOTEVENT_RE.match(line.strip())
        if not m:
            continue
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
