"""Typed, validated, live-updatable attributes shared by every built-in toxic.

Each toxic class declares its attributes once (:class:`Attribute`: Toxiproxy's name, the
default, the unit, the smallest value allowed). :class:`AttributeToxic` turns that into
the constructor, :meth:`~AttributeToxic.attributes` and :meth:`~AttributeToxic.update`.

Values are JSON integers, as Toxiproxy's (Go ``int64``) are: a bool, a float, a string
or a number outside the int64 range is a :class:`TypeError`/:class:`ValueError`, which the
HTTP API answers with 400. Protocol toxics also take strings (:class:`TextAttribute`: a
method, a path glob, a body), which Toxiproxy's clients send as they are. An update is atomic: every value is checked before any is
applied, so a rejected update changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from faultnet.toxics.base import Toxic, ToxicContext, refuse_unknown

__all__ = ["INT64_MAX", "INT64_MIN", "Attribute", "AttributeToxic", "TextAttribute"]

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


@dataclass(frozen=True)
class Attribute:
    """One integer attribute of a toxic, as Toxiproxy names it."""

    name: str
    default: int
    #: What it means, unit included (ms, KB/s with KB = 1000 bytes, bytes, µs).
    doc: str
    #: Smallest accepted value. Toxiproxy checks nothing; negative delays and sizes are
    #: meaningless, so they are refused here (bandwidth's rate keeps ``<= 0`` = unlimited).
    minimum: int = 0
    #: Largest accepted value.
    maximum: int = INT64_MAX

    def check(self, value: Any) -> int:
        """Return *value* as this attribute's int, or raise TypeError/ValueError."""
        # bool is an int subclass in Python; JSON true is not a number.
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"attribute {self.name} must be an integer ({self.doc}), "
                f"not {type(value).__name__} {value!r}"
            )
        if not self.minimum <= value <= self.maximum:
            raise ValueError(
                f"attribute {self.name} must be between {self.minimum} and {self.maximum}, "
                f"not {value}"
            )
        return value


@dataclass(frozen=True)
class TextAttribute:
    """One string attribute of a toxic (a method, a glob, a body). Malformed text is
    refused (ValueError) when the toxic is made or updated: text that is not one of
    *choices* (where given), or that *parse* raises ValueError on (a header line without
    a colon, a CA file that does not load)."""

    name: str
    default: str
    doc: str
    choices: tuple[str, ...] = ()
    parse: Callable[[str], object] | None = None

    def check(self, value: Any) -> str:
        """Return *value* as this attribute's str, or raise TypeError."""
        if not isinstance(value, str):
            raise TypeError(
                f"attribute {self.name} must be a string ({self.doc}), "
                f"not {type(value).__name__} {value!r}"
            )
        return value

    def refuse_malformed(self, value: str) -> None:
        """Raise ValueError if *value* (a str, checked) means nothing."""
        if self.choices and value not in self.choices:
            allowed = " or ".join(repr(c) for c in self.choices)
            raise ValueError(f"attribute {self.name} must be {allowed}, not {value!r}")
        if self.parse is not None:
            self.parse(value)


class AttributeToxic(Toxic):
    """A :class:`Toxic` whose behaviour is set by integer attributes, updatable live.

    ``update`` wakes any per-connection timer waiting in :meth:`wait_until` so a changed
    deadline takes effect at once, not when the old one expires.
    """

    ATTRIBUTES: ClassVar[tuple[Attribute | TextAttribute, ...]] = ()

    def __init__(
        self,
        name: str | None = None,
        stream: str = "downstream",
        toxicity: float = 1.0,
        **attributes: Any,
    ) -> None:
        super().__init__(name if name is not None else f"{self.type}_{stream}", stream, toxicity)
        for attr in self.ATTRIBUTES:
            setattr(self, attr.name, attr.default)
        self._changed = trio.Event()
        self.update(attributes)

    @classmethod
    def check_attributes(cls, attributes: Any) -> dict[str, Any]:
        """Validate a JSON ``attributes`` value; return the known keys, checked.

        A ``null`` value leaves its attribute unchanged (as Toxiproxy's JSON decoding
        does); an unknown key is refused, naming the known ones (issue 33: ``stauts`` was
        accepted and did nothing; Toxiproxy's own clients send only known keys). Raises
        TypeError/ValueError.
        """
        if attributes is None:
            return {}
        refuse_unknown(cls.type, attributes, [attr.name for attr in cls.ATTRIBUTES])
        checked: dict[str, Any] = {}
        for attr in cls.ATTRIBUTES:
            value = attributes.get(attr.name)
            if value is not None:
                checked[attr.name] = attr.check(value)
        # Every type first, then what each well-typed text means (a header line without
        # a colon...), in the order ATTRIBUTES declares them.
        for attr in cls.ATTRIBUTES:
            if isinstance(attr, TextAttribute) and attr.name in checked:
                attr.refuse_malformed(checked[attr.name])
        return checked

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Merge *attributes* into this toxic, all or nothing (refused as
        :meth:`~faultnet.toxics.base.Toxic.check_update` says); live for every connection."""
        checked = self.check_update(attributes)
        for key, value in checked.items():
            setattr(self, key, value)
        if checked:
            # Wake timers waiting on the old values, then arm a fresh event.
            self._changed.set()
            self._changed = trio.Event()

    def attributes(self) -> dict[str, Any]:
        return {attr.name: getattr(self, attr.name) for attr in self.ATTRIBUTES}

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in self.attributes().items())
        return (
            f"<{type(self).__name__} {self.name!r} {self.stream} toxicity={self.toxicity} {attrs}>"
        )

    # -- helpers for timers ------------------------------------------------------------

    def applied_at(self, ctx: ToxicContext) -> float:
        """The trio time this toxic began to apply to *ctx*'s connection (first call)."""
        at: float = ctx.state.setdefault("applied_at", trio.current_time())
        return at

    async def wait_until(self, start: float, attribute: str, *, zero_is_never: bool) -> None:
        """Sleep until ``start + <attribute> ms``, re-reading the attribute on each update.

        An update moves the deadline (measured from *start*, not from the update); a
        deadline already past returns at once. With *zero_is_never*, a value of 0 means
        wait until an update sets a non-zero value.
        """
        while True:
            changed = self._changed
            ms: int = getattr(self, attribute)
            if ms == 0 and zero_is_never:
                await changed.wait()
                continue
            with trio.move_on_at(start + ms / 1000):
                await changed.wait()
                continue
            return
