"""The README says what the tree does: the files it and the code cite exist, its figures
match its flags, its samples run as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_program

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines() if line]


def test_every_markdown_file_the_tree_cites_is_in_the_tree() -> None:
    # DESIGN.md was cited by pyproject.toml and harness/_contract.py, and is not here.
    cited: dict[str, list[str]] = {}
    for path in _tracked():
        if path.suffix not in (".py", ".toml", ".md", ".json", ".sh") or not path.is_file():
            continue
        if path == Path(__file__).resolve():
            continue  # this file names the one that was missing
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text):
            cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    missing = {n: where for n, where in cited.items() if not list(ROOT.rglob(n))}
    assert missing == {}, f"cited but not in the tree: {missing}"


def test_the_time_unit_example_names_the_fraction_it_runs_in() -> None:
    (unit, word) = re.findall(
        r"`--time-unit ([0-9.]+)` runs a plan[^.]*?\bin (halves|\w+ths)\b", README
    )[0]
    fractions = {"0.5": "halves", "0.1": "tenths", "0.02": "fiftieths", "0.01": "hundredths"}
    assert fractions[unit] == word


def test_the_chaos_toolkit_sample_is_preceded_by_making_the_proxy_it_acts_on() -> None:
    sample = ROOT / "faultnet/chaostoolkit/example-experiment.json"
    proxy = json.loads(sample.read_text())["configuration"]["proxy"]["default"]
    at = README.index("chaos run example-experiment.json")
    before = README[max(0, at - 600) : at]
    assert f"faultnet create {proxy} --upstream" in before


def _toxic_table_examples() -> dict[str, list[str]]:
    """Each row of the HTTP section's toxic table: its type, and the ``faultnet toxic
    add`` examples in it."""
    section = README.split("### HTTP and HTTPS faults", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| [a-z0-9_]+ \|", line)]
    return {
        row.split("|")[1].strip(): re.findall(r"`(faultnet toxic add [^`]*)`", row) for row in rows
    }


def test_every_protocol_toxic_has_a_row_with_an_example_its_type_takes() -> None:
    from faultnet.server.cli import _attributes
    from faultnet.toxics import TOXICS

    examples = _toxic_table_examples()
    # A protocol's toxic sees both streams (HTTP, HTTP/2, TLS, DNS, Redis, PostgreSQL);
    # Toxiproxy's byte toxics have their own table.
    protocol = {name for name, cls in TOXICS.items() if cls.both_streams}
    assert protocol <= {name for name, found in examples.items() if found}, examples
    for name, found in examples.items():
        for example in found:
            argv = shlex.split(example)
            types = [argv[i + 1] for i, a in enumerate(argv) if a in ("-t", "--type")]
            pairs = [argv[i + 1] for i, a in enumerate(argv) if a in ("-a", "--attribute")]
            assert types == [name], example
            TOXICS[name].check_attributes(_attributes(pairs, name))  # a misspelt one raises


def _setup_commands() -> list[str]:
    """The indented command lines of the README's "Two commands on a fresh machine"."""
    section = README.split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return [line[4:] for line in section.splitlines() if line.startswith("    ") and line[4:5]]


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    demo, tests = _setup_commands()
    assert demo.endswith("-m faultnet demo") and tests.endswith("-m pytest")
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert tests in ci, "the README's test command is not a line of .ci/run"


def test_each_setup_command_makes_or_reuses_a_virtual_environment_itself() -> None:
    # Debian's python3 refuses `pip install` outside a virtual environment
    # (externally-managed-environment): neither command may run pip on python3 itself.
    for command in _setup_commands():
        assert command.startswith('V="${VIRTUAL_ENV:-.venv}"; [ -x "$V/bin/python" ] ||')
        assert "python3 -m venv" in command and "python3 -m pip" not in command
        assert '"$V/bin/python" -m pip install' in command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, timeout: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64)


