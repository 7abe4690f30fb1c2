"""DNS over UDP: which queries a rule faults and what it does to them (dnspython's wire
format; no I/O, no clock).

A :class:`DnsFaults` is the decider a UDP proxy asks about each datagram: a query in, a
:class:`Decision` out (forward it, as is or after a delay; answer it at once with a reply
made from the query; drop it); an answer in, the bytes to send back (as they came, or
changed by the rule that faulted its query). The actions, per matching query:

=========== ==================================================== ======================
action      what is done                                         what a client sees
=========== ==================================================== ======================
servfail    answered at once, RCODE SERVFAIL, from the query     a server failure
nxdomain    answered at once, RCODE NXDOMAIN                     the name does not exist
refused     answered at once, RCODE REFUSED                      the server refuses
drop        never forwarded                                      a timeout, then its retry
delay       forwarded ``delay_ms`` late                          a slow answer
truncate    forwarded; its answer has TC set, its records gone   a fall back to TCP
rewrite     forwarded; an A (AAAA) answer's addresses become     the given address
            ``address`` (a query of the other family: no data)
=========== ==================================================== ======================

``rewrite`` answers as dnsmasq's ``address=/name/IP`` does: the query's family gets the
address, the other family an answer with no address (NOERROR), whatever the server said.

A rule matches a query by ``qname`` (a glob, ``*`` crossing dots, compared without case
and without a trailing dot) and ``qtype`` (``any``, or one type: ``A``, ``AAAA``...).
``percent`` of matching queries are faulted, each drawn from the seed, the query's name,
type and id (what the client chose, never the arrival order: the same queries meet the
same fates however they interleave; a retry that keeps its id, as dnspython's resolver
and glibc's do within one resolution, meets its query's fate); ``count`` (0: no limit)
faults only the first that many drawn: ``count=2`` fails two tries, the third gets
through. The first rule that matches a query judges it; later rules do not see it.

A datagram that is not a DNS query dnspython parses (a malformed one, a response sent
upstream, an opcode other than QUERY, no question) is forwarded untouched; so is an
answer that pairs with no faulted query, or that dnspython cannot parse.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import random
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from faultnet.seeds import derive_seed

__all__ = ["ACTIONS", "QTYPES", "Decision", "DnsFaults", "DnsRule"]

#: What a rule does to a query it faults (the table above).
ACTIONS = ("servfail", "nxdomain", "refused", "drop", "delay", "truncate", "rewrite")
#: The query types a rule may name (``any``: every type).
QTYPES = ("any", "A", "AAAA", "CNAME", "MX", "TXT", "NS", "SOA", "PTR", "SRV", "SVCB", "HTTPS")
#: The actions answered from the query at once, and their RCODE.
_RCODES = {
    "servfail": dns.rcode.SERVFAIL,
    "nxdomain": dns.rcode.NXDOMAIN,
    "refused": dns.rcode.REFUSED,
}
#: The actions that change the query's answer on its way back.
_ON_ANSWER = ("truncate", "rewrite")
#: Faulted queries whose answer is still awaited (truncate, rewrite). A query whose
#: answer never comes (lost, or the client gone) would stay: the oldest go past this.
PENDING_LIMIT = 4096


@dataclass
class DnsRule:
    """One rule: which queries (``qname``, ``qtype``, ``percent``, ``count``) and what
    is done to them (``action``, with ``delay_ms`` or ``address``). ValueError for a
    value out of its range."""

    action: str
    qname: str = "*"
    qtype: str = "any"
    percent: float = 100.0
    count: int = 0
    delay_ms: float = 0.0
    address: str = ""
    #: Queries that matched, and those faulted (what ``count`` counts).
    matched: int = field(default=0, compare=False)
    faulted: int = field(default=0, compare=False)
    _glob: str = field(default="*", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {self.action!r}")
        if self.qtype not in QTYPES:
            raise ValueError(f"qtype must be one of {', '.join(QTYPES)}, not {self.qtype!r}")
        if not 0 <= self.percent <= 100:
            raise ValueError(f"percent must be a percentage 0-100, not {self.percent}")
        if self.count < 0:
            raise ValueError(f"count must not be negative, not {self.count}")
        if not self.delay_ms >= 0:
            raise ValueError(f"delay_ms must not be negative, not {self.delay_ms}")
        if (self.action == "delay") != bool(self.delay_ms):
            raise ValueError("delay_ms is for action delay, which needs it")
        if (self.action == "rewrite") != bool(self.address):
            raise ValueError("address is for action rewrite, which needs it")
        if self.address:
            try:
                ipaddress.ip_address(self.address)
            except ValueError:
                raise ValueError(
                    f"address must be an IPv4 or IPv6 address, not {self.address!r}"
                ) from None
        self._glob = _canonical(self.qname) or "*"

    def matches(self, qname: str, qtype: str) -> bool:
        """Whether a query of *qname* (any case, trailing dot or not) and *qtype* is one
        this rule names (before ``percent`` and ``count``)."""
        if self.qtype != "any" and qtype != self.qtype:
            return False
        return fnmatch.fnmatchcase(_canonical(qname), self._glob)

    def picks(self, seed: int, qname: str, qtype: str, query_id: int) -> bool:
        """Whether this matching query is faulted: the draw, then the count."""
        self.matched += 1
        if self.count and self.faulted >= self.count:
            return False
        if self.percent < 100:
            key = derive_seed(seed, "dns", _canonical(qname), qtype, query_id)
            if random.Random(key).random() * 100 >= self.percent:
                return False
        self.faulted += 1
        return True

    def to_json(self) -> dict[str, Any]:
        """The rule's fields, in their order, its counts last (the private ones left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


