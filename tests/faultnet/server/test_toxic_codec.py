"""The toxic codec (faultnet.server.toxic_codec): a toxic to and from Toxiproxy's JSON,
its defaults, its 400s and 409 in Toxiproxy's order, an update checked whole."""

from __future__ import annotations

import math
from typing import Any

import pytest

from faultnet.server.toxic_codec import (
    BadToxicBody,
    InvalidStream,
    InvalidToxicType,
    ToxicExists,
    check_update,
    toxic_from_json,
    toxic_to_json,
)
from faultnet.toxics import Latency


def test_defaults_as_toxiproxy() -> None:
    t = toxic_from_json({"type": "latency"})
    assert toxic_to_json(t) == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 0, "jitter": 0},
    }
    t = toxic_from_json({"type": "slicer", "stream": "UpStream", "toxicity": 0})
    assert (t.name, t.stream, t.toxicity) == ("slicer_upstream", "upstream", 0.0)
    assert t.attributes() == {"average_size": 0, "size_variation": 0, "delay": 0}


def test_null_attributes_ignored_and_unknown_ones_refused() -> None:
    t = toxic_from_json({"type": "latency", "attributes": {"latency": 5, "jitter": None}})
    assert t.attributes() == {"latency": 5, "jitter": 0}
    with pytest.raises(BadToxicBody, match="unknown attribute 'bogus' of toxic latency"):
        toxic_from_json({"type": "latency", "attributes": {"latency": 5, "bogus": "x"}})


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ([], BadToxicBody, "bad request body: expected a JSON object"),
        ({"type": "latency", "name": 3}, BadToxicBody, "bad request body: name must be a string"),
        ({"type": "latency", "stream": "sideways"}, InvalidStream, "stream was invalid"),
        ({"type": "latency", "stream": ""}, InvalidStream, "stream was invalid"),
        ({"type": "nope"}, InvalidToxicType, "invalid toxic type"),
        ({}, InvalidToxicType, "invalid toxic type"),
        ({"type": "latency", "toxicity": "1"}, BadToxicBody, "toxicity must be a number"),
        ({"type": "latency", "toxicity": True}, BadToxicBody, "toxicity must be a number"),
        ({"type": "latency", "toxicity": 1.5}, BadToxicBody, "between 0 and 1"),
        ({"type": "latency", "toxicity": math.nan}, BadToxicBody, "between 0 and 1"),
        ({"type": "latency", "attributes": []}, BadToxicBody, "attributes must be an object"),
        ({"type": "latency", "attributes": {"latency": "5"}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": 5.5}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": True}}, BadToxicBody, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": -1}}, BadToxicBody, "between 0 and"),
        ({"type": "limit_data", "attributes": {"bytes": 2**63}}, BadToxicBody, "between 0 and"),
    ],
)
def test_bad_bodies_are_400(body: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        toxic_from_json(body)
    assert info.value.status == 400  # type: ignore[attr-defined]
    assert str(info.value).startswith(message) or message in str(info.value)


def test_check_order_matches_toxiproxy() -> None:
    # An invalid type is reported before a taken name; a taken name before bad attributes.
    with pytest.raises(InvalidToxicType):
        toxic_from_json({"type": "nope"}, taken=lambda n: True)
    with pytest.raises(ToxicExists) as info:
        toxic_from_json({"type": "latency", "attributes": {"latency": "x"}}, taken=lambda n: True)
    assert info.value.status == 409 and info.value.message == "toxic already exists"


def test_update_is_atomic_and_validated() -> None:
    t = Latency("lat", latency=10, jitter=2)
    with pytest.raises(TypeError):
        t.update({"latency": 20, "jitter": "3"})
    assert t.attributes() == {"latency": 10, "jitter": 2}  # nothing applied
    with pytest.raises(ValueError):
        t.update({"latency": -5})
    t.update({"latency": 20})
    assert t.attributes() == {"latency": 20, "jitter": 2}  # merged
    attrs, toxicity = check_update(t, {"attributes": {"jitter": 1}, "toxicity": 0.5, "x": 1})
    assert (attrs, toxicity) == ({"jitter": 1}, 0.5)
    assert check_update(t, {}) == ({}, None)
    with pytest.raises(BadToxicBody):
        check_update(t, {"attributes": {"jitter": 1.5}})
    with pytest.raises(BadToxicBody):
        check_update(t, {"toxicity": -0.1})
    with pytest.raises(BadToxicBody):
        check_update(t, "x")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"type": "http_abort", "attributes": {"headers": "X-A b"}}, "is not 'Name: value'"),
        ({"type": "http_abort", "attributes": {"header": "X A: b"}}, "is not 'Name: value'"),
        ({"type": "http_header", "attributes": {"add": "nocolon"}}, "is not 'Name: value'"),
        (
            {"type": "http_header", "attributes": {"on": "both"}},
            "attribute on must be 'response' or 'request', not 'both'",
        ),
        (
            {"type": "http_delay", "attributes": {"before": "end"}},
            "attribute before must be 'headers' or 'body' or 'request', not 'end'",
        ),
        (
            {"type": "tls_handshake", "attributes": {"action": "drop"}},
            "attribute action must be 'stall' or 'reset', not 'drop'",
        ),
        # Every value's type is checked before any text's meaning.
        (
            {"type": "http_abort", "attributes": {"header": "X A: b", "status": "503"}},
            "attribute status must be an integer",
        ),
    ],
)
def test_malformed_text_attributes_are_400(body: dict[str, Any], message: str) -> None:
    with pytest.raises(BadToxicBody, match=message) as info:
        toxic_from_json(body)
    assert info.value.status == 400
    # A name alone (a presence test) is a well-formed rule header.
    assert toxic_from_json({"type": "http_abort", "attributes": {"header": "X-A"}}).header == "X-A"
