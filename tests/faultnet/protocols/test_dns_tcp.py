"""DNS over TCP's frames and decisions with no socket (faultnet.protocols.dns_tcp):
client bytes in, each whole frame with its decision out; server bytes in, the frames the
client gets out; frames split anywhere, several in one read."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest

from faultnet.protocols.dns import DnsFaults, DnsRule
from faultnet.protocols.dns_tcp import DnsTcpSession, Framer, frame


def query(name: str = "www.example.test", qtype: str = "A", qid: int = 7) -> bytes:
    q = dns.message.make_query(name, qtype)
    q.id = qid
    return q.to_wire()


def answer_to(data: bytes, address: str = "192.0.2.1") -> bytes:
    q = dns.message.from_wire(data)
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text(q.question[0].name, 300, "IN", "A", address))
    return r.to_wire()


def session(*rules: DnsRule) -> DnsTcpSession:
    faults = DnsFaults(seed=1)
    for rule in rules:
        faults.add(rule)
    return DnsTcpSession(faults, peer=("conn", 1))


def test_frame_prefixes_the_length_and_refuses_what_cannot_be_framed() -> None:
    assert frame(b"abc") == b"\x00\x03abc"
    assert frame(b"") == b"\x00\x00"
    with pytest.raises(ValueError, match="65535"):
        frame(bytes(65536))


def test_a_frame_split_at_every_byte_comes_out_whole_once() -> None:
    message = query()
    data = frame(message) + frame(query(qid=8))
    for cut in range(len(data) + 1):
        framer = Framer()
        got = framer.feed(data[:cut]) + framer.feed(data[cut:])
        assert got == [message, query(qid=8)], cut
        assert framer.rest() == b""


def test_a_frame_fed_byte_by_byte_and_an_incomplete_rest() -> None:
    framer = Framer()
    data = frame(query())
    got = [m for i in range(len(data)) for m in framer.feed(data[i : i + 1])]
    assert got == [query()]
    assert framer.feed(b"\x00\x10abc") == []
    assert framer.rest() == b"\x00\x10abc"
    assert framer.rest() == b""


@pytest.mark.parametrize(
    ("action", "rcode"),
    [
        ("servfail", dns.rcode.SERVFAIL),
        ("nxdomain", dns.rcode.NXDOMAIN),
        ("refused", dns.rcode.REFUSED),
    ],
)
def test_an_rcode_action_answers_with_a_framed_reply(action: str, rcode: int) -> None:
    s = session(DnsRule(action))
    [(decision, data)] = s.queries(frame(query(qid=42)))
    assert data == frame(query(qid=42))
    assert decision.verdict == "answer" and decision.fault == action
    size = int.from_bytes(decision.reply[:2], "big")
    assert size == len(decision.reply) - 2
    reply = dns.message.from_wire(decision.reply[2:])
    assert reply.id == 42 and reply.rcode() == rcode and reply.flags & dns.flags.QR


def test_several_queries_in_one_read_are_judged_in_order() -> None:
    s = session(DnsRule("drop", qname="*.bad.test"))
    data = frame(query("a.ok.test", qid=1)) + frame(query("b.bad.test", qid=2))
    data += frame(query("c.ok.test", qid=3))
    steps = s.queries(data[:-3]) + s.queries(data[-3:])
    assert [(d.verdict, d.query_id) for d, _ in steps] == [
        ("forward", -1),
        ("drop", 2),
        ("forward", -1),
    ]
    assert [f for _, f in steps] == [
        frame(query("a.ok.test", qid=1)),
        frame(query("b.bad.test", qid=2)),
        frame(query("c.ok.test", qid=3)),
    ]


def test_delay_forwards_with_its_delay() -> None:
    s = session(DnsRule("delay", delay_ms=250))
    [(decision, _)] = s.queries(frame(query()))
    assert (decision.verdict, decision.delay_s) == ("forward", 0.25)


def test_truncate_and_rewrite_change_the_answer_frame_split_across_reads() -> None:
    s = session(DnsRule("rewrite", address="198.51.100.9"))
    [(decision, _)] = s.queries(frame(query(qid=5)))
    assert decision.fault == "rewrite"
    answer = frame(answer_to(query(qid=5)))
    out = s.answers(answer[:3]) + s.answers(answer[3:])
    assert int.from_bytes(out[:2], "big") == len(out) - 2
    got = dns.message.from_wire(out[2:])
    assert [rr.to_text() for rrset in got.answer for rr in rrset] == ["198.51.100.9"]

    s = session(DnsRule("truncate"))
    s.queries(frame(query(qid=6)))
    out = s.answers(frame(answer_to(query(qid=6))))
    got = dns.message.from_wire(out[2:])
    assert got.flags & dns.flags.TC and not got.answer


def test_unfaulted_frames_and_garbage_cross_byte_identical() -> None:
    s = session(DnsRule("servfail", qname="other.test"))
    data = frame(query()) + frame(b"not dns at all")
    steps = s.queries(data)
    assert [d.verdict for d, _ in steps] == ["forward", "forward"]
    assert b"".join(f for _, f in steps) == data
    answer = frame(answer_to(query())) + frame(b"\xff\xff")
    assert s.answers(answer) == answer
    assert s.answers(b"\x00") == b"" and s.rest("downstream") == b"\x00"


def test_answers_pair_with_queries_of_the_same_connection_only() -> None:
    faults = DnsFaults()
    faults.add(DnsRule("truncate"))
    one, two = DnsTcpSession(faults, 1), DnsTcpSession(faults, 2)
    one.queries(frame(query(qid=9)))
    untouched = frame(answer_to(query(qid=9)))
    assert two.answers(untouched) == untouched
    assert one.answers(untouched) != untouched
