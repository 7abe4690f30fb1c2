"""faultnet's pytest plugin (entry point ``faultnet``): fixtures for trio tests.

Fixtures (async tests under pytest-trio):

* ``faultnet_proxy`` -- a factory: ``proxy = await faultnet_proxy(upstream=(host, port))``
  starts a :class:`faultnet.Proxy` in the test's nursery and returns it, listening (its
  ``address`` is set). Its fault methods (freeze, thaw, blackhole, sever, reset,
  drop_syn, refuse, restore) and toxics are the proxy's own. Every proxy made is
  closed at teardown.
* ``faultnet_controls`` -- the controls that prove a mode is in force:
  ``assert_accepting``, ``assert_syn_dropped``, ``assert_refusing``, ``assert_frozen``,
  ``assert_blackholed``, ``assert_severed``, ``assert_reset`` (and ``ControlFailed``).
  They are importable from this module too.
* ``faultnet_server`` -- the Toxiproxy-compatible HTTP API running in the test
  (``.url``, ``.registry``), for tests that drive proxies through a Toxiproxy client.
  Its proxies may listen on loopback only.
* ``faultnet_seed`` -- the session's seed. Every proxy the fixtures make gets a seed
  derived from it and the test's id, so ``pytest --faultnet-seed N`` replays each test's
  random choices (toxicity, jitter, slicing). The seed is printed in the report header.

This module is loaded into every pytest run where faultnet is installed, so importing it
stays cheap: faultnet itself is imported inside the fixtures.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import trio

    from faultnet.proxy import Proxy
    from faultnet.server import RunningServer


__all__ = ["ProxyFactory"]  # and the controls, found lazily below

#: ``await faultnet_proxy(upstream, listen=..., **Proxy kwargs) -> Proxy``
ProxyFactory = Callable[..., Awaitable["Proxy"]]


def _controls() -> dict[str, Any]:
    # The controls as faultnet.controls.__all__ lists them (the one list).
    import faultnet.controls

    return {name: getattr(faultnet.controls, name) for name in faultnet.controls.__all__}


def __getattr__(name: str) -> Any:
    # The controls, re-exported lazily (importing them pulls in trio). Only their names
    # reach the import: pytest looks up many other attributes on a plugin module.
    if name == "ControlFailed" or name.startswith("assert_"):
        controls = _controls()
        if name in controls:
            return controls[name]
    raise AttributeError(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("faultnet")
    group.addoption(
        "--faultnet-seed",
        type=int,
        default=None,
        help="seed for the proxies made by faultnet's fixtures (default: random, printed)",
    )


def pytest_configure(config: pytest.Config) -> None:
    seed = config.getoption("faultnet_seed", None)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    config.stash[_SEED_KEY] = seed


def pytest_report_header(config: pytest.Config) -> str:
    return f"faultnet seed: {config.stash[_SEED_KEY]} (replay with --faultnet-seed)"


_SEED_KEY = pytest.StashKey[int]()


def _derive(seed: int, nodeid: str, index: int) -> int:
    from faultnet.seeds import derive_seed

    return derive_seed(seed, nodeid, index)


@pytest.fixture(scope="session")
def faultnet_seed(pytestconfig: pytest.Config) -> int:
    """The session's seed (``--faultnet-seed``, or chosen at random and printed)."""
    return pytestconfig.stash[_SEED_KEY]


@pytest.fixture
async def faultnet_proxy(
    nursery: trio.Nursery, faultnet_seed: int, request: pytest.FixtureRequest
) -> AsyncIterator[ProxyFactory]:
    """Factory of started proxies, closed at teardown (see the module's docstring)."""
    from faultnet.proxy import Proxy

    made: list[Proxy] = []

    async def make(
        upstream: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        **kwargs: Any,
    ) -> Proxy:
        kwargs.setdefault("name", f"proxy{len(made) + 1}")
        kwargs.setdefault("seed", _derive(faultnet_seed, request.node.nodeid, len(made)))
        proxy = Proxy(upstream, listen, **kwargs)
        await nursery.start(proxy.serve)
        made.append(proxy)
        return proxy

    yield make
    for proxy in reversed(made):
        await proxy.aclose()


@pytest.fixture
def faultnet_controls() -> SimpleNamespace:
    """The controls as attributes: ``faultnet_controls.assert_refusing(addr)``..."""
    return SimpleNamespace(**_controls())


@pytest.fixture
async def faultnet_server(
    faultnet_seed: int, request: pytest.FixtureRequest
) -> AsyncIterator[RunningServer]:
    """The HTTP API on a free loopback port, running for the test."""
    from faultnet.server import open_server

    async with open_server(
        "127.0.0.1",
        0,
        seed=_derive(faultnet_seed, request.node.nodeid, -1),
        listen_hosts={"127.0.0.1", "::1", "localhost"},
    ) as server:
        yield server
