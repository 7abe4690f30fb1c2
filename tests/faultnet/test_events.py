"""The event vocabulary (faultnet.events): every name written is declared, every name a
reader matches exists, and a strict writer refuses what is not declared."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from faultnet.eventlog import JsonlWriter, read_jsonl
from faultnet.events import EVENTS, STRICT_ENV, UndeclaredEvent
from tests import REPO

#: The modules that write the event log (a proxy's, the server's).
WRITERS = (
    "faultnet/proxy",
    "faultnet/udp",
    "faultnet/server",
    "faultnet/planes",
    "faultnet/protocols",
    "faultnet/toxics",
    "faultnet/proxybase.py",  # the ``listening`` record both proxies write
)


def _written(paths: tuple[str, ...]) -> dict[str, set[str]]:
    """Event name -> the files that write it: ``<...log>.write("name", ...)``,
    ``log_event("name", ...)``, the API's ``served.log("name", ...)`` (it hops to the
    registry's loop) and ``.write(f"held_{kind}", ...)`` (expanded by hand below),
    found in the source."""
    found: dict[str, set[str]] = {}
    for top in paths:
        root = REPO / top
        for path in [root] if root.is_file() else root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                if isinstance(node.func, ast.Name):
                    writes = node.func.id == "log"
                elif isinstance(node.func, ast.Attribute):
                    receiver = ast.unparse(node.func.value)
                    writes = (
                        node.func.attr == "log_event"
                        or (node.func.attr == "log" and receiver == "served")
                        or (node.func.attr == "write" and receiver.endswith(("log", "server")))
                    )
                else:
                    continue
                if not writes or not node.args:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names = [first.value]
                elif isinstance(first, ast.JoinedStr) and ast.unparse(first) == "f'held_{kind}'":
                    names = ["held_fin", "held_rst"]  # _HELD_KINDS' values
                else:
                    continue
                for name in names:
                    found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_event_written_is_declared_and_every_declared_one_is_written() -> None:
    written = _written(WRITERS)
    assert "conn_close" in written and "session_open" in written  # the scan sees writers
    assert sorted(set(written) - set(EVENTS)) == []
    assert sorted(set(EVENTS) - set(written)) == []


def test_every_proxy_event_the_run_report_draws_exists() -> None:
    from harness.report import _evidence

    assert sorted(set(_evidence._PROXY_MARKERS) - set(EVENTS)) == []


def test_a_strict_writer_refuses_an_undeclared_event_or_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "events.jsonl"
    writer = JsonlWriter(log, vocabulary=EVENTS, proxy="p")
    monkeypatch.setenv(STRICT_ENV, "1")
    writer.write("conn_open", conn=1, peer="127.0.0.1:5")
    with pytest.raises(UndeclaredEvent, match="'conn_opened' is not declared"):
        writer.write("conn_opened", conn=1)
    with pytest.raises(UndeclaredEvent, match=r"fields \['colour'\] are not declared"):
        writer.write("conn_open", conn=1, colour="red")
    monkeypatch.setenv(STRICT_ENV, "0")  # in production the record is written as it is
    writer.write("conn_opened", conn=2)
    assert [r["event"] for r in read_jsonl(log).records] == ["conn_open", "conn_opened"]
