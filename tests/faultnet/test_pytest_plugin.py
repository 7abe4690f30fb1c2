"""faultnet's pytest plugin: its fixtures used here directly, and (through pytester, in a
subprocess) its teardown, seed replay and report header."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

import faultnet.controls
import faultnet.pytest_plugin
from faultnet.server import RunningServer
from faultnet.testing import start_server

pytest_plugins = ["pytester"]


async def test_factory_gives_a_started_proxy_with_its_faults(
    faultnet_proxy: faultnet.pytest_plugin.ProxyFactory,
    faultnet_controls: SimpleNamespace,
    nursery: trio.Nursery,
) -> None:
    upstream = await start_server(nursery)
    proxy = await faultnet_proxy(upstream=upstream)
    second = await faultnet_proxy(upstream, name="named")
    assert proxy.address is not None and proxy.address != second.address
    assert (proxy.name, second.name) == ("proxy1", "named")
    await faultnet_controls.assert_accepting(proxy.address)
    stream = await trio.open_tcp_stream(*proxy.address)
    await stream.send_all(b"up")  # a round trip: the proxy has its upstream connection
    with trio.fail_after(5):
        assert await stream.receive_some() == b"up"
    await proxy.freeze()
    await faultnet_controls.assert_frozen(stream, stream, window=0.2)
    await proxy.thaw()
    await proxy.refuse()
    await faultnet_controls.assert_refusing(proxy.address)
    await proxy.restore()
    await faultnet_controls.assert_accepting(proxy.address)
    await proxy.reset()
    await faultnet_controls.assert_reset(stream)


def test_controls_are_reexported() -> None:
    for name in faultnet.controls.__all__:  # the one list: found lazily by the plugin
        assert getattr(faultnet.pytest_plugin, name) is getattr(faultnet.controls, name)
    with pytest.raises(AttributeError):
        faultnet.pytest_plugin.no_such_control  # noqa: B018
    with pytest.raises(AttributeError):
        faultnet.pytest_plugin.assert_melted  # noqa: B018


async def test_server_fixture(faultnet_server: RunningServer) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=faultnet_server.url) as api:
        assert (await api.get("/version")).status_code == 200
        r = await api.post("/proxies", json={"name": "x", "upstream": "h:1", "listen": "0.0.0.0:0"})
        assert r.status_code == 400  # loopback only, in tests


INNER = """
import json, os
from faultnet.testing import start_server

async def test_inner(faultnet_proxy, faultnet_seed, nursery):
    proxy = await faultnet_proxy(await start_server(nursery))
    with open(os.environ["FAULTNET_PLUGIN_OUT"], "w") as f:
        json.dump({"address": proxy.address, "seed": proxy.seed, "session": faultnet_seed}, f)
"""


LEAN = ("-p", "no:schemathesis", "-p", "no:hypothesispytest", "-p", "no:benchmark")


def _run_inner(pytester: pytest.Pytester, out: Path, *args: str) -> dict[str, object]:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_inner=INNER)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAULTNET_PLUGIN_OUT", str(out))
        # Plugins this test does not need are left out: they cost seconds of imports.
        result = pytester.runpytest_subprocess(*args, *LEAN)
    result.assert_outcomes(passed=1)
    data = json.loads(out.read_text())
    data["header"] = [line for line in result.outlines if line.startswith("faultnet seed:")]
    return data


async def _refused(address: list[object]) -> None:
    await faultnet.controls.assert_refusing((str(address[0]), int(str(address[1]))))


def test_teardown_closes_and_seed_replays(pytester: pytest.Pytester, tmp_path: Path) -> None:
    a = _run_inner(pytester, tmp_path / "a.json", "--faultnet-seed", "77")
    b = _run_inner(pytester, tmp_path / "b.json", "--faultnet-seed", "77")
    c = _run_inner(pytester, tmp_path / "c.json")
    assert a["session"] == b["session"] == 77 and a["seed"] == b["seed"]
    assert c["seed"] != a["seed"]
    assert a["header"] == ["faultnet seed: 77 (replay with --faultnet-seed)"]
    assert c["header"] == [f"faultnet seed: {c['session']} (replay with --faultnet-seed)"]
    # The proxy was closed at teardown: its port refuses now.
    trio.run(_refused, c["address"])


def test_importing_the_plugin_stays_cheap() -> None:
    # pytest loads the plugin into every run where faultnet is installed: it must not
    # import trio or the proxy (it did through faultnet/__init__, 1.3 s a run).
    import subprocess
    import sys

    code = "import sys, faultnet.pytest_plugin; print(sorted(m for m in sys.modules if m in ('trio', 'faultnet.proxy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out
