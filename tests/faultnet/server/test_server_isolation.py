"""The control plane answers whatever the data plane is doing: the API is served from
a thread with a trio loop of its own, and only a registry operation crosses into the
proxies' loop (issue 24 item 17: in one shared loop, ~1,600 connections/s through a
proxy took GET /version from 1 ms to 36-120 ms at p99)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
import trio

from faultnet.server import open_server
from faultnet.testing import echo_server


def _get(url: str, into: list[object], got: threading.Event) -> None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
            into.append(json.loads(resp.read()))
    except OSError as exc:
        into.append(exc)
    finally:
        got.set()


async def test_the_api_answers_while_the_proxies_loop_is_held_without_a_checkpoint() -> None:
    async with open_server() as server:
        answers: list[object] = []
        got = threading.Event()
        client = threading.Thread(target=_get, args=(server.url + "/version", answers, got))
        client.start()
        # Hold the proxies' loop (this one) with no checkpoint until the answer came, as
        # a storm of accepts holds it; in one shared loop it could never come.
        answered = got.wait(10)
        client.join(10)
        assert answered, "GET /version was not answered while the proxies' loop was busy"
        assert isinstance(answers[0], dict) and answers[0]["server"] == "faultnet", answers


async def test_a_registry_operation_crosses_into_the_proxies_loop_and_back() -> None:
    async with echo_server() as upstream, open_server() as server:
        body = json.dumps({"name": "db", "upstream": f"{upstream[0]}:{upstream[1]}"})

        def create() -> dict[str, object]:
            req = urllib.request.Request(server.url + "/proxies", data=body.encode())
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
                return json.loads(resp.read())

        made = await trio.to_thread.run_sync(create)
        assert made["name"] == "db"
        assert "db" in server.registry.proxies  # made in this loop, by the registry


def _call(url: str, method: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_plain_operation_crosses_with_no_task_an_awaited_one_with_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 36: a task spawned per operation cost ~9 us of a no-op's 53 us hop; a toxic's
    # add and remove are plain when the registry's lock is free (under_lock).
    spawned: list[str] = []
    real = trio.lowlevel.spawn_system_task

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        spawned.append(fn.__qualname__)
        return real(fn, *args, **kwargs)

    async with echo_server() as upstream, open_server() as server:
        monkeypatch.setattr(trio.lowlevel, "spawn_system_task", counting)
        toxic = {"name": "lat", "type": "latency", "attributes": {"latency": 0}}
        steps = [
            ("POST", "/proxies", {"name": "db", "upstream": f"{upstream[0]}:{upstream[1]}"}),
            ("POST", "/proxies/db/toxics", toxic),
            ("POST", "/proxies/db/toxics/lat", {"attributes": {"latency": 1}}),
            ("GET", "/proxies/db", None),
            ("DELETE", "/proxies/db/toxics/lat", None),
            ("DELETE", "/proxies/db/toxics/lat", None),  # a 404 raised in the callback
        ]
        statuses = []
        for method, path, body in steps:
            status, _ = await trio.to_thread.run_sync(_call, server.url + path, method, body)
            statuses.append(status)
        monkeypatch.undo()
        assert statuses == [201, 200, 200, 200, 204, 404]
        assert [s for s in spawned if "await_there" in s] == [
            "_ApiThread.on_registry.<locals>.await_there"
        ], spawned  # the create's, only


async def test_a_toxic_added_while_the_lock_is_held_waits_for_it() -> None:
    async with echo_server() as upstream, open_server() as server:
        registry = server.registry
        made = {"name": "db", "upstream": f"{upstream[0]}:{upstream[1]}"}
        status, _ = await trio.to_thread.run_sync(_call, server.url + "/proxies", "POST", made)
        assert status == 201
        toxic = {"name": "lat", "type": "latency", "attributes": {"latency": 0}}
        reached = trio.Event()
        when_locked = registry._when_locked

        def waiting(fn: Any) -> Any:
            reached.set()
            return when_locked(fn)

        registry._when_locked = waiting  # type: ignore[method-assign]
        answers: list[tuple[int, object]] = []

        async def add() -> None:
            url = server.url + "/proxies/db/toxics"
            answers.append(await trio.to_thread.run_sync(_call, url, "POST", toxic))

        async with trio.open_nursery() as nursery:
            async with registry._lock:  # as a create binding its listener holds it
                nursery.start_soon(add)
                with trio.fail_after(10):
                    await reached.wait()  # the add reached this loop and found it held
                assert registry.get("db").toxics == [] and answers == []
        assert answers[0][0] == 200
        assert [t.name for t in registry.get("db").toxics] == ["lat"]
