"""The dns fault held against dnsmasq producing the same answer (principle 13): each row
runs two arms in a network namespace the test makes (``ip netns add``, its loopback
alone) whose resolv.conf (``/etc/netns/NAME/resolv.conf``, which ``ip netns exec``
mounts) names 127.0.0.1:

* the real arm: dnsmasq itself fails (SERVFAIL: its upstream cannot prove the answer,
  DNSSEC validation fails; REFUSED: its only upstream is unroutable; NXDOMAIN and the
  rewrite: an ``address=`` line; TC: forty addresses over its ``edns-packet-max=512``),
  behind a faultnet UDP proxy with no fault, there only
  to count the client's queries;
* faultnet's arm: dnsmasq answers normally (``host-record``), and the proxy's ``dns``
  fault fails the query.

A faultnet TCP proxy with no fault on :53 in both arms carries (and counts) the clients'
fall back to TCP after a TC.

Two real clients in the namespace, each a subprocess under ``ip netns exec``: dnspython's
resolver (its own configuration read from resolv.conf, its own retries) and glibc's
``getaddrinfo``. Both arms must give each the same outcome (exception class or error
code, or the addresses) after the same number of queries. Root only (it skips saying so).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.proxy import open_proxy
from faultnet.udp import open_udp_proxy
from tests.conftest import require_program

NAME = "www.example.test"
UPSTREAM = 5300  # dnsmasq's port; the proxy listens on 53, where resolv.conf points
INNER = 5301  # SERVFAIL's arm: the upstream whose answers cannot be validated
_CLONE_NEWNET = 0x40000000
# The root trust anchor (IANA's KSK-2017): dnsmasq then demands a chain of signatures
# the inner server cannot give, and answers SERVFAIL (measured: "validation of test
# failed", "ABANDONED").
_ANCHOR = (
    "trust-anchor=.,20326,8,2,E06D44B80B8F1D39A95C0B0D7C65D08458E880409BBC683457104237C7F8EC8D"
)

_DNSPYTHON = """
import json, re, dns.resolver
try:
    answer = dns.resolver.resolve(%r, "A", lifetime=6)
    print(json.dumps(sorted(rr.to_text() for rr in answer)))
except Exception as exc:  # the class, and the RCODEs a NoNameservers says it met
    print(json.dumps([type(exc).__name__, re.findall(r"answered ([A-Z]+)", str(exc))]))
"""
_GLIBC = """
import json, socket
try:
    found = socket.getaddrinfo(%r, 80, proto=socket.IPPROTO_TCP)
    print(json.dumps(sorted({info[4][0] for info in found})))
except socket.gaierror as exc:
    print(json.dumps(["gaierror", exc.errno]))
