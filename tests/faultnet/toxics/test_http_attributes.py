"""Unknown toxic attributes are refused, for every toxic type, naming the known ones
(issue 33, 7: ``stauts`` was accepted and did nothing)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from faultnet.server import RunningServer
from faultnet.toxics import TOXICS


@pytest.mark.parametrize("type_name", sorted(TOXICS))
def test_every_toxic_type_refuses_an_unknown_attribute_naming_its_own(type_name: str) -> None:
    cls = TOXICS[type_name]
    with pytest.raises(
        ValueError, match=f"unknown attribute 'zzz' of toxic {type_name} "
    ) as refused:
        cls.check_attributes({"zzz": 1})
    for name in cls(None).attributes():
        assert name in str(refused.value)


@pytest.fixture
async def api(faultnet_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=faultnet_server.url, timeout=10) as client:
        yield client


async def test_the_api_answers_a_misspelt_attribute_with_a_400_naming_the_right_one(
    api: httpx.AsyncClient,
) -> None:
    r = await api.post(
        "/proxies", json={"name": "p", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9"}
    )
    assert r.status_code == 201, r.text
    body = {"type": "http_abort", "attributes": {"stauts": 404}}
    r = await api.post("/proxies/p/toxics", json=body)
    assert r.status_code == 400, r.text
    assert "'stauts' of toxic http_abort (known: " in r.json()["error"]
    assert "did you mean 'status'?" in r.json()["error"]
    r = await api.post(
        "/proxies/p/toxics", json={"type": "http_abort", "attributes": {"status": 404}}
    )
    assert r.status_code == 200, r.text
    r = await api.post(
        "/proxies/p/toxics/http_abort_downstream", json={"attributes": {"stauts": 1}}
    )
    assert r.status_code == 400 and "status" in r.json()["error"]