def test_the_one_minute_sample_blackholes_a_redis_connection_and_brings_it_back(
    tmp_path: Path,
) -> None:
    redis = require_program(shutil.which("redis-server"), "Debian's redis-server")
    section = README.split("## One minute:", 1)[1].split("\n## ", 1)[0]
    lines = [line[4:] for line in section.splitlines() if line.startswith("    ") and line[4:5]]
    assert 3 <= len(lines) <= 4, lines
    # Free ports instead of the sample's, and the processes' files in tmp_path so that
    # exactly what was started can be stopped; otherwise the lines run as written.
    redis_port, proxy_port, api_port = _free_port(), _free_port(), _free_port()
    pid_file = tmp_path / "redis.pid"
    swaps = {
        "16379": str(proxy_port),
        "6379": str(redis_port),
        "--daemonize yes": f"--daemonize yes --pidfile {pid_file} --dir {tmp_path}",
        "faultnet server --detach": f"faultnet server --detach --port {api_port}",
    }
    env = {**os.environ, "FAULTNET_API": f"http://127.0.0.1:{api_port}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    shim = f'faultnet() {{ "{sys.executable}" -m faultnet "$@"; }}\nredis-server() {{ "{redis}" "$@"; }}\n'
    server_pid = None
    try:
        for i, line in enumerate(lines):
            for old, new in swaps.items():
                line = re.sub(rf"(?<![0-9]){re.escape(old)}(?![0-9])", new, line)
            done = subprocess.run(
                ["bash", "-c", shim + line], capture_output=True, text=True, timeout=60, env=env
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            started = re.search(r"left running as pid (\d+)", done.stdout)
            if started:
                server_pid = int(started.group(1))
            if i == 0:
                # redis up: wait for its answer, bounded (it daemonizes before listening).
                for _ in range(100):
                    try:
                        assert _ping(redis_port, 1) == b"+PONG\r\n"
                        break
                    except OSError:
                        time.sleep(0.05)
            if "partition" in line:
                with pytest.raises(TimeoutError):  # connect hangs: the SYN is dropped
                    _ping(proxy_port, 1.0)
        assert _ping(proxy_port, 5) == b"+PONG\r\n"  # thawed: back
    finally:
        if server_pid is not None:
            os.kill(server_pid, signal.SIGTERM)
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def test_the_chaos_lines_run_as_written(tmp_path: Path) -> None:
    """Issue 35, item 10: the first chaos line exited 2 (`--process bot1` wanted
    `--pids`). Every line of the block runs here, in order, against a real faultnet
    server with the proxy `db` the sample plan targets (on a free port instead of 8474)
    and a `sleep` as bot1; the armed run in hundredths of a second (`--time-unit 0.01`
    added: the sample plan is two minutes of seconds)."""
    section = README.split("### Chaos plans", 1)[1].split("\n\n", 2)[1]
    lines = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    assert lines[0].startswith("faultnet chaos plan ") and "--armed" in lines[-1], lines
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", str(port), "--loopback-only"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    bot1 = subprocess.Popen(["sleep", "120"], cwd=tmp_path)
    try:
        api = f"http://127.0.0.1:{port}"
        for _ in range(200):  # until the API answers, bounded (an interpreter start)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        create = [sys.executable, "-m", "faultnet", "create", "db", "--api", api]
        subprocess.run([*create, "--upstream", "127.0.0.1:9"], check=True, env=env, timeout=60)
        shim = f'faultnet() {{ "{sys.executable}" -m faultnet "$@"; }}\n'
        for line in lines:
            line = line.replace("http://127.0.0.1:8474", api)
            if "--armed" in line:
                line += " --time-unit 0.01"
            done = subprocess.run(
                ["bash", "-c", shim + line],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
                env={**env, "BOT1_PID": str(bot1.pid)},
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
        assert (tmp_path / "run/chaos-log.jsonl").exists()
    finally:
        bot1.kill()
        bot1.wait()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_the_fixture_says_it_needs_trio_mode_and_the_suite_how_long_it_takes() -> None:
    # A newcomer's two questions the README did not answer (issue 35 item 13).
    at = README.index("the `faultnet_proxy` fixture")
    assert "trio_mode = true" in README[at : at + 700] and "@pytest.mark.trio" in README
    assert "trio_mode = true" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(
        r"`\.ci/run` \(install,\s+then\s+the\s+suite\)\s+takes\s+about\s+[0-9.]+\s+minutes", README
    )
