"""The control plane answers whatever the data plane is doing: the API is served from
a thread with a trio loop of its own, and only a registry operation crosses into the
proxies' loop (issue 24 item 17: in one shared loop, ~1,600 connections/s through a
proxy took GET /version from 1 ms to 36-120 ms at p99)."""

from __future__ import annotations

import json
import threading
import urllib.request

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
