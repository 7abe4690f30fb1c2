"""A package's public names, imported on first use (PEP 562).

Importing a package of faultnet's (or the harness's) must stay cheap where the CLI
imports it only to register commands: its heavy modules load when a name is first read.
One mechanism for every such ``__init__``::

    __getattr__, __dir__ = lazy_exports(__name__, {"Runner": "faultnet.chaos._run"})

A name maps to the module that defines it; any other attribute is tried as a submodule
(as eager imports made every submodule an attribute before); dunder names are never
imported. A name read once is kept in the package's globals.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of *package*, exporting *exports* (public
    name -> the absolute name of the module that defines it)."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
