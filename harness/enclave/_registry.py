"""The bot registry: owners, their bots, tokens, quota, expiry, revocation (SQLite).

One file, ``DIR/registry.sqlite3``, shared between the server and the ``mint-leader``
command (which may run while the server does). Semantics:

* **Tokens** are 64 lowercase hex characters (32 random bytes). Only their SHA-256 is
  stored; a token is shown once, when it is minted.
* **A nick is burned forever** once it has a row: revoking sets ``revoked_at`` and an
  expired row stays; neither frees the name for a new spawn.
* **Quota**: an owner may hold :data:`QUOTA` *live* bots (not revoked, not expired), its
  leader counting. Spawn checks and inserts inside one ``BEGIN IMMEDIATE`` transaction,
  so two concurrent spawns can never both take the last slot.
* **Expiry** is an integer Unix time, the requested lifetime rounded *up* to the next
  whole second (so a bot lives at least as long as asked, and less than one second more).
  The value shown in ``SPAWNED`` is exactly the value enforced.
* Nicks compare with RFC 1459 case mapping.
* The registry keeps no state in memory: every call reads the file, so a row changed by
  another process is seen at once.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from drivers.irc import casefold

__all__ = [
    "QUOTA",
    "REGISTRY_FILE",
    "SERVICE_NICK",
    "BotRecord",
    "Registry",
    "RegistryError",
    "valid_nick",
]

QUOTA = 3
#: The service a leader talks to for SPAWN and REVOKE (reserved: no bot may take it).
SERVICE_NICK = "EnclaveServ"
REGISTRY_FILE = "registry.sqlite3"
#: A nick: a letter or special first, then letters, digits, specials or '-'; at most 30.
_NICK_RE = re.compile(r"^[A-Za-z\[\]\\`_^{|}][A-Za-z0-9\[\]\\`_^{|}-]{0,29}$")
#: Lifetimes above this are a typo, not a wish (ten years).
MAX_EXPIRES_S = 10 * 365 * 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS owners (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bots (
    nick_key TEXT PRIMARY KEY,
    nick TEXT NOT NULL,
    owner_id INTEGER NOT NULL REFERENCES owners(id),
    role TEXT NOT NULL CHECK (role IN ('leader', 'worker')),
    token_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at INTEGER,
    revoked_at REAL
);
"""


