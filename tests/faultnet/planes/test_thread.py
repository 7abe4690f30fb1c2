"""The thread data plane (faultnet.planes.thread): what only it has. The proxy's own
tests (tests/faultnet/test_proxy.py) run on the default plane (the native one where it
was built, this one elsewhere); test_plane_contract.py here runs every plane through
the interface, test_native.py what only the native one has.
"""

from __future__ import annotations

import os
import threading
import types

import pytest
import trio

from faultnet.eventlog import read_jsonl
from faultnet.planes import thread as dataplane
from faultnet.proxy import open_proxy
from faultnet.testing import echo_server
from tests.faultnet.planes.common import ended_and_another_forwards, freeze_while_held, only_link


@pytest.mark.parametrize("where", ["common case", "general path"])
async def test_a_bug_in_the_forwarding_thread_ends_only_its_connection(
    tmp_path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The breakage: the thread meets a bug on one connection's bytes, in the loop's
    inlined common case (a lane whose byte counter is not a number) or in the general
    path (_handle raises; the lane is frozen, so its bytes go there). That connection
    ends (conn_error logged); the thread and other connections go on."""
    log = tmp_path / "events.jsonl"
    handle = dataplane.Plane._handle
    doomed: list[dataplane.Link] = []

    def buggy(self, entry):
        if entry[0] in doomed:
            raise RuntimeError("a bug in the forwarding thread")
        return handle(self, entry)

    monkeypatch.setattr(dataplane.Plane, "_handle", buggy)
    async with echo_server() as up, open_proxy(up, event_log=str(log), dataplane="thread") as proxy:
        victim = await trio.open_tcp_stream(*proxy.address)
        link = await only_link(proxy)
        if where == "common case":
            with link.plane.lock:
                link.lanes["upstream"].bytes = None  # type: ignore[assignment]
        else:
            link.freeze(["upstream"])
            doomed.append(link)
        await victim.send_all(b"boom")
        await ended_and_another_forwards(proxy, victim)
    errors = [r for r in read_jsonl(log).records if r["event"] == "conn_error"]
    assert len(errors) == 1
    why = "unsupported operand" if where == "common case" else "a bug in the forwarding thread"
    assert why in errors[0]["error"], errors


async def _freeze_during_a_write(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, bool]:
    """Freeze a lane while the thread is inside its write; return (the lane's counter
    when freeze() returned, the counter at the end, whether freeze() returned while the
    write was still held).

    A real write cannot be paused, so the thread's os.write is a stand-in (faultnet.
    dataplane's ``os`` only) that holds the lane's first write until it is let go; the
    window it is held for (0.2 s) is the scenario: freeze() is called inside it."""
    entered, let_go = threading.Event(), threading.Event()
    target: list[int] = []
    real_write = os.write

    def held_write(fd: int, data) -> int:
        if target and fd == target[0]:
            target.clear()
            entered.set()
            let_go.wait(10)
        return real_write(fd, data)

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if k[:2] != "__"})
    fake_os.write = held_write
    monkeypatch.setattr(dataplane, "os", fake_os)  # before the thread binds it
    async with echo_server() as up, open_proxy(up, dataplane="thread") as proxy:
        client = await trio.open_tcp_stream(*proxy.address)
        link = await only_link(proxy)
        lane = link.lanes["upstream"]
        target.append(lane.dst_fd)
        await client.send_all(b"x")
        assert await trio.to_thread.run_sync(entered.wait, 5), "the write never started"
        at_return, early = await freeze_while_held(link, lambda: lane.bytes, let_go.set)
        return at_return, link.counts()[0], early


async def test_freeze_waits_for_the_write_in_progress_on_its_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lock's guarantee, shown deterministically: freeze() called while the thread
    is inside a lane's write returns only after that write is done and counted, so
    the counter it leaves is final and nothing crosses after it returns."""
    at_return, final, early = await _freeze_during_a_write(monkeypatch)
    assert not early and at_return == final == 1


async def test_the_write_check_goes_red_when_freeze_skips_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The breakage: a freeze that closes the gate without the plane's lock returns at
    once, and the byte the thread was writing crosses after it."""

    def unlocked_freeze(self: dataplane.Link, streams) -> None:
        for s in streams:
            self.lanes[s].open = False

    monkeypatch.setattr(dataplane.Link, "freeze", unlocked_freeze)
    at_return, final, early = await _freeze_during_a_write(monkeypatch)
    assert early and (at_return, final) == (0, 1)


async def test_a_stop_between_the_wake_up_s_look_and_its_read_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race made certain: the thread is woken (as add() wakes it), and its read of
    the wake-up counter is held until a stop() in another thread has set its flag and
    written. The thread must end and the stop return; with the flag looked at before
    the read, the stop's write was consumed and the join waited forever."""
    plane = dataplane.Plane()
    plane.start(trio.lowlevel.current_trio_token())
    written = threading.Event()
    stopper: list[threading.Thread] = []
    real_read, real_write = os.eventfd_read, os.eventfd_write

    def write(fd: int, value: int) -> None:
        real_write(fd, value)
        if threading.current_thread() in stopper:
            written.set()

    def read(fd: int) -> int:
        if threading.current_thread().name == "faultnet-dataplane" and not stopper:
            stopper.append(threading.Thread(target=plane.stop, daemon=True))
            stopper[0].start()
            assert written.wait(10), "stop() did not write its wake-up"
        return real_read(fd)

    fake_os = types.SimpleNamespace(
        **{name: getattr(os, name) for name in dir(os) if not name.startswith("__")}
    )
    fake_os.eventfd_read, fake_os.eventfd_write = read, write
    monkeypatch.setattr(dataplane, "os", fake_os)
    real_write(plane._wake, 1)  # a wake-up, as add() makes
    assert await trio.to_thread.run_sync(written.wait, 10), "the thread never woke"
    await trio.to_thread.run_sync(stopper[0].join, 10)
    if stopper[0].is_alive():
        real_write(plane._wake, 1)  # let the lost stop through, then fail
        await trio.to_thread.run_sync(stopper[0].join, 10)
        pytest.fail("the stop was lost: the thread went back to its poll")
