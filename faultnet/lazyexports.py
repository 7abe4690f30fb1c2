"""A package's public names, imported on first use (PEP 562).

Importing a package of faultnet's (or the harness's) must stay cheap where the CLI
imports it only to register commands: its heavy modules load when a name is first read.
One mechanism for every such ``__init__``::

    __getattr__, __dir__ = lazy_exports(__name__, {"Runner": "faultnet.chaos._run"})

A name maps to the module that defines it; any other attribute is tried as a submodule
(as eager imports made every submodule an attribute before); dunder names are never
imported. A name read once is kept in the package's globals.

Where another module declares a list of names once (``faultnet.controls.__all__``),
*everything_in* exports all of them, read from that module when one is first asked
for. A package that states no ``__all__`` of its own gets one computed on first read:
*exports*, then each *everything_in* module's list (a name the package defines
eagerly may be in *exports* too, to be listed: its global is found first).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], *, everything_in: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of *package*, exporting *exports* (public
    name -> the absolute name of the module that defines it) and every name in the
    ``__all__`` of each module in *everything_in*."""

    def listed() -> dict[str, str]:
        return {
            name: module
            for module in everything_in
            for name in importlib.import_module(module).__all__
        }

    def __getattr__(name: str) -> Any:
        value: Any
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name == "__all__":
            value = [*sorted(exports), *listed()]
        elif name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError:
                # Not a submodule: a listed name? (Asked second, so that reaching a
                # submodule never imports the listing modules.)
                found = listed() if everything_in else {}
                if name not in found:
                    raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
                value = getattr(importlib.import_module(found[name]), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        names = {*vars(sys.modules[package]), *exports}
        return sorted(names | set(listed()) if everything_in else names)

    return __getattr__, __dir__
