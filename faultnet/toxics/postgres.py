"""PostgreSQL faults: one ``postgres`` toxic type, on :mod:`faultnet.protocols.postgres`.

What is matched (``at``):

* ``query`` (the default): a simple Query, or an extended-protocol batch (Parse, Bind,
  Execute... Sync), one of whose statement texts matches ``query``: a glob (``match`` =
  ``glob``, the default: case-insensitive, on the text with its runs of white space made
  one space, ``*`` any run of characters; ``""`` any) or a regular expression
  (``match`` = ``regex``: searched in the text as sent);
* ``commit``: the COMMIT (``COMMIT``, ``END``) of a transaction, and with a ``query``,
  of a transaction one of whose statements since its ``BEGIN`` matched it;
* ``startup``: a connection's StartupMessage (the server never sees it).

What is done (``fault``):

* ``error``: an ErrorResponse with ``sqlstate``, ``severity`` and ``message`` (``""``:
  what PostgreSQL says for that SQLSTATE), then what a real server sends next: after
  an ERROR, the server's own ReadyForQuery (the request was swapped for a query that
  fails, or a ``ROLLBACK`` for a COMMIT, so the transaction is where the real failure
  leaves it: ``E`` in a transaction block, ``I`` outside it and after a COMMIT); after a
  FATAL or PANIC, the close. ``severity`` = ``auto`` is FATAL for what PostgreSQL
  sends as FATAL (57P01-57P03, class 08, class 28, 53300, 3D000) and for any startup
  fault, ERROR otherwise;
* ``delay``: the request forwarded ``delay_ms`` late;
* ``hold``: never forwarded, nor anything after it (the client's timeout);
* ``close``: the answer's first ``rows`` DataRows, then the connection closes
  (mid-result: the client never sees the result's end); at startup, a close at once.

``percent`` of matching requests are faulted, each drawn from the proxy's seed, the
toxic's name, the statement's text and the request's place on its connection (what the
client decides, never the arrival order; a startup: the user, the database and the
startups this toxic saw before); ``count`` (0: no limit) faults only the first that
many drawn. ``ssl`` says what an SSLRequest or GSSENCRequest meets: ``pass`` (the
server answers; TLS crosses opaque, unfaulted) or ``refuse`` (answered ``N``).

One type with a ``fault`` attribute rather than a type per fault (``pg_error``,
``pg_delay``...): as the ``dns`` toxic's ``action``, the faults share every other
attribute (what is matched, percent, count, ssl), a switch of fault is a live update of
one toxic, and a retry test reads as one rule. One ``pg_fault`` record per faulted
request. The toxic sees both streams (``both_streams``), whatever its ``stream`` says.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Mapping
from typing import Any

from faultnet.protocols.postgres import (
    PgPlan,
    PgRequest,
    Session,
    error_response,
    is_commit,
    is_transaction_start,
)
from faultnet.toxics._attributes import Attribute, TextAttribute
from faultnet.toxics._protocol import ProtocolToxic, drawn_attributes, fault_attribute
from faultnet.toxics.chain import ToxicStage
from faultnet.toxics.registry import register

__all__ = ["MESSAGES", "Postgres"]

#: What PostgreSQL says for an SQLSTATE (its errcodes and ereports), the default
#: ``message``; ``{user}`` is the connection's user.
MESSAGES = {
    "40001": "could not serialize access due to concurrent update",
    "40P01": "deadlock detected",
    "57P01": "terminating connection due to administrator command",
    "57P02": "terminating connection due to crash of another server process",
    "57P03": "the database system is shutting down",
    "57014": "canceling statement due to statement timeout",
    "53300": "sorry, too many clients already",
    "53100": "could not extend file: No space left on device",
    "55P03": "could not obtain lock on row in relation",
    "25006": "cannot execute statement in a read-only transaction",
    "28P01": 'password authentication failed for user "{user}"',
    "28000": 'no pg_hba.conf entry for host, user "{user}"',
    "3D000": "database does not exist",
    "08006": "connection failure",
}
#: The SQLSTATEs PostgreSQL reports as FATAL (the backend ends), beside classes 08, 28.
_FATAL = frozenset({"57P01", "57P02", "57P03", "53300", "3D000"})


def _sqlstate(text: str) -> None:
    if not re.fullmatch(r"[0-9A-Z]{5}", text):
        raise ValueError(f"sqlstate must be five digits or capitals (40001, 40P01), not {text!r}")


@register
class Postgres(ProtocolToxic):
    """PostgreSQL faults on the requests a client sends (see the module docstring): the
    requests matching ``at`` and ``query``, ``percent`` of them, the first ``count``
    (0: all), meet ``fault``."""

    type = "postgres"
    session_key = "postgres"
    ATTRIBUTES = (
        fault_attribute("request"),
        TextAttribute("at", "query", "which requests are matched", ("query", "commit", "startup")),
        TextAttribute("query", "", "a pattern on the statement text; empty: any"),
        TextAttribute("match", "glob", "how query is read", ("glob", "regex")),
        TextAttribute("sqlstate", "40001", "the error's SQLSTATE", parse=_sqlstate),
        TextAttribute(
            "severity", "auto", "the error's severity", ("auto", "ERROR", "FATAL", "PANIC")
        ),
        TextAttribute("message", "", "the error's message; empty: PostgreSQL's for sqlstate"),
        Attribute("delay_ms", 0, "how late a delayed request is forwarded, in milliseconds"),
        Attribute("rows", 0, "result rows (DataRow messages) the client gets before a close"),
        *drawn_attributes("request", "requests"),
        TextAttribute("ssl", "pass", "what an SSLRequest meets", ("pass", "refuse")),
    )
    fault: str
    at: str
    query: str
    match: str
    sqlstate: str
    severity: str
    message: str
    delay_ms: int
    rows: int
    ssl: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: StartupMessages this toxic drew for, over every connection.
        self.startups = 0

    @classmethod
    def _refuse_inconsistent(cls, values: Mapping[str, Any]) -> None:
        """As a protocol toxic's, and a ``regex`` ``query`` must compile."""
        super()._refuse_inconsistent(values)
        if values["match"] == "regex":
            try:
                re.compile(values["query"])
            except re.error as exc:
                raise ValueError(f"query is not a regular expression: {exc}") from None

    # -- matching --

    def matches(self, text: str) -> bool:
        """Whether ``query`` matches the statement *text*."""
        if not self.query:
            return True
        if self.match == "regex":
            return re.search(self.query, text) is not None
        return fnmatch.fnmatchcase(" ".join(text.split()).lower(), self.query.lower())

    def picked(self, request: PgRequest, conn: dict[str, Any]) -> str | None:
        """The statement text by which *request* is faulted (``""`` at startup), or None
        when ``at`` and ``query`` do not pick it. *conn* is the connection's memory (its
        user, whether its transaction ran a matching statement)."""
        if request.kind == "startup":
            conn["user"] = dict(request.params).get("user", "")
            return "" if self.at == "startup" else None
        if self.at == "query":
            return next((t for t in request.texts if self.matches(t)), None)
        if self.at == "commit":
            for text in request.texts:
                if is_transaction_start(text):
                    conn["touched"] = False
                elif is_commit(text):
                    hit = conn.get("touched", False) or not self.query
                    conn["touched"] = False
                    if hit:
                        return text
                elif self.matches(text):
                    conn["touched"] = True
        return None

    def decide(
        self, request: PgRequest, seed: int, ordinal: int, conn: dict[str, Any]
    ) -> PgPlan | None:
        """The plan for *request*, the *ordinal*-th (from 0) on its connection, or None
        to pass it: ``at`` and ``query``, then the count, then the draw."""
        text = self.picked(request, conn)
        if text is None:
            return None

        def identity() -> tuple[object, ...]:
            if request.kind != "startup":
                return (text, ordinal)
            params = dict(request.params)
            self.startups += 1
            return (params.get("user"), params.get("database"), self.startups - 1)

        if not self._drawn(seed, "request", identity):
            return None
        return self.plan(request, conn.get("user", ""))

    def plan(self, request: PgRequest, user: str) -> PgPlan:
        """What ``fault`` does to *request* (which was picked)."""
        detail: dict[str, object] = {"at": self.at}
        if self.fault == "delay":
            detail["delay_ms"] = self.delay_ms
            return PgPlan("delay", detail, delay=self.delay_ms / 1000)
        if self.fault in ("hold", "close"):
            if self.fault == "close":
                detail["rows"] = self.rows
            return PgPlan(self.fault, detail, rows=self.rows)
        severity = self.severity
        if severity == "auto":
            fatal = request.kind == "startup" or self.sqlstate in _FATAL
            fatal = fatal or self.sqlstate[:2] in ("08", "28")
            severity = "FATAL" if fatal else "ERROR"
        message = self.message or MESSAGES.get(self.sqlstate, "faultnet: an injected fault")
        detail.update(sqlstate=self.sqlstate, severity=severity)
        plan = PgPlan(
            "error" if severity == "ERROR" else "fatal",
            detail,
            error=error_response(severity, self.sqlstate, message.replace("{user}", user)),
        )
        if self.at == "commit":
            plan.substitute = "ROLLBACK"  # a failed COMMIT ends its transaction
        return plan

    # -- the session --

    def new_session(self, stage: ToxicStage) -> Session:
        seed = stage.seed
        conn: dict[str, Any] = {}  # the connection's memory (see picked)
        ordinals = itertools.count()  # every request on this connection, in order
        return Session(
            lambda r: self.decide(r, seed, next(ordinals), conn),
            stage.log_event,
            refuse_ssl=self.ssl == "refuse",
        )
