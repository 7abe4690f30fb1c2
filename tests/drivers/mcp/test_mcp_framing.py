"""drivers.mcp line framing: the byte-level edges, without a process."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drivers.mcp import LineFramer, Oversize


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes | Oversize]:
    out: list[bytes | Oversize] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
    return out


def test_partial_lines_wait_for_their_newline() -> None:
    f = LineFramer()
    assert f.feed(b'{"a":') == []
    assert f.pending == 5
    assert f.feed(b"1}") == []
    assert f.feed(b"\n") == [b'{"a":1}']
    assert f.pending == 0


def test_several_lines_in_one_read_keep_their_order() -> None:
    f = LineFramer()
    assert f.feed(b"one\ntwo\nthree\nfour") == [b"one", b"two", b"three"]
    assert f.end() == [b"four"]  # a final line without newline is still delivered


def test_crlf_loses_cr_and_blank_lines_are_skipped() -> None:
    f = LineFramer()
    assert f.feed(b"a\r\n\r\n\nb\r") == [b"a"]
    # The CR of a CRLF split across reads is still removed; a CR inside a line is kept.
    assert f.feed(b"\nc\rd\n") == [b"b", b"c\rd"]


def test_oversize_line_is_dropped_with_bounded_memory() -> None:
    f = LineFramer(limit=100)
    out = f.feed(b"ok\n" + b"x" * 150)
    assert out == [b"ok"]
    assert f.pending == 0  # nothing of the long line is held
    for _ in range(1000):  # 1 MB more of the same line: still nothing held
        assert f.feed(b"x" * 1000) == []
        assert f.pending == 0
    out = f.feed(b"xx\nnext\n")
    assert out == [Oversize(150 + 1_000_000 + 2, b"x" * 80), b"next"]


def test_oversize_cut_by_eof_is_reported() -> None:
    f = LineFramer(limit=10)
    assert f.feed(b"y" * 30) == []
    assert f.end() == [Oversize(30, b"y" * 30)]


def test_exactly_the_limit_is_allowed() -> None:
    f = LineFramer(limit=10)
    assert f.feed(b"z" * 10) == []
    assert f.feed(b"\n") == [b"z" * 10]
    assert f.feed(b"z" * 11) == []
    assert f.feed(b"\n") == [Oversize(11, b"z" * 11)]


def test_split_mode_keeps_long_lines_in_pieces() -> None:
    f = LineFramer(limit=4, mode="split")
    assert f.feed(b"abcdefghij\nk\n") == [b"abcdefghij", b"k"]
    assert f.feed(b"abcdefghij") == [b"abcd", b"efgh"]
    assert f.end() == [b"ij"]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LineFramer(limit=0)


@given(
    lines=st.lists(
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")),
        max_size=20,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
    crlf=st.booleans(),
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], cuts: list[int], crlf: bool) -> None:
    eol = b"\r\n" if crlf else b"\n"
    stream = b"".join(line + eol for line in lines)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in zip(points, points[1:], strict=False)]
    f = LineFramer(limit=64)
    out = feed_all(f, chunks) + f.end()
    assert out == [line for line in lines if line.strip()]
