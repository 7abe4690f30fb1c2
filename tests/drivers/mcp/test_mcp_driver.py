"""drivers.mcp against real processes: the SDK test server (under trio), a third-party
server package (mcp-server-time), and a scripted peer for the framing edges.

The SDK server takes 1-2.5 s to answer initialize, so each SDK test drives one process
through many scenarios, in the order a session would meet them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from drivers.mcp import (
    DEFAULT_MAX_NOTIFICATIONS,
    CallTimeout,
    CloseTimeouts,
    ProcessExited,
    ProtocolVersionError,
    RPCError,
    ServerProcess,
    StartError,
    open_mcp,
)
from faultnet.eventlog import flatten, read_jsonl
from faultnet.procs import ProcessIdentity, signal_exact, stop_exact

SERVERS = Path(__file__).parent / "servers"
SDK = [sys.executable, str(SERVERS / "sdk_server.py")]
RAW = [sys.executable, str(SERVERS / "raw_server.py")]
TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
# Short close steps: the scenarios that need escalation should not cost 5 s each.
FAST_CLOSE = CloseTimeouts(eof=1.0, term=1.0, kill=3.0)


def request_records(path: Path) -> list[dict]:
    return [r for r in read_jsonl(path).records if r["event"] == "request"]


def only_file(directory: Path) -> Path:
    files = sorted(directory.glob("mcp-*.jsonl"))
    assert len(files) == 1, files
    return files[0]


async def test_sdk_server_session(tmp_path: Path) -> None:
    log_dir = tmp_path / "calls"
    async with open_mcp(SDK, call_log_dir=log_dir, close_timeouts=FAST_CLOSE) as drv:
        # Handshake and process identity.
        assert drv.protocol_version == "2025-11-25"
        assert drv.server_info["name"] == "faultnet-test-server"
        assert "tools" in drv.server_capabilities
        assert drv.call_log_path == only_file(log_dir)
        assert drv.identity == ProcessIdentity.of(drv.pid)
        assert drv.alive() and drv.returncode is None
        fds = drv.fd_count()
        assert fds is not None and fds >= 3

        names = {t["name"] for t in await drv.list_tools()}
        assert {"echo", "fail", "hang", "progress", "say", "ask", "crash"} <= names

        # A call; multi-word text with newline and tab survives both ways.
        text = "two words\nand\ta tab"
        result = await drv.call("echo", text=text)
        assert (result.text, result.is_error) == (text, False)

        # A tool error is a result, not an exception; so is an unknown tool (SDK 2.3).
        result = await drv.call("fail", message="boom went the tool")
        assert result.is_error and "boom went the tool" in result.text
        result = await drv.call("no-such-tool")
        assert result.is_error and "Unknown tool" in result.text
        # A JSON-RPC error is an exception with its code.
        with pytest.raises(RPCError) as rpc:
            await drv.request("no/such/method")
        assert rpc.value.code == -32601

        # Progress notifications reach the call that asked for them.
        seen: list[dict] = []
        result = await drv.call_tool("progress", {"steps": 3}, on_progress=seen.append)
        assert result.text == "done 3"
        assert (
            [p["progress"] for p in seen] == [1, 2, 3] == [p["progress"] for p in result.progress]
        )

        # A callback that raises fails its own call, not the driver.
        def bad_callback(params: dict) -> None:
            raise LookupError("callback bug")

        with pytest.raises(LookupError, match="callback bug"):
            await drv.call_tool("progress", {"steps": 2}, on_progress=bad_callback)

        # Message notifications: the inbox and contents().
        mark = len(drv.notifications())
        await drv.call("say", text="hello channel, two words", as_dict=True)
        await drv.call("say", text="plain words")
        assert drv.contents()[-2:] == ["hello channel, two words", "plain words"]
        note = await drv.wait_notification("notifications/message", 5, since=mark)
        assert note is not None and note.params["data"]["channel"] == "#test"
        assert await drv.wait_notification("notifications/never-sent", 0.2) is None

        # Server-to-client requests: the server's ids (1, 2...) overlap ours; answered.
        assert (await drv.call("ask", kind="ping")).text.startswith("ping ok")
        assert "roots=[]" in (await drv.call("ask", kind="roots")).text
        for kind in ("sampling", "elicitation"):
            answer = (await drv.call("ask", kind=kind)).text
            assert answer.startswith(f"{kind} error") and "not supported" in answer

        # stderr capture.
        await drv.call("stderr", text="marker 42 in two words")
        assert drv.grep_stderr(r"marker \d+") == ["marker 42 in two words"]
        assert await drv.wait_stderr("marker 42", 5) == "marker 42 in two words"
        assert "marker 42" in drv.stderr_text()

        # A hanging tool: timeout, cancellation reaches the server, the driver stays usable.
        t0 = time.monotonic()
        with pytest.raises(CallTimeout):
            await drv.call_tool("hang", {"tag": "t1"}, timeout=0.5)
        assert 0.5 <= time.monotonic() - t0 < 3
        assert await drv.wait_stderr("hang cancelled t1", 5) is not None
        assert (await drv.call("echo", text="still here")).text == "still here"
        # The caller's own cancellation also sends notifications/cancelled.
        with trio.move_on_after(0.5) as scope:
            await drv.call("hang", tag="t2")
        assert scope.cancelled_caught
        assert await drv.wait_stderr("hang cancelled t2", 5) is not None

        # Junk on stdout is reported, never fatal.
        assert (await drv.call("junk", text="{broken json")).text == "junked"
        assert [(p.kind, p.excerpt) for p in drv.problems()] == [("invalid_json", "{broken json")]
        assert await drv.ping() < 5

        # Killed mid-call: every pending call fails at once with the status and stderr.
        failures: list[tuple[float, ProcessExited]] = []

        async def pending_call(tag: str) -> None:
            try:
                await drv.call("hang", tag=tag)
            except ProcessExited as exc:
                failures.append((time.monotonic(), exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending_call, "k1")
            nursery.start_soon(pending_call, "k2")
            assert await drv.wait_stderr("hang start k1", 5)
            assert await drv.wait_stderr("hang start k2", 5)
            killed_at = time.monotonic()
            assert signal_exact(drv.identity, signal.SIGKILL)
        assert len(failures) == 2
        for at, exc in failures:
            assert at - killed_at < 1.0, "pending calls must fail at once"
            assert exc.returncode == -signal.SIGKILL
            assert any("hang start k" in line for line in exc.stderr_tail)
        with pytest.raises(ProcessExited):  # and later calls fail immediately
            await drv.call("echo", text="anyone?")
        assert not drv.alive() and drv.fd_count() is None
    assert drv.process.close_report is not None
    assert drv.process.close_report.how == "already_exited"

    # The call record: one line per request, one-line arguments, every outcome kind.
    path = only_file(log_dir)
    assert path.name == f"mcp-{drv.identity.pid}-{drv.identity.start_time}.jsonl"
    raw = path.read_bytes()
    assert b"\t" not in raw
    records = read_jsonl(path).records
    assert raw.count(b"\n") == len(records)
    requests = [r for r in records if r["event"] == "request"]
    for r in requests:
        assert r["pid"] == drv.pid and r["start_time"] == drv.identity.start_time
        assert isinstance(r["seconds"], float) and r["seconds"] >= 0
    echo = next(r for r in requests if r["tool"] == "echo")
    assert echo["arguments"] == flatten({"text": text}) and echo["outcome"] == "ok"
    # The answer a tool call got is kept (the claim a caller was given), errors too.
    assert echo["result_text"] == text
    failed = next(r for r in requests if r["tool"] == "fail")
    assert failed["outcome"] == "is_error" and "boom went the tool" in failed["result_text"]
    assert all(r["result_text"] is None for r in requests if r["outcome"] not in ("ok", "is_error"))
    assert all(r["result_text"] is None for r in requests if r["method"] != "tools/call")
    by_outcome = {r["outcome"] for r in requests}
    assert by_outcome == {"ok", "is_error", "error", "timeout", "cancelled", "process_exited"}
    err = next(r for r in requests if r["outcome"] == "error" and r["error_code"] is not None)
    assert (err["method"], err["error_code"]) == ("no/such/method", -32601)
    assert [r["method"] for r in requests[:2]] == ["initialize", "tools/list"]
    served = {r["method"]: r["outcome"] for r in records if r["event"] == "server_request"}
    assert served == {
        "ping": "answered",
        "roots/list": "answered",
        "sampling/createMessage": "refused",
        "elicitation/create": "refused",
    }
    assert [r["kind"] for r in records if r["event"] == "stdout_problem"] == ["invalid_json"]
    if shutil.which("jq"):
        jq = await trio.run_process(
            ["jq", "-s", 'map(select(.event == "request")) | length', str(path)],
            capture_stdout=True,
        )
        assert int(jq.stdout) == len(requests)


async def test_close_escalates_by_exact_pid(tmp_path: Path) -> None:
    """stdin EOF ignored -> SIGTERM (the SDK server); SIGTERM ignored too -> SIGKILL (the
    scripted peer, cheaper to start); a sibling started with the very same command line
    as the one killed is never signalled."""
    stubborn = [*RAW, "--ignore-eof", "--ignore-term"]
    sibling = await trio.lowlevel.open_process(
        stubborn, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    sibling_id = ProcessIdentity.spawned(sibling.pid, stubborn)
    reports: dict[str, object] = {}
    stderr: dict[str, str] = {}

    async def drive(name: str, argv: list[str]) -> None:
        async with open_mcp(argv, call_log_dir=tmp_path / name, close_timeouts=FAST_CLOSE) as drv:
            assert (await drv.call("echo", text="before close")).text == "before close"
            reports[name] = await drv.close()
            stderr[name] = drv.stderr_text()

    try:
        async with trio.open_nursery() as nursery:  # both start at once: one SDK startup
            nursery.start_soon(drive, "term", [*SDK, "--ignore-eof"])
            nursery.start_soon(drive, "kill", stubborn)
        term, kill = reports["term"], reports["kill"]
        assert (term.how, term.signals, term.returncode) == ("sigterm", ("SIGTERM",), -15)
        assert (kill.how, kill.signals, kill.returncode) == ("sigkill", ("SIGTERM", "SIGKILL"), -9)
        # Each saw its stdin close (and chose to ignore it) before any signal.
        assert "eof ignored" in stderr["term"] and "eof ignored" in stderr["kill"]
        assert sibling_id.is_alive() and sibling.poll() is None
        exits = [
            r for r in read_jsonl(only_file(tmp_path / "kill")).records if r["event"] == "exit"
        ]
        assert [(e["how"], e["signals"]) for e in exits] == [("sigkill", ["SIGTERM", "SIGKILL"])]
    finally:
        signal_exact(sibling_id, signal.SIGKILL)
        with trio.move_on_after(5):
            await sibling.wait()
        assert sibling.poll() is not None
        if sibling.stdin is not None:
            await sibling.stdin.aclose()


async def test_third_party_time_server(tmp_path: Path) -> None:
    async with open_mcp(TIME, call_log_dir=tmp_path) as drv:
        assert drv.server_info["name"] == "mcp-time"
        assert drv.protocol_version in ("2025-06-18", "2025-11-25")
        names = {t["name"] for t in await drv.list_tools()}
        assert {"get_current_time", "convert_time"} <= names
        result = await drv.call("get_current_time", timezone="UTC")
        assert not result.is_error
        assert json.loads(result.text)["timezone"] == "UTC"
        result = await drv.call("get_current_time", timezone="Nowhere/Atlantis")
        assert result.is_error and "Invalid timezone" in result.text
        # This server (built on the SDK's low-level Server) answers an unknown tool with
        # a JSON-RPC error, unlike MCPServer's isError: both shapes must be handled.
        with pytest.raises(RPCError) as rpc:
            await drv.call("no_such_tool")
        assert rpc.value.code == -32602 and "no_such_tool" in rpc.value.message
        assert await drv.ping() < 5
        report = await drv.close()
    assert (report.how, report.signals, report.returncode) == ("stdin_eof", (), 0)
    outcomes = [r["outcome"] for r in request_records(only_file(tmp_path))]
    assert outcomes == ["ok", "ok", "ok", "is_error", "error", "ok"]


async def test_framing_and_protocol_edges(tmp_path: Path) -> None:
    """CRLF, messages split across writes and coalesced in one, batches, colliding
    request ids, every kind of bad line, an oversize line, a silent call, an exit."""
    argv = [*RAW, "--crlf", "--trickle"]
    async with open_mcp(argv, call_log_dir=tmp_path, max_line_bytes=64 * 1024) as drv:
        assert (await drv.call("echo", text="over crlf, in pieces")).text == "over crlf, in pieces"

        assert (await drv.call("burst")).text == "burst answer"
        assert "burst note" in drv.contents()
        assert (await drv.call("batch")).text == "batch answer"
        assert "batch note" in drv.contents()
        # The server's ping carries the same id as our pending call: both sides work.
        result = await drv.call("collide")
        assert result.text.startswith("pong for server id") and result.text.endswith("ok=True")

        assert (await drv.call("junk")).text == "after junk"
        kinds = [p.kind for p in drv.problems()]
        assert kinds == ["invalid_json", "invalid_utf8", "not_jsonrpc", "unknown_response_id"]

        # An oversize answer is dropped (bounded memory); the call times out and says why.
        with pytest.raises(CallTimeout, match="oversize_line"):
            await drv.call_tool("big", {"size": 200_000}, timeout=1.0)
        assert drv.problems()[-1].kind == "oversize_line"
        assert (await drv.call("echo", text="after big")).text == "after big"

        # No answer at all: timeout, and the peer is told.
        with pytest.raises(CallTimeout) as timeout:
            await drv.call_tool("noanswer", {}, timeout=0.3)
        assert await drv.wait_stderr(f"cancelled {timeout.value.request_id}", 5)

        # The server exits on its own mid-call: every pending call fails with its code.
        failures: list[ProcessExited] = []

        async def pending(tool: str, args: dict) -> None:
            try:
                await drv.call_tool(tool, args)
            except ProcessExited as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending, "noanswer", {})
            assert await drv.wait_stderr(r"noanswer \d+", 5)
            nursery.start_soon(pending, "exit", {"code": 5})
        assert [e.returncode for e in failures] == [5, 5]
        assert all("exiting with 5" in e.stderr_tail[-1] for e in failures)
        assert await drv.wait_notification("never", 5) is None  # stdout closed: no wait
    outcomes = [r["outcome"] for r in request_records(only_file(tmp_path))]
    assert outcomes.count("timeout") == 2 and outcomes.count("process_exited") == 2


async def test_protocol_version_negotiation(tmp_path: Path) -> None:
    # A counter-offer inside the handshake era is accepted.
    async with open_mcp([*RAW, "--version", "2024-11-05"]) as drv:
        assert drv.protocol_version == "2024-11-05"
    # Outside it (the stateless 2026 revision, or nonsense), refused and the process closed.
    for offered in ("2026-07-28", "1999-01-01"):
        log_dir = tmp_path / offered
        with pytest.raises(ProtocolVersionError, match=offered):
            async with open_mcp([*RAW, "--version", offered], call_log_dir=log_dir):
                raise AssertionError("must not get here")
        records = read_jsonl(only_file(log_dir)).records
        assert [r["event"] for r in records] == ["request", "handshake_refused", "exit"]
        assert records[1]["offered"] == offered
        assert not ProcessIdentity(records[0]["pid"], records[0]["start_time"]).is_alive()
    with pytest.raises(ValueError, match="handshake-era"):
        async with open_mcp(RAW, protocol_version="2026-07-28"):
            pass


async def test_start_failures(tmp_path: Path) -> None:
    with pytest.raises(StartError, match="cannot start"):
        async with open_mcp([str(tmp_path / "no-such-server")]):
            pass
    # A server that never answers initialize: a timeout, not a hang.
    t0 = time.monotonic()
    with pytest.raises(CallTimeout, match="initialize"):
        async with open_mcp([*RAW, "--silent"], handshake_timeout=0.5):
            pass
    assert time.monotonic() - t0 < 5
    # A command that exits at once: ProcessExited with its code and stderr.
    code = "import sys; print('no server here', file=sys.stderr); sys.exit(4)"
    with pytest.raises(ProcessExited, match="no server here") as exited:
        async with open_mcp([sys.executable, "-c", code]):
            pass
    assert exited.value.returncode == 4


@pytest.mark.parametrize(
    ("code", "state"),
    [
        ("import time; time.sleep(60)", "sleeping"),
        ("while True: pass", "running"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSTOP)", "stopped"),
    ],
)
async def test_a_handshake_timeout_says_what_the_server_was_doing(code: str, state: str) -> None:
    """A silent server is told apart by what it was doing when the wait ran out: waiting
    (and where in the kernel), on the CPU, or stopped; with the CPU it had used and what it
    last said on stderr. (A CI run's bot once gave no answer in 20 s, and said no more.)
    2 s: a bare interpreter printed its first line in 23-80 ms here (20 starts, load 2.4)."""
    said = "import sys\nprint('booting', file=sys.stderr, flush=True)\n"
    with pytest.raises(CallTimeout) as timeout:
        server = [sys.executable, "-c", said + code]
        async with open_mcp(server, handshake_timeout=2.0, close_timeouts=FAST_CLOSE):
            pass
    message = str(timeout.value)
    assert f"the server (pid {timeout.value.server_pid}) is {state}" in message, message
    assert re.search(r"[\d.]+ s of CPU in its [\d.]+ s", message), message
    assert message.endswith("; last stderr: booting"), message


def _children() -> set[int]:
    """This process's children, running or not yet reaped (every thread's)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


