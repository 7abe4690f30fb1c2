"""The toxic registry (faultnet.toxics.registry): Toxiproxy's types, each documenting its
units, and a toxic that registers itself is known to the codec and the OpenAPI document."""

from __future__ import annotations

import pytest

from faultnet.server.toxic_codec import toxic_from_json, toxic_to_json
from faultnet.toxics import TOXICS, Attribute


def test_registry_has_toxiproxy_types() -> None:
    assert set(TOXICS) >= {
        "latency",
        "bandwidth",
        "slicer",
        "limit_data",
        "slow_close",
        "timeout",
        "reset_peer",
    }
    # The rest are faultnet's protocol toxics (faultnet.toxics.http...).
    assert all(
        name.startswith(("http_", "http2_", "grpc_", "tls_"))
        or name in ("dns", "redis", "postgres")
        for name in set(TOXICS)
        - {"latency", "bandwidth", "slicer", "limit_data", "slow_close", "timeout", "reset_peer"}
    )
    units = (
        "millisecond",
        "KB/s",
        "bytes",
        "microsecond",
        "percent",
        "requests",
        "status code",
        "flag",
        "rows",
    )
    for name, cls in TOXICS.items():
        assert cls.type == name
        for attr in cls.ATTRIBUTES:  # every number documents its unit
            if isinstance(attr, Attribute):
                assert any(u in attr.doc for u in units), (name, attr)


def test_a_registered_toxic_is_known_to_the_codec_and_the_openapi_document(
    request: pytest.FixtureRequest,
) -> None:
    from faultnet.server.openapi import openapi_document
    from faultnet.toxics import Attribute, AttributeToxic, register

    # Every module holds the same TOXICS dict: restore its entries afterwards.
    saved = dict(TOXICS)
    request.addfinalizer(lambda: (TOXICS.clear(), TOXICS.update(saved)))

    @register
    class Drop(AttributeToxic):
        type = "test_drop"
        ATTRIBUTES = (Attribute("drop_percent", 0, "share of chunks dropped, in percent (bytes)"),)

    t = toxic_from_json({"type": "test_drop", "attributes": {"drop_percent": 5}})
    assert isinstance(t, Drop) and toxic_to_json(t)["attributes"] == {"drop_percent": 5}
    schemas = openapi_document("x")["components"]["schemas"]
    assert "test_drop" in schemas["ToxicCreate"]["properties"]["type"]["enum"]
    drop = schemas["Toxic"]["properties"]["attributes"]["properties"]["drop_percent"]
    assert drop == {
        "type": "integer",
        "minimum": 0,
        "description": "test_drop: share of chunks dropped, in percent (bytes)",
        # Toxiproxy's Go client sends a nil map's values as null: every attribute is.
        "nullable": True,
    }
    with pytest.raises(ValueError, match="taken"):

        @register
        class Other(AttributeToxic):
            type = "test_drop"