"""
CLIENTS = {"dnspython": _DNSPYTHON % NAME, "glibc": _GLIBC % NAME}

#: Forty addresses: ~700 bytes of answer, over the 512 a dnsmasq with edns-packet-max=512
#: sends by UDP (it sets TC), under the 1,200 glibc's and dnspython's EDNS0 ask for.
MANY = [f"host-record={NAME},10.0.1.{i}" for i in range(1, 41)]
#: row -> (the real dnsmasq's lines, the inner server's lines or None, the dns fault)
ROWS = {
    "servfail": (
        ["dnssec", _ANCHOR, f"server=127.0.0.1#{INNER}"],
        [f"host-record={NAME},10.0.0.1"],
        {"action": "servfail"},
    ),
    "refused": (["server=192.0.2.1"], None, {"action": "refused"}),
    "nxdomain": ([f"address=/{NAME}/"], None, {"action": "nxdomain"}),
    "rewrite": (
        [f"address=/{NAME}/10.9.9.9"],
        None,
        {"action": "rewrite", "address": "10.9.9.9"},
    ),
    "truncate": (["edns-packet-max=512", *MANY], None, {"action": "truncate", "qtype": "A"}),
}
#: What the dnsmasq behind faultnet's fault answers (and the healthy control sees).
NORMAL = {row: [f"host-record={NAME},10.0.0.1"] for row in ROWS} | {"truncate": MANY}


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes a network namespace (ip netns add)")
    require_program(shutil.which("ip"), "ip (iproute2)")
    require_program(shutil.which("dnsmasq"), "dnsmasq")
    name = f"fn-dns-{os.getpid()}"
    conf = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=10)
        conf.mkdir(parents=True)
        # One nameserver, a 1 s timeout, two attempts, EDNS0 (so that only a server's
        # limit truncates): what glibc and dnspython read.
        (conf / "resolv.conf").write_text(
            "nameserver 127.0.0.1\noptions timeout:1 attempts:2 edns0\n"
        )
        yield name
    finally:
        shutil.rmtree(conf, ignore_errors=True)
        subprocess.run(["ip", "netns", "del", name], timeout=10)


@contextmanager
def inside(name: str) -> Iterator[None]:
    """This thread in namespace *name* (trio's, where the proxy makes its sockets, and
    the children it starts directly); back home on exit.

    No thread may be born in the block: a thread starts in its parent's namespace and
    stays there. trio.run_process forks from a trio worker thread, cached up to 10 s
    idle: one born here started the next test's socat in this (deleted) namespace, where
    nothing listens on 127.0.0.1, and socat read ECONNREFUSED (CI, twice). A block that
    lets one be born fails here, not later in another test."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = set(threading.enumerate())
    with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{name}") as there:
        if libc.setns(there.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            if libc.setns(home.fileno(), _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    born = [t.name for t in set(threading.enumerate()) - before]
    assert not born, f"threads born in namespace {name} stay in it: {born}"


@contextmanager
def dnsmasq(tmp_path: Path, tag: str, port: int, lines: list[str]) -> Iterator[None]:
    """dnsmasq on 127.0.0.1:*port* of this thread's namespace, answering once up."""
    conf = tmp_path / f"{tag}.conf"
    conf.write_text(
        "\n".join(
            ["no-resolv", "no-hosts", "bind-interfaces", "listen-address=127.0.0.1"]
            + [f"port={port}", *lines]
            # No cache between the two clients' queries (DNSSEC needs dnsmasq's).
            + ([] if "dnssec" in lines else ["cache-size=0"])
        )
        + "\n"
    )
    proc = subprocess.Popen(
        ["dnsmasq", "-k", "-C", str(conf), f"--pid-file={tmp_path / tag}.pid"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        probe = dns.message.make_query("probe.invalid", "A")
        for _ in range(100):  # up within 5 s, or it says why not
            if proc.poll() is not None:
                raise RuntimeError(f"dnsmasq exited: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                dns.query.udp(probe, "127.0.0.1", port=port, timeout=0.05)
                break
            except dns.exception.Timeout:
                continue
        else:
            raise RuntimeError("dnsmasq did not answer within 5 s")
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def run_client(ns: str, code: str) -> object:
    """Run *code* under ``ip netns exec ns``; what it printed, as JSON.

    Forked from this thread, not by trio.run_process (from a worker thread, which would
    be born in the namespace: see :func:`inside`), and waited for by its pidfd."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(  # noqa: ASYNC220 - from this thread on purpose: no worker
            ["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=out, stderr=err
        )
        try:
            pidfd = os.pidfd_open(proc.pid)
            try:
                await trio.lowlevel.wait_readable(pidfd)  # readable once it has exited
            finally:
                trio.lowlevel.notify_closing(pidfd)
                os.close(pidfd)
        finally:
            if proc.poll() is None:  # cancelled (the row's fail_after)
                proc.kill()
            proc.wait(timeout=10)
        out.seek(0)
        err.seek(0)
        assert proc.returncode == 0, err.read()
        return json.loads(out.read())


_ARMS = itertools.count()


async def arm(
    ns: str, tmp_path: Path, fault: dict[str, object] | None
) -> dict[str, tuple[object, int, int]]:
    """Each client's outcome, the UDP queries it sent and the TCP connections it made
    (a fall back after TC), through proxies on :53 (UDP with *fault*, or none; TCP
    with none) to the dnsmasq on UPSTREAM."""
    seen: dict[str, tuple[object, int, int]] = {}
    log = tmp_path / f"tcp-{next(_ARMS)}.jsonl"
    async with (
        open_udp_proxy(("127.0.0.1", UPSTREAM), ("127.0.0.1", 53)) as proxy,
        open_proxy(("127.0.0.1", UPSTREAM), ("127.0.0.1", 53), event_log=str(log)),
    ):
        if fault is not None:
            await proxy.dns(**fault)  # type: ignore[arg-type]
        for client, code in CLIENTS.items():
            before = proxy.state["received"]["upstream"], _connections(log)
            outcome = await run_client(ns, code)
            seen[client] = (
                outcome,
                proxy.state["received"]["upstream"] - before[0],
                _connections(log) - before[1],
            )
    return seen


def _connections(log: Path) -> int:
    return sum(r["event"] == "conn_open" for r in read_jsonl(str(log)).records)


async def compare(
    ns: str, tmp_path: Path, row: str, fault: dict[str, object]
) -> tuple[dict[str, tuple[object, int]], ...]:
    """The real arm of *row*, faultnet's arm with *fault*, and the healthy control."""
    real_lines, inner_lines, _ = ROWS[row]
    with inside(ns), trio.fail_after(60):
        with ExitStack() as servers:
            if inner_lines is not None:  # first: the real one's probe goes through it
                servers.enter_context(dnsmasq(tmp_path, "inner", INNER, inner_lines))
            servers.enter_context(dnsmasq(tmp_path, "real", UPSTREAM, real_lines))
            real = await arm(ns, tmp_path, None)
        with dnsmasq(tmp_path, "normal", UPSTREAM, NORMAL[row]):
            faulted = await arm(ns, tmp_path, fault)
            healthy = await arm(ns, tmp_path, None)
    return real, faulted, healthy


@pytest.mark.parametrize("row", list(ROWS))
async def test_a_dns_fault_is_what_dnsmasq_failing_is_to_dnspython_and_glibc(
    row: str, netns: str, tmp_path: Path
) -> None:
    real, faulted, healthy = await compare(netns, tmp_path, row, ROWS[row][2])
    print(row, "real:", real, "faultnet:", faulted)
    assert faulted == real, (row, real, faulted)
    # The internal control (and the breakage "a fault that does nothing"): without the
    # fault the same dnsmasq answers normally, by UDP alone.
    addresses = sorted(line.rsplit(",", 1)[1] for line in NORMAL[row])
    assert healthy["glibc"][0] == healthy["dnspython"][0] == addresses
    assert healthy["glibc"][2] == healthy["dnspython"][2] == 0
    assert healthy != real


@pytest.mark.parametrize(
    ("row", "wrong"),
    [
        # glibc cannot tell these apart (EAI_AGAIN after 4 queries, both): dnspython can
        ("refused", {"action": "servfail"}),
        ("rewrite", {"action": "rewrite", "address": "10.9.9.8"}),
    ],
    ids=["servfail-for-refused", "wrong-address"],
)
async def test_a_wrong_fault_turns_its_row_red(
    row: str, wrong: dict[str, object], netns: str, tmp_path: Path
) -> None:
    real, faulted, _ = await compare(netns, tmp_path, row, wrong)
    assert faulted != real


async def test_what_the_worker_starts_after_a_row_runs_in_its_own_namespace(netns: str) -> None:
    """A row leaves nothing in its namespace: the next test's child (trio.run_process,
    as socat's in test_udp_dns.py) runs where that test's proxies listen."""
    with inside(netns):
        assert await run_client(netns, "print(1)") == 1
    home = os.readlink("/proc/thread-self/ns/net")
    done = await trio.run_process(["readlink", "/proc/self/ns/net"], capture_stdout=True)
    assert done.stdout.decode().strip() == home