async def test_a_call_log_directory_that_cannot_be_made_starts_nothing(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    started = tmp_path / "started"
    # A server that says it ran, then waits for stdin's EOF (the close's first step).
    code = f"open({str(started)!r}, 'w').close(); import sys; sys.stdin.read()"
    before = _children()
    with pytest.raises(NotADirectoryError):
        async with open_mcp(
            [sys.executable, "-c", code],
            call_log_dir=not_a_dir / "calls",
            close_timeouts=FAST_CLOSE,
        ):
            pass
    assert _children() == before and not started.exists()


async def test_a_driver_that_cannot_be_made_stops_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A call record that cannot be opened once the server runs (a full disk, a file the
    # user may not write): root, which runs these tests, writes anywhere, so the record
    # is replaced by one that raises what the kernel would.
    import drivers.mcp._client

    def refuse(*args: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(drivers.mcp._client, "CallRecord", refuse)
    before = _children()
    with pytest.raises(PermissionError):
        async with open_mcp(RAW, call_log_dir=tmp_path, close_timeouts=FAST_CLOSE):
            pass
    assert _children() == before


async def test_env_and_cwd_reach_the_server(tmp_path: Path) -> None:
    code = (
        "import os, sys; print(os.environ['FAULTNET_PROBE'], os.getcwd(), file=sys.stderr);"
        " sys.stdout.close()"
    )
    env = {**os.environ, "FAULTNET_PROBE": "probe value"}
    with pytest.raises(ProcessExited) as exited:
        async with open_mcp([sys.executable, "-c", code], env=env, cwd=tmp_path):
            pass
    assert exited.value.stderr_tail == [f"probe value {tmp_path}"]


async def test_close_never_signals_a_recycled_pid() -> None:
    """Break the guard: make the recorded start time disagree with the live process (as
    if its PID had been reused). close() must then send nothing at all."""
    proc = await ServerProcess.start([*RAW, "--ignore-eof", "--ignore-term"])
    real = proc.identity
    async with trio.open_nursery() as nursery:
        nursery.start_soon(proc.read_stderr)
        assert await proc.wait_stderr("ready", 5)
        proc.identity = ProcessIdentity(real.pid, real.start_time + 1, real.cmdline)
        report = await proc.close(CloseTimeouts(eof=0.3, term=0.3, kill=0.3))
        assert (report.how, report.signals) == ("unkillable", ())
        assert await proc.wait_stderr("eof ignored", 5)  # stdin EOF was delivered
        assert real.is_alive() and proc.returncode is None
        # Clean up by the true identity.
        assert signal_exact(real, signal.SIGKILL)
        with trio.fail_after(5):
            assert await proc.wait() == -signal.SIGKILL
        await proc.release_pipes()


async def test_a_notification_flood_keeps_the_newest_and_counts_the_rest(tmp_path: Path) -> None:
    """The inbox is bounded (it grew to 710 MB under 852,000 notifications): the oldest
    are dropped, counted, and the call record says so; marks count every arrival."""
    async with open_mcp(RAW, call_log_dir=tmp_path, close_timeouts=FAST_CLOSE) as drv:
        assert drv.notifications_dropped == 0
        result = await drv.call("flood", count=DEFAULT_MAX_NOTIFICATIONS + 5000)
        assert result.text == f"flooded {DEFAULT_MAX_NOTIFICATIONS + 5000}"
        assert len(drv.notifications()) == DEFAULT_MAX_NOTIFICATIONS
        assert drv.notification_count == DEFAULT_MAX_NOTIFICATIONS + 5000
        assert drv.notifications_dropped == 5000
        mark = drv.notification_count
        await drv.call("burst")  # one more notification after the mark
        note = await drv.wait_notification("notifications/message", 5, since=mark)
        assert note is not None and note.params["data"] == "burst note"
    dropped = [
        r for r in read_jsonl(only_file(tmp_path)).records if r["event"] == "notifications_dropped"
    ]
    assert dropped[0]["kept"] == DEFAULT_MAX_NOTIFICATIONS  # said when it began
    assert (dropped[-1]["received"], dropped[-1]["dropped"]) == (
        DEFAULT_MAX_NOTIFICATIONS + 5001,
        5001,
    )


async def test_a_pending_call_fails_when_the_server_exits_though_its_stdout_stays_open() -> None:
    """A grandchild holding the server's stdout must not keep a call waiting for its
    timeout (30 s here): it fails with ProcessExited when the server process exits."""
    orphan: ProcessIdentity | None = None
    try:
        async with open_mcp(RAW, timeout=30, close_timeouts=FAST_CLOSE) as drv:
            t0 = time.monotonic()
            with trio.fail_after(10), pytest.raises(ProcessExited) as info:
                await drv.call("orphan")
            assert time.monotonic() - t0 < 10 and info.value.returncode == 3
            line = await drv.wait_stderr(r"^orphan \d+$", 5)
            assert line is not None
            orphan = ProcessIdentity.of(int(line.split()[1]))
            assert orphan.is_alive() and not drv.stdout_closed.is_set()
            with pytest.raises(ProcessExited):  # later calls fail at once
                await drv.call("echo", text="too late")
    finally:
        if orphan is not None:
            stop_exact(orphan, term_timeout=5)
