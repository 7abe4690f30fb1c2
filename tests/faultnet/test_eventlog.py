"""faultnet.eventlog: one write per record, and the tolerant reader."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from faultnet.eventlog import CorruptLogError, JsonlWriter, dropped_records, flatten, read_jsonl


def _writer_process(path: str, tag: int, n: int) -> None:
    w = JsonlWriter(path, writer=tag)
    for i in range(n):
        w.write("tick", i=i, pad="x" * 3000)  # records larger than PIPE_BUF on purpose
    w.close()


def test_concurrent_writers_never_interleave(tmp_path) -> None:
    path = str(tmp_path / "log.jsonl")
    procs = [multiprocessing.Process(target=_writer_process, args=(path, t, 300)) for t in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    read = read_jsonl(path)
    assert read.truncated_tail is None
    assert len(read.records) == 1200
    for tag in range(4):
        assert [r["i"] for r in read.records if r["writer"] == tag] == list(range(300))


def test_records_carry_wall_and_monotonic_time_and_static_fields(tmp_path) -> None:
    w = JsonlWriter(tmp_path / "a.jsonl", proxy="p1")
    rec = w.write("conn_open", conn=3)
    assert rec["proxy"] == "p1" and rec["conn"] == 3 and rec["event"] == "conn_open"
    assert isinstance(rec["wall"], float) and isinstance(rec["mono"], float)
    assert read_jsonl(tmp_path / "a.jsonl").records == [rec]


def test_truncated_final_line_is_dropped_and_reported(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    w = JsonlWriter(path)
    w.write("one")
    w.write("two")
    with open(path, "ab") as f:
        f.write(b'{"event": "thr')  # what a kill -9 mid-record would leave
    read = read_jsonl(path)
    assert [r["event"] for r in read.records] == ["one", "two"]
    assert read.truncated_tail == '{"event": "thr'


def test_final_line_without_newline_that_parses_is_kept(tmp_path) -> None:
    path = tmp_path / "k.jsonl"
    path.write_text('{"event": "a"}\n{"event": "b"}')
    read = read_jsonl(path)
    assert [r["event"] for r in read.records] == ["a", "b"] and read.truncated_tail is None


def test_malformed_line_in_the_middle_is_corruption(tmp_path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"event": "a"}\nnot json at all\n{"event": "b"}\n')
    with pytest.raises(CorruptLogError, match=r"c.jsonl:2"):
        read_jsonl(path)
    path.write_text('{"event": "a"}\n[1, 2]\n{"event": "b"}\n')
    with pytest.raises(CorruptLogError):
        read_jsonl(path)


def test_a_restarted_writer_starts_a_new_line_after_a_torn_tail(tmp_path) -> None:
    """Issue 10 item 5: appending straight after a torn record poisoned the whole log."""
    path = tmp_path / "r.jsonl"
    with JsonlWriter(path) as w:
        w.write("before")
    with open(path, "ab") as f:
        f.write(b'{"wall": 1.5, "event": "cut')  # a kill -9 mid-record
    with JsonlWriter(path) as w:  # the restarted writer
        w.write("after")
        w.write("later")
    read = read_jsonl(path)
    assert [r["event"] for r in read.records] == ["before", "after", "later"]
    assert read.truncated_tail is None
    assert [(u.lineno, u.kind) for u in read.unreadable] == [(2, "torn")]


def test_the_reader_names_every_unreadable_line(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "a"}\nnot json\n{"event": "b"}\n[1]\n{"event": "c')
    with pytest.raises(CorruptLogError) as err:
        read_jsonl(path)
    assert err.value.lineno == 2
    for named in ("line 2 (corrupt)", "line 4 (corrupt)", "line 5 (truncated)"):
        assert named in str(err.value)
    assert [r["event"] for r in err.value.read.records] == ["a", "b"]
    assert err.value.read.truncated_tail == '{"event": "c'


def test_a_writer_that_cannot_write_drops_counts_and_warns_once(capfd) -> None:
    """Issue 10 item 4, disk full: /dev/full answers every write with ENOSPC."""
    before = dropped_records().get("/dev/full", 0)
    w = JsonlWriter("/dev/full", proxy="p")
    for i in range(3):
        assert w.write("tick", i=i)["i"] == i  # returns as usual, raises nothing
    w2 = JsonlWriter("/dev/full", proxy="q")  # a second writer of the same path
    w2.write("tock")
    assert (w.dropped, w2.dropped) == (3, 1)
    assert w.last_error is not None and "No space left" in w.last_error
    assert dropped_records()["/dev/full"] == before + 4
    err = capfd.readouterr().err
    if before == 0:  # the warning is once per path per process
        assert err.count("faultnet: warning: cannot write event log /dev/full") == 1
    assert len(err.splitlines()) <= 1
    w.close()
    w2.close()


def test_flatten_keeps_one_line() -> None:
    text = flatten({"args": "line one\nline\ttwo", "n": 1})
    assert "\n" not in text and "\t" not in text
    assert json.loads(text)["args"] == "line one\nline\ttwo"


def test_null_writer_records_nothing(tmp_path) -> None:
    w = JsonlWriter(None)
    assert w.write("x")["event"] == "x"
    assert os.listdir(tmp_path) == []
