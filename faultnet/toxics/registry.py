"""Where toxics register themselves: :data:`TOXICS` maps a Toxiproxy type name to its
class, filled by the :func:`register` decorator on each toxic's class as its module is
imported (:mod:`faultnet.toxics` imports every module of the package)."""

from __future__ import annotations

from typing import TypeVar

from faultnet.toxics._attributes import AttributeToxic

__all__ = ["TOXICS", "register"]

#: Toxiproxy type name -> class, in the order the modules were imported.
TOXICS: dict[str, type[AttributeToxic]] = {}

T = TypeVar("T", bound=type[AttributeToxic])


def register(cls: T) -> T:
    """Class decorator: make *cls* the toxic of type ``cls.type`` (ValueError if taken)."""
    existing = TOXICS.get(cls.type)
    if existing is not None and existing is not cls:
        raise ValueError(f"toxic type {cls.type!r} is taken by {existing.__qualname__}")
    TOXICS[cls.type] = cls
    return cls
