"""The native data plane (faultnet.planes.native and its C core): what only it has.

Its contract is every plane's (tests/faultnet/planes/test_plane_contract.py, and the
proxy's tests, which run on it as the default where it was built); here: freeze waits for the write the native
thread is inside (shown deterministically with the core's debug hold, and red with the
mutex skipped), a fault of the core ends only its connection, and the extension is
optional at build time.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.planes import native
from faultnet.proxy import open_proxy
from faultnet.testing import echo_server, read_exactly, wait_until
from tests.faultnet.planes.common import ended_and_another_forwards, freeze_while_held, only_link

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the native core was not built")

ROOT = Path(__file__).resolve().parents[3]


async def _freeze_during_a_write(unlocked: bool) -> tuple[int, int, bool]:
    """Freeze a lane while the native thread is inside its write (held there by the
    core's debug hook, mutex held, as a slow write would be); return (the lane's count
    when freeze() returned, the count at the end, whether freeze() returned while the
    write was still held). The hold's window (0.2 s) is the scenario."""
    async with echo_server() as up, open_proxy(up, dataplane="native") as proxy:
        client = await trio.open_tcp_stream(*proxy.address)
        link = await only_link(proxy)
        assert isinstance(link, native.Link)
        core = link.plane._core
        core.set_unlocked(unlocked)
        core.hold_write(link.lanes["upstream"].dst.fileno())
        try:
            await client.send_all(b"x")
            assert await trio.to_thread.run_sync(core.wait_held, 5.0), "no write began"
        except BaseException:
            core.release_write()
            raise
        at_return, early = await freeze_while_held(
            link, lambda: link.counts()[0], core.release_write
        )
        core.set_unlocked(False)
        return at_return, link.counts()[0], early


async def test_freeze_waits_for_the_write_in_progress_on_its_lane() -> None:
    """The mutex's guarantee: freeze() called while the native thread is inside a lane's
    write returns only after that write is done and counted."""
    at_return, final, early = await _freeze_during_a_write(unlocked=False)
    assert not early and at_return == final == 1


async def test_the_write_check_goes_red_when_freeze_skips_the_mutex() -> None:
    """The breakage (the core's debug switch): freeze and counts without the mutex
    return at once, and the byte being written crosses after."""
    at_return, final, early = await _freeze_during_a_write(unlocked=True)
    assert early and (at_return, final) == (0, 1)


async def test_a_fault_in_the_core_ends_only_its_connection(tmp_path) -> None:
    """The core meets a failure it cannot pass on as a reset (the debug hook stands in
    for one): that connection ends with ERROR (conn_error logged), the others go on."""
    log = tmp_path / "events.jsonl"
    async with echo_server() as up, open_proxy(up, event_log=str(log), dataplane="native") as p:
        victim = await trio.open_tcp_stream(*p.address)
        link = await only_link(p)
        link._fail_next()
        await victim.send_all(b"boom")
        await ended_and_another_forwards(p, victim)
    errors = [r for r in read_jsonl(log).records if r["event"] == "conn_error"]
    assert len(errors) == 1 and "injected" in errors[0]["error"], errors


async def test_the_core_drops_its_reference_to_every_ended_link() -> None:
    """Ownership: the core holds each link it forwards and lets go once the link's end
    has been drained (else every connection would leak its link)."""
    async with echo_server() as up, open_proxy(up, dataplane="native") as proxy:
        links = []
        for _ in range(5):
            s = await trio.open_tcp_stream(*proxy.address)
            await s.send_all(b"x")
            with trio.fail_after(5):
                assert await read_exactly(s, 1) == b"x"
            links.append(await _last_link(proxy))
            await s.aclose()
        refs = [weakref.ref(link) for link in links]
        await wait_until(lambda: not any(link._in_plane for link in links))
        await wait_until(lambda: not proxy._connections)
        links.clear()
        gc.collect()
        assert [r() for r in refs] == [None] * 5


async def _last_link(proxy) -> native.Link:
    await wait_until(lambda: any(c.link for c in proxy._connections.values()))
    return list(proxy._connections.values())[-1].link


@pytest.mark.skipif(not shutil.which("gcc"), reason="no compiler to hide")
def test_without_a_compiler_the_build_warns_and_installs_the_fallback(tmp_path) -> None:
    """setup.py's build_ext is optional: with the compiler hidden (CC=false) the build
    succeeds, warns, and builds no extension."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "faultnet", tmp_path / "faultnet", ignore=shutil.ignore_patterns("*.so"))
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        env={**os.environ, "CC": "false"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "native data plane was not built" in done.stderr
    assert not list((tmp_path / "faultnet" / "planes").glob("_native*.so"))


# A link the core refuses (its plane stopped) never reached the core's add, so its lanes
# must still say "no pipe" (-1) when it is freed: with the compiled Link's own init
# skipped they said fd 0, and freeing the link closed the process's standard input.
_REFUSED_LINK = """
import gc, os, socket
from faultnet.planes import native
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
plane = native.Plane()
plane._core.start()
plane._core.stop()
a, b = socket.socketpair()
try:
    plane.add(a, b, lambda kind, stream: None)
except RuntimeError as exc:
    print("refused:", exc)
gc.collect()
os.fstat(0)  # EBADF if the freed link closed it
print("stdin open")
"""


#: A child's clean exit. Under ``scripts/memcheck asan`` the child inherits the
#: sanitizers and exits with LeakSanitizer's 99 for CPython's objects alive at exit; an
#: error of the core there is judged by memcheck from the sanitizers' log, not this code.
_CLEAN_EXITS = (0, 99) if "exitcode=99" in os.environ.get("ASAN_OPTIONS", "") else (0,)


def test_a_link_the_stopped_core_refuses_closes_no_descriptor_when_freed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED_LINK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in _CLEAN_EXITS, done.stderr
    assert done.stdout.splitlines() == ["refused: the plane has stopped", "stdin open"]