def _parse(data: bytes) -> dns.message.Message | None:
    """dnspython's reading of *data*, or None if it cannot."""
    try:
        return dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError):
        return None


def _canonical(name: str) -> str:
    return name.rstrip(".").lower()


@dataclass(frozen=True)
class Decision:
    """What to do with one datagram sent upstream."""

    #: ``forward`` it (after ``delay_s``), ``answer`` the client with ``reply`` instead,
    #: or ``drop`` it.
    verdict: Literal["forward", "answer", "drop"]
    #: The rule's action when a rule faulted it (the event log's), else None.
    fault: str | None = None
    reply: bytes = b""
    delay_s: float = 0.0
    #: The query as parsed ("" when it was not one).
    qname: str = ""
    qtype: str = ""
    query_id: int = -1

    def to_event(self) -> dict[str, Any]:
        """The fields of its ``dns_fault`` record."""
        fields: dict[str, Any] = {
            "action": self.fault,
            "qname": self.qname,
            "qtype": self.qtype,
            "id": self.query_id,
        }
        if self.delay_s:
            fields["delay_ms"] = round(self.delay_s * 1000.0, 3)
        return fields


FORWARD = Decision("forward")


class DnsFaults:
    """The rules in force on one proxy and the faulted queries whose answers are
    awaited, keyed by the client (*peer*, opaque here), the id and the question."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rules: list[DnsRule] = []
        self._pending: OrderedDict[tuple[object, int, str, int], DnsRule] = OrderedDict()

    def add(self, rule: DnsRule) -> None:
        self.rules.append(rule)

    def clear(self) -> None:
        self.rules.clear()
        self._pending.clear()

    def __bool__(self) -> bool:
        return bool(self.rules or self._pending)

    def query(self, data: bytes, peer: object = None) -> Decision:
        """The decision for one datagram a client sent upstream."""
        if not self.rules:
            return FORWARD
        # One parse, the whole message (~27 us for a small query, measured; dnspython's
        # question_only was no cheaper, ~30 us): a malformed one is never counted.
        query = _parse(data)
        if query is None:
            return FORWARD
        if query.flags & dns.flags.QR or query.opcode() != dns.opcode.QUERY or not query.question:
            return FORWARD
        question = query.question[0]
        qname = question.name.to_text()
        qtype = dns.rdatatype.to_text(question.rdtype)
        for rule in self.rules:
            if rule.matches(qname, qtype):
                break
        else:
            return FORWARD
        if not rule.picks(self.seed, qname, qtype, query.id):
            return FORWARD
        said = Decision("forward", rule.action, qname=qname, qtype=qtype, query_id=query.id)
        if rule.action in _RCODES:
            response = dns.message.make_response(query)
            response.set_rcode(_RCODES[rule.action])
            return replace(said, verdict="answer", reply=response.to_wire())
        if rule.action == "drop":
            return replace(said, verdict="drop")
        if rule.action == "delay":
            return replace(said, delay_s=rule.delay_ms / 1000.0)
        key = (peer, query.id, _canonical(qname), question.rdtype)
        self._pending[key] = rule
        self._pending.move_to_end(key)
        while len(self._pending) > PENDING_LIMIT:
            self._pending.popitem(last=False)
        return said

    def answer(self, data: bytes, peer: object = None) -> bytes:
        """What to send the client for one datagram the server sent: *data*, or the
        answer a truncate or rewrite rule made of it."""
        if not self._pending:
            return data
        response = _parse(data)
        if response is None or not response.question:
            return data
        question = response.question[0]
        key = (peer, response.id, _canonical(question.name.to_text()), question.rdtype)
        rule = self._pending.pop(key, None)
        if rule is None:
            return data
        if rule.action == "truncate":
            response.flags |= dns.flags.TC
            for section in (response.answer, response.authority, response.additional):
                section.clear()  # the OPT record is not in a section: EDNS stays
        else:
            _rewrite(response, question.name, question.rdtype, rule.address)
        return response.to_wire()


def _rewrite(response: dns.message.Message, qname: Any, rdtype: int, address: str) -> None:
    """Make *response* to an A or AAAA query answer *address* as dnsmasq's ``address=``
    does: the query's family gets it alone, under the query's name; the other family
    gets no record (NOERROR)."""
    if rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
        return  # only an address answer is rewritten
    family = dns.rdatatype.A if ipaddress.ip_address(address).version == 4 else dns.rdatatype.AAAA
    response.set_rcode(dns.rcode.NOERROR)
    response.authority.clear()
    response.answer.clear()
    if rdtype == family:
        ttl = 0  # dnsmasq's local-ttl default: its own answers are not cached
        response.answer.append(dns.rrset.from_text(qname, ttl, dns.rdataclass.IN, family, address))
