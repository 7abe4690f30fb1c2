"""``python -m drivers.mcp``: output and exit codes (0 ok, 1 tool/JSON-RPC error, 2 usage
or environment), run as a real subprocess against real servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from faultnet.eventlog import read_jsonl
from tests import REPO

SERVERS = Path(__file__).parent / "servers"
RAW = [sys.executable, str(SERVERS / "raw_server.py")]
TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
CLI = [sys.executable, "-m", "drivers.mcp"]
ROOT = REPO


async def run_cli(*args: str) -> tuple[int, str, str]:
    with trio.fail_after(60):
        proc = await trio.run_process(
            [*CLI, *args], capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT
        )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def only_file(directory: Path) -> Path:
    (path,) = directory.glob("mcp-*.jsonl")
    return path


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


async def test_help_and_usage_errors() -> None:
    code, out, _ = await run_cli("--help")
    assert code == 0 and "-- COMMAND" in out and "Exit status" in out
    code, _, err = await run_cli("--list")
    assert code == 2 and "no server command" in one_line_error(err)
    code, _, err = await run_cli("--arg", "a=b", "--", *RAW)
    assert code == 2 and "--arg needs --tool" in one_line_error(err)
    code, _, err = await run_cli("--tool", "echo", "--arg", "novalue", "--", *RAW)
    assert code == 2 and "KEY=VALUE" in one_line_error(err)


async def test_a_call_log_that_cannot_be_made_is_one_line_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    code, out, err = await run_cli("--json", "--call-log", str(not_a_dir / "c"), "--", *RAW)
    assert code == 2
    assert "cannot make the call log directory" in one_line_error(err)
    assert json.loads(out)["error"] == "call_log_error"


async def test_exit_codes_against_the_scripted_peer(tmp_path: Path) -> None:
    results: dict[str, tuple[int, str, str]] = {}

    async def run(name: str, *args: str) -> None:
        results[name] = await run_cli(*args)

    # Independent invocations: run them side by side (each is a python startup).
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            run,
            "ok",
            *("--json", "--call-log", str(tmp_path), "--tool", "echo"),
            *("--arg", "text=two words", "--", *RAW),
        )
        nursery.start_soon(run, "is_error", "--tool", "nope", "--", *RAW)
        nursery.start_soon(run, "rpc_error", "--json", "--tool", "rpcerror", "--", *RAW)
        nursery.start_soon(
            run, "silent", "--json", "--handshake-timeout", "0.5", "--list", "--", *RAW, "--silent"
        )
        nursery.start_soon(run, "missing", "--list", "--", str(tmp_path / "missing-server"))
        nursery.start_soon(run, "refused", "--list", "--", *RAW, "--version", "2026-07-28")

    code, out, err = results["ok"]
    assert code == 0, err
    payload = json.loads(out)
    assert payload["ok"] and payload["text"] == "two words" and payload["is_error"] is False
    records = read_jsonl(only_file(tmp_path)).records
    assert [r["method"] for r in records if r["event"] == "request"] == ["initialize", "tools/call"]

    code, out, err = results["is_error"]
    assert code == 1 and "Unknown tool: nope" in out and "isError" in err

    code, out, err = results["rpc_error"]
    assert code == 1 and "-32602" in one_line_error(err)
    assert json.loads(out) == {
        "ok": False,
        "error": "rpc_error",
        "message": "tools/call: JSON-RPC error -32602: Invalid params: scripted",
        "code": -32602,
    }

    code, out, err = results["silent"]
    assert code == 2 and "no answer within 0.5 s" in one_line_error(err)
    assert json.loads(out)["error"] == "timeout"

    code, _, err = results["missing"]
    assert code == 2 and "cannot start" in one_line_error(err)

    code, _, err = results["refused"]
    assert code == 2 and "2026-07-28" in one_line_error(err)


async def test_third_party_server_list_and_call() -> None:
    results: dict[str, tuple[int, str, str]] = {}

    async def run(name: str, *args: str) -> None:
        results[name] = await run_cli(*args)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "list", "--list", "--json", "--", *TIME)
        nursery.start_soon(
            run,
            "bad_tz",
            "--tool",
            "get_current_time",
            "--arg",
            "timezone=Nowhere/Atlantis",
            "--",
            *TIME,
        )
    code, out, err = results["list"]
    assert code == 0, err
    payload = json.loads(out)
    assert payload["server"]["name"] == "mcp-time"
    assert {"get_current_time", "convert_time"} <= {t["name"] for t in payload["tools"]}
    code, out, _ = results["bad_tz"]
    assert code == 1 and "Invalid timezone" in out
