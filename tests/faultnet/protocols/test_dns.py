"""The DNS decider by tables, with no socket: query bytes in, a decision out; answer
bytes in, the bytes the client gets out (faultnet.protocols.dns)."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest

from faultnet.protocols.dns import PENDING_LIMIT, DnsFaults, DnsRule


def query(name: str = "www.example.test", qtype: str = "A", qid: int = 7) -> bytes:
    q = dns.message.make_query(name, qtype)
    q.id = qid
    return q.to_wire()


def answer_to(data: bytes, *addresses: str) -> bytes:
    q = dns.message.from_wire(data)
    r = dns.message.make_response(q)
    question = q.question[0]
    for a in addresses:
        rdtype = "AAAA" if ":" in a else "A"
        r.answer.append(dns.rrset.from_text(question.name, 300, "IN", rdtype, a))
    return r.to_wire()


def faults(*rules: DnsRule, seed: int = 1) -> DnsFaults:
    f = DnsFaults(seed)
    for rule in rules:
        f.add(rule)
    return f


@pytest.mark.parametrize(
    ("action", "rcode"),
    [("servfail", "SERVFAIL"), ("nxdomain", "NXDOMAIN"), ("refused", "REFUSED")],
)
def test_an_rcode_action_answers_from_the_query_at_once(action: str, rcode: str) -> None:
    q = query(qid=4242)
    d = faults(DnsRule(action)).query(q)
    assert (d.verdict, d.fault, d.qname, d.qtype, d.query_id) == (
        "answer",
        action,
        "www.example.test.",
        "A",
        4242,
    )
    reply = dns.message.from_wire(d.reply)
    assert reply.id == 4242 and reply.flags & dns.flags.QR
    assert dns.rcode.to_text(reply.rcode()) == rcode
    assert reply.question == dns.message.from_wire(q).question and not reply.answer
    # dnspython's own check that this is the answer to that query
    assert dns.message.from_wire(q).is_response(reply)


def test_drop_and_delay_say_so_and_forward_nothing_changed() -> None:
    assert faults(DnsRule("drop")).query(query()).verdict == "drop"
    d = faults(DnsRule("delay", delay_ms=250)).query(query())
    assert (d.verdict, d.delay_s, d.to_event()["delay_ms"]) == ("forward", 0.25, 250.0)


def test_truncate_sets_tc_on_the_answer_and_leaves_no_record() -> None:
    f = faults(DnsRule("truncate"))
    q = query()
    assert f.query(q, peer="c1").verdict == "forward"
    out = dns.message.from_wire(f.answer(answer_to(q, "192.0.2.1", "192.0.2.2"), peer="c1"))
    assert out.flags & dns.flags.TC and not out.answer
    assert dns.rcode.to_text(out.rcode()) == "NOERROR"
    # its pairing is used once: a second answer with that id passes as it came
    again = answer_to(q, "192.0.2.1")
    assert f.answer(again, peer="c1") == again


@pytest.mark.parametrize(
    ("qtype", "address", "expected"),
    [
        ("A", "10.9.9.9", ["10.9.9.9"]),
        ("AAAA", "10.9.9.9", []),  # dnsmasq's address=/name/IPv4: no data for AAAA
        ("AAAA", "2001:db8::9", ["2001:db8::9"]),
        ("A", "2001:db8::9", []),
    ],
)
def test_rewrite_answers_the_address_as_dnsmasq_address_does(
    qtype: str, address: str, expected: list[str]
) -> None:
    f = faults(DnsRule("rewrite", qtype="any", address=address))
    q = query(qtype=qtype)
    f.query(q)
    upstream = "192.0.2.1" if qtype == "A" else "2001:db8::1"
    out = dns.message.from_wire(f.answer(answer_to(q, upstream)))
    assert [rr.to_text() for rrset in out.answer for rr in rrset] == expected
    assert dns.rcode.to_text(out.rcode()) == "NOERROR"


def test_an_answer_is_paired_with_its_query_by_client_id_and_question() -> None:
    f = faults(DnsRule("rewrite", address="10.9.9.9"))
    q = query(qid=1)
    f.query(q, peer="c1")
    untouched = answer_to(q, "192.0.2.1")
    assert f.answer(untouched, peer="c2") == untouched  # another client's id 1
    other = query(name="other.example.test", qid=1)
    assert f.answer(answer_to(other, "192.0.2.1"), peer="c1") == answer_to(other, "192.0.2.1")
    assert f.answer(untouched, peer="c1") != untouched


@pytest.mark.parametrize(
    ("name", "qname", "qtype", "rule_type", "hit"),
    [
        ("www.example.test", "WWW.Example.TEST.", "A", "any", True),
        ("www.example.test.", "www.example.test", "A", "any", True),
        ("*.example.test", "a.b.example.test.", "AAAA", "any", True),
        ("*.example.test", "example.test.", "A", "any", False),
        ("www.example.test", "www.example.test.", "AAAA", "A", False),
        ("www.example.test", "www.example.test.", "A", "A", True),
        ("*", "anything.", "MX", "any", True),
    ],
)
def test_a_rule_matches_by_name_glob_without_case_or_trailing_dot_and_type(
    name: str, qname: str, qtype: str, rule_type: str, hit: bool
) -> None:
    d = faults(DnsRule("servfail", qname=name, qtype=rule_type)).query(query(qname, qtype))
    assert (d.verdict == "answer") is hit


def test_count_faults_the_first_n_matching_queries_then_lets_them_through() -> None:
    f = faults(DnsRule("servfail", qname="www.*", count=2))
    verdicts = [f.query(query(qid=i)).verdict for i in range(4)]
    assert verdicts == ["answer", "answer", "forward", "forward"]
    assert f.query(query(name="mail.example.test")).verdict == "forward"  # not counted
    assert f.rules[0].to_json()["faulted"] == 2


def test_percent_is_drawn_from_seed_name_type_and_id_not_arrival_order() -> None:
    ids = list(range(200))
    first = faults(DnsRule("drop", percent=30), seed=5)
    fated = {i for i in ids if first.query(query(qid=i)).verdict == "drop"}
    assert 40 <= len(fated) <= 80  # 30 % of 200, drawn
    backwards = faults(DnsRule("drop", percent=30), seed=5)
    assert {i for i in reversed(ids) if backwards.query(query(qid=i)).verdict == "drop"} == fated
    other_seed = faults(DnsRule("drop", percent=30), seed=6)
    assert {i for i in ids if other_seed.query(query(qid=i)).verdict == "drop"} != fated
    # the same query again (a retry keeping its id) meets the same fate
    assert first.query(query(qid=min(fated))).verdict == "drop"


def test_the_first_matching_rule_judges_a_query() -> None:
    f = faults(DnsRule("nxdomain", qname="a.*"), DnsRule("servfail"))
    assert dns.message.from_wire(f.query(query("a.test")).reply).rcode() == dns.rcode.NXDOMAIN
    assert dns.message.from_wire(f.query(query("b.test")).reply).rcode() == dns.rcode.SERVFAIL


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"not a dns message at all",
        query()[:-3],  # cut inside the question
        answer_to(query(), "192.0.2.1"),  # a response sent upstream
        dns.message.make_query("www.example.test", "A").to_wire()[:2] + b"\x28\x00" + b"\x00" * 8,
    ],
    ids=["empty", "one-byte", "text", "cut", "response", "update-no-question"],
)
def test_what_is_not_a_query_passes_untouched(data: bytes) -> None:
    f = faults(DnsRule("servfail"), DnsRule("rewrite", address="10.9.9.9"))
    assert f.query(data).verdict == "forward" and f.query(data).fault is None


def test_an_answer_dnspython_cannot_parse_or_pair_passes_untouched() -> None:
    f = faults(DnsRule("truncate"))
    f.query(query())
    for data in (b"", b"\xff" * 5, answer_to(query())[:-2], answer_to(query(qid=8))):
        assert f.answer(data) == data


def test_no_rules_is_forward_without_parsing_and_clear_forgets_pending() -> None:
    f = DnsFaults()
    assert f.query(b"garbage").verdict == "forward" and not f
    f.add(DnsRule("truncate"))
    f.query(query())
    f.clear()
    a = answer_to(query(), "192.0.2.1")
    assert f.answer(a) == a and not f


def test_pending_answers_are_bounded() -> None:
    f = faults(DnsRule("truncate"))
    for i in range(PENDING_LIMIT + 10):
        f.query(query(qid=i % 65536), peer=i)
    assert len(f._pending) == PENDING_LIMIT
    a = answer_to(query(qid=0))
    assert f.answer(a, peer=0) == a  # the oldest went first


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"action": "explode"}, "action must be one of"),
        ({"action": "drop", "qtype": "a"}, "qtype must be one of"),
        ({"action": "drop", "percent": 101}, "percent must be a percentage"),
        ({"action": "drop", "count": -1}, "count must not be negative"),
        ({"action": "delay"}, "delay_ms is for action delay"),
        ({"action": "drop", "delay_ms": 5}, "delay_ms is for action delay"),
        ({"action": "rewrite"}, "address is for action rewrite"),
        ({"action": "rewrite", "address": "example.test"}, "must be an IPv4 or IPv6"),
    ],
)
def test_a_rule_refuses_what_it_cannot_do(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DnsRule(**fields)  # type: ignore[arg-type]


def test_a_query_malformed_past_its_question_passes_and_is_not_counted() -> None:
    good = query()
    bad = good[:10] + b"\x00\x01" + good[12:]  # says one additional record; none follows
    f = faults(DnsRule("servfail", count=1))
    d = f.query(bad)
    assert (d.verdict, d.fault) == ("forward", None)
    assert f.query(good).verdict == "answer"  # the count was still whole


def test_an_answer_malformed_past_its_question_passes_untouched_and_unpaired() -> None:
    f = faults(DnsRule("rewrite", address="10.9.9.9"))
    q = query()
    f.query(q)
    good = answer_to(q, "192.0.2.1")
    bad = good[:6] + b"\x00\x02" + good[8:]  # two answers said, one there
    assert f.answer(bad) == bad
    assert f.answer(good) != good  # still paired: the well-formed answer is rewritten


def test_a_rule_s_json_is_its_fields_in_order_and_its_counts_last() -> None:
    # The API's and the event log's form of a rule (the UDP proxy's dns rules).
    rule = DnsRule("rewrite", qname="a.test", address="10.0.0.1")
    assert list(rule.to_json().items()) == [
        ("action", "rewrite"),
        ("qname", "a.test"),
        ("qtype", "any"),
        ("percent", 100.0),
        ("count", 0),
        ("delay_ms", 0.0),
        ("address", "10.0.0.1"),
        ("matched", 0),
        ("faulted", 0),
    ]
