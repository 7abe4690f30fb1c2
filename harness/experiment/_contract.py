"""The bot contract, read: a delivery claim and a ``BOTEVENT`` line, as every consumer of a
bot's output reads them (the experiments while they run, the report afterwards from the
run directory). See DESIGN.md "The reference subject" for the contract itself.
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
