"""Toxics as Toxiproxy's HTTP API reads and writes them: the JSON codec and its errors.

:func:`toxic_from_json` builds a toxic from an API body (Toxiproxy's defaults, checks and
messages, in its order); :func:`check_update` validates an update body;
:func:`toxic_to_json` renders one. Every error raised for a client's mistake is a
:class:`ToxicError` carrying the HTTP status and message Toxiproxy answers with (400, or
409 for a name taken).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from faultnet.server.names import name_problem
from faultnet.toxics import STREAMS, TOXICS, Toxic

__all__ = [
    "BadToxicBody",
    "InvalidStream",
    "InvalidToxicType",
    "ToxicError",
    "ToxicExists",
    "check_toxicity",
    "check_update",
    "toxic_from_json",
    "toxic_to_json",
]


class ToxicError(ValueError):
    """A client's mistake in a toxic body: Toxiproxy's status and message."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadToxicBody(ToxicError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"bad request body: {detail}")


class InvalidStream(ToxicError):
    def __init__(self) -> None:
        super().__init__("stream was invalid, can be either upstream or downstream")


class InvalidToxicType(ToxicError):
    def __init__(self) -> None:
        super().__init__("invalid toxic type")


class ToxicExists(ToxicError):
    status = 409

    def __init__(self) -> None:
        super().__init__("toxic already exists")


def check_toxicity(value: Any) -> float:
    """A toxicity: a JSON number from 0 to 1 (the probability a connection is affected)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadToxicBody(f"toxicity must be a number, not {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise BadToxicBody(f"toxicity must be between 0 and 1, not {value!r}")
    return float(value)


def _string_field(body: Mapping[str, Any], key: str, default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise BadToxicBody(f"{key} must be a string, not {type(value).__name__} {value!r}")
    return value


def toxic_from_json(body: Any, taken: Callable[[str], bool] = lambda name: False) -> Toxic:
    """Build a toxic from a ``POST /proxies/{p}/toxics`` body.

    Defaults as Toxiproxy's: stream ``downstream``, toxicity 1.0, name
    ``<type>_<stream>``. Checks in Toxiproxy's order: body shape and field types, stream,
    type, name not *taken* (:class:`ToxicExists`, 409), then the attributes.
    """
    if not isinstance(body, Mapping):
        raise BadToxicBody(f"expected a JSON object, not {type(body).__name__}")
    stream = _string_field(body, "stream", "downstream").lower()
    type_name = _string_field(body, "type", "")
    name = _string_field(body, "name", "")
    toxicity = check_toxicity(body["toxicity"]) if body.get("toxicity") is not None else 1.0
    if stream not in STREAMS:
        raise InvalidStream()
    cls = TOXICS.get(type_name)
    if cls is None:
        raise InvalidToxicType()
    name = name or f"{type_name}_{stream}"
    problem = name_problem(name)
    if problem is not None:
        raise BadToxicBody(f"toxic name {problem}")
    if taken(name):
        raise ToxicExists()
    try:
        attributes = cls.check_attributes(body.get("attributes"))
        # The values together (a dns toxic's action and its figure), as made.
        return cls(name, stream, toxicity, **attributes)
    except (TypeError, ValueError) as exc:
        raise BadToxicBody(str(exc)) from None


def check_update(toxic: Toxic, body: Any) -> tuple[dict[str, Any], float | None]:
    """Validate a toxic update body against *toxic*; return ``(attributes, toxicity)``.

    Only ``attributes`` (merged) and ``toxicity`` are read, as Toxiproxy does; toxicity
    is None when the body leaves it unchanged. Nothing is applied here.
    """
    if not isinstance(body, Mapping):
        raise BadToxicBody(f"expected a JSON object, not {type(body).__name__}")
    toxicity = check_toxicity(body["toxicity"]) if body.get("toxicity") is not None else None
    try:
        attributes = toxic.check_update(body.get("attributes"))
    except (TypeError, ValueError) as exc:
        raise BadToxicBody(str(exc)) from None
    return attributes, toxicity


def toxic_to_json(toxic: Toxic) -> dict[str, Any]:
    """The toxic as Toxiproxy renders it: name, type, stream, toxicity, attributes."""
    return {
        "name": toxic.name,
        "type": toxic.type,
        "stream": toxic.stream,
        "toxicity": toxic.toxicity,
        "attributes": toxic.attributes(),
    }