def valid_nick(nick: str) -> bool:
    return bool(_NICK_RE.match(nick))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RegistryError(Exception):
    """A refused registry operation. ``code`` is one of the contract's error codes."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


@dataclass(frozen=True)
class BotRecord:
    nick: str
    owner: str
    role: str  # "leader" | "worker"
    created_at: float
    expires_at: int | None
    revoked_at: float | None

    def live(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


class Registry:
    """Access to ``registry.sqlite3`` in a state directory (created on first use)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / REGISTRY_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN ourselves so a transaction is exactly the
        # span we mean. timeout: another process may hold the write lock briefly.
        self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _row(self, nick: str) -> BotRecord | None:
        row = self._db.execute(
            "SELECT b.nick, o.name, b.role, b.created_at, b.expires_at, b.revoked_at "
            "FROM bots b JOIN owners o ON o.id = b.owner_id WHERE b.nick_key = ?",
            (casefold(nick),),
        ).fetchone()
        return BotRecord(*row) if row else None

    def lookup(self, nick: str) -> BotRecord | None:
        """The row for *nick* (live, expired or revoked), or None if it was never used."""
        return self._row(nick)

    def bots(self) -> list[BotRecord]:
        rows = self._db.execute(
            "SELECT b.nick, o.name, b.role, b.created_at, b.expires_at, b.revoked_at "
            "FROM bots b JOIN owners o ON o.id = b.owner_id ORDER BY b.created_at"
        ).fetchall()
        return [BotRecord(*r) for r in rows]

    def live_count(self, owner: str, now: float | None = None) -> int:
        now = time.time() if now is None else now
        (n,) = self._db.execute(
            "SELECT COUNT(*) FROM bots b JOIN owners o ON o.id = b.owner_id "
            "WHERE o.name = ? AND b.revoked_at IS NULL "
            "AND (b.expires_at IS NULL OR b.expires_at > ?)",
            (owner, now),
        ).fetchone()
        return int(n)

    def mint_leader(self, nick: str) -> str:
        """Create an owner named *nick* and its leader bot *nick*; return the token.

        Raises RegistryError BAD_REQUEST (invalid nick) or NAME_TAKEN.
        """
        if not valid_nick(nick) or casefold(nick) == casefold(SERVICE_NICK):
            raise RegistryError("BAD_REQUEST", f"invalid nick {nick!r}")
        token = secrets.token_hex(32)
        now = time.time()
        with self._write() as db:
            if self._row(nick) is not None:
                raise RegistryError("NAME_TAKEN", f"nick {nick} is already registered")
            if db.execute("SELECT 1 FROM owners WHERE name = ?", (nick,)).fetchone():
                raise RegistryError("NAME_TAKEN", f"owner {nick} already exists")
            cur = db.execute("INSERT INTO owners (name, created_at) VALUES (?, ?)", (nick, now))
            db.execute(
                "INSERT INTO bots VALUES (?, ?, ?, 'leader', ?, ?, NULL, NULL)",
                (casefold(nick), nick, cur.lastrowid, _hash(token), now),
            )
        return token

    def spawn(
        self, leader: str, nick: str, expires_in: float, now: float | None = None
    ) -> tuple[str, int]:
        """Mint a worker *nick* for *leader*'s owner; return ``(token, expires_unix)``.

        Checked in this order: BAD_REQUEST (nick or lifetime), NOT_ALLOWED (caller is not
        a live leader), NAME_TAKEN (the nick has ever been registered),
        QUOTA_EXCEEDED (the owner already has :data:`QUOTA` live bots).
        """
        now = time.time() if now is None else now
        if not valid_nick(nick) or casefold(nick) == casefold(SERVICE_NICK):
            raise RegistryError("BAD_REQUEST", f"invalid nick {nick!r}")
        if not (math.isfinite(expires_in) and 0 < expires_in <= MAX_EXPIRES_S):
            raise RegistryError(
                "BAD_REQUEST", f"expires-in must be > 0 and <= {MAX_EXPIRES_S} seconds"
            )
        expires_at = math.ceil(now + expires_in)
        token = secrets.token_hex(32)
        with self._write() as db:
            me = self._row(leader)
            if me is None or me.role != "leader" or not me.live(now):
                raise RegistryError("NOT_ALLOWED", "only a live leader may spawn")
            taken = self._row(nick)
            if taken is not None:
                state = "revoked" if taken.revoked_at is not None else "registered"
                raise RegistryError("NAME_TAKEN", f"nick {taken.nick} is {state} (burned)")
            live = self.live_count(me.owner, now)
            if live >= QUOTA:
                raise RegistryError(
                    "QUOTA_EXCEEDED",
                    f"owner {me.owner} has {live} live bots of {QUOTA}, the leader counting",
                )
            (owner_id,) = db.execute("SELECT id FROM owners WHERE name = ?", (me.owner,)).fetchone()
            db.execute(
                "INSERT INTO bots VALUES (?, ?, ?, 'worker', ?, ?, ?, NULL)",
                (casefold(nick), nick, owner_id, _hash(token), now, expires_at),
            )
        return token, expires_at

    def revoke(self, leader: str, nick: str, now: float | None = None) -> BotRecord:
        """Disable *nick* (a worker of *leader*'s owner); the nick stays burned.

        Errors: BAD_REQUEST (invalid nick), NOT_ALLOWED (caller is not a live leader, the
        bot belongs to another owner, or it is the leader itself), NOT_FOUND (no such bot,
        or already revoked).
        """
        now = time.time() if now is None else now
        if not valid_nick(nick):
            raise RegistryError("BAD_REQUEST", f"invalid nick {nick!r}")
        with self._write() as db:
            me = self._row(leader)
            if me is None or me.role != "leader" or not me.live(now):
                raise RegistryError("NOT_ALLOWED", "only a live leader may revoke")
            row = self._row(nick)
            if row is None:
                raise RegistryError("NOT_FOUND", f"no bot named {nick}")
            if row.owner != me.owner:
                raise RegistryError("NOT_ALLOWED", f"{row.nick} belongs to another owner")
            if row.role == "leader":
                raise RegistryError("NOT_ALLOWED", "a leader cannot revoke itself")
            if row.revoked_at is not None:
                raise RegistryError("NOT_FOUND", f"{row.nick} is already revoked")
            db.execute("UPDATE bots SET revoked_at = ? WHERE nick_key = ?", (now, casefold(nick)))
        updated = self._row(nick)
        assert updated is not None
        return updated

    def authenticate(
        self, nick: str, token: str, now: float | None = None
    ) -> tuple[BotRecord | None, str]:
        """Check *token* for *nick*: ``(record, "ok")`` or ``(None, reason)``.

        Reasons: "unknown nick", "bad token", "revoked", "expired". The token comparison
        is constant-time.
        """
        now = time.time() if now is None else now
        row = self._db.execute(
            "SELECT token_sha256 FROM bots WHERE nick_key = ?", (casefold(nick),)
        ).fetchone()
        if row is None:
            return None, "unknown nick"
        if not hmac.compare_digest(row[0], _hash(token)):
            return None, "bad token"
        rec = self._row(nick)
        assert rec is not None
        if rec.revoked_at is not None:
            return None, "revoked"
        if rec.expires_at is not None and now >= rec.expires_at:
            return None, "expired"
        return rec, "ok"
