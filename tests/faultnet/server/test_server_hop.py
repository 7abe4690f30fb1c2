"""A request's hop into the registry's loop (:meth:`faultnet.server.api._ApiThread.on_registry`)
starts no task there for a plain operation (issue 36: the API's own cost per request).

Each registry operation used to run as a system task of the registry's loop: a spawn
and a pass of that loop's scheduler on every request, reads included. A plain
operation now runs in the callback that lands there; only an operation that returns an
awaitable (a change, under the registry's lock) gets a task. The facts are counted
with a trio instrument on the registry's loop (this test's loop), not timed.
"""

from __future__ import annotations

import threading

import trio

from faultnet.server import RunningServer
from faultnet.server.toxic_codec import toxic_to_json


class _Spawns(trio.abc.Instrument):
    """Counts the tasks spawned in the loop it is added to."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def _spawned_by(
    server: RunningServer, method: str, path: str, body: bytes = b""
) -> tuple[int, int]:
    """The status code of *method* *path* (one request on a connection of its own)
    and how many tasks the registry's loop spawned while it was answered."""
    host, _, port = server.url.removeprefix("http://").rpartition(":")
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: test\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    # Connected before counting: trio's connect spawns tasks of its own here.
    stream = await trio.open_tcp_stream(host, int(port))
    spawns = _Spawns()
    got = b""
    async with stream:
        trio.lowlevel.add_instrument(spawns)
        try:
            await stream.send_all(head + body)
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    got += chunk
        finally:
            trio.lowlevel.remove_instrument(spawns)
    return int(got.split(b" ", 2)[1]), spawns.count


async def test_a_plain_operation_runs_in_the_registrys_loop_with_no_task(
    faultnet_server: RunningServer,
) -> None:
    registry = faultnet_server.registry
    ran_in: list[threading.Thread] = []
    index = registry.index

    def watched_index() -> object:
        ran_in.append(threading.current_thread())
        return index()

    registry.index = watched_index  # type: ignore[method-assign]
    status, spawned = await _spawned_by(faultnet_server, "GET", "/proxies")
    assert status == 200
    assert ran_in == [threading.current_thread()]  # the registry's thread, this one
    assert spawned == 0
    # An error raised by a plain operation reaches the client as before.
    status, spawned = await _spawned_by(faultnet_server, "GET", "/proxies/nope/toxics")
    assert status == 404
    assert spawned == 0


async def test_a_change_still_awaits_in_the_registrys_loop(
    faultnet_server: RunningServer,
) -> None:
    body = b'{"name": "hop", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}'
    status, spawned = await _spawned_by(faultnet_server, "POST", "/proxies", body)
    assert status == 201
    assert spawned >= 1  # the operation's own task, awaiting under the registry's lock
    assert "hop" in faultnet_server.registry.proxies
    status, _ = await _spawned_by(faultnet_server, "DELETE", "/proxies/hop")
    assert status == 204
    assert "hop" not in faultnet_server.registry.proxies


TOXIC = b'{"name": "lat", "type": "latency", "attributes": {"latency": 5}}'


async def test_a_toxics_change_runs_with_no_task_while_the_lock_is_free(
    faultnet_server: RunningServer,
) -> None:
    body = b'{"name": "tx", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}'
    assert (await _spawned_by(faultnet_server, "POST", "/proxies", body))[0] == 201
    assert await _spawned_by(faultnet_server, "POST", "/proxies/tx/toxics", TOXIC) == (200, 0)
    update = b'{"attributes": {"latency": 7}}'
    assert await _spawned_by(faultnet_server, "POST", "/proxies/tx/toxics/lat", update) == (200, 0)
    toxic = faultnet_server.registry.get_toxic("tx", "lat")[1]
    assert toxic_to_json(toxic)["attributes"]["latency"] == 7
    # The body's errors, in Toxiproxy's order, as before: 404, then 400, then 409.
    assert (await _spawned_by(faultnet_server, "POST", "/proxies/no/toxics", b"{"))[0] == 404
    assert (await _spawned_by(faultnet_server, "POST", "/proxies/tx/toxics", b"{"))[0] == 400
    assert (await _spawned_by(faultnet_server, "POST", "/proxies/tx/toxics", TOXIC))[0] == 409
    assert await _spawned_by(faultnet_server, "DELETE", "/proxies/tx/toxics/lat") == (204, 0)
    assert faultnet_server.registry.get("tx").toxics == []


async def test_a_toxics_change_waits_for_a_held_lock(faultnet_server: RunningServer) -> None:
    registry = faultnet_server.registry
    body = b'{"name": "held", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}'
    assert (await _spawned_by(faultnet_server, "POST", "/proxies", body))[0] == 201
    answered: list[tuple[int, int]] = []

    async def add() -> None:
        answered.append(await _spawned_by(faultnet_server, "POST", "/proxies/held/toxics", TOXIC))

    async with trio.open_nursery() as nursery:
        async with registry._lock:  # another change (a create, a reset) holds it
            nursery.start_soon(add)
            with trio.fail_after(10):
                # The waiter comes from the API's thread: no event of this loop says
                # so, hence a bounded poll of the lock's own statistics.
                while not registry._lock.statistics().tasks_waiting:  # noqa: ASYNC110
                    await trio.sleep(0.005)
            assert registry.get("held").toxics == []  # not applied under the holder
    assert answered[0][0] == 200
    assert answered[0][1] >= 1  # the change's own task, which waited for the lock
    assert [t.name for t in registry.get("held").toxics] == ["lat"]
