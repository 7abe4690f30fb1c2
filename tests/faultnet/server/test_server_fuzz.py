"""Fuzz the API from its own OpenAPI document (schemathesis), against a real
``faultnet server`` process: no unexpected 5xx, answers that match the document, and the
server still serving afterwards.

The only 5xx allowed is Toxiproxy's 500 for a listen address in use. The server runs
with ``--loopback-only`` so no generated proxy can listen beyond loopback. Examples are
bounded (a few seconds in all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from faultnet._version import __version__
from faultnet.server.openapi import openapi_document
from faultnet.testing import read_line

MAX_EXAMPLES = 12

schema = schemathesis.openapi.from_dict(openapi_document(__version__))
#: One test per operation, each with an id of its own. Not ``schema.parametrize()``: under
#: pytest 9.2 its items share one node id (``test_api_fuzz``), and pytest-xdist, which
#: schedules by node id, ran 1 of the 23 and reported the run green (measured).
OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@schemathesis.check
def no_unexpected_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """5xx only for a listen address in use (Toxiproxy's 500), never anything else."""
    if response.status_code < 500:
        return None
    try:
        message = json.loads(response.content).get("error", "")
    except ValueError:
        message = ""
    if response.status_code == 500 and "already in use" in message:
        return None
    raise AssertionError(
        f"{case.method} {case.formatted_path}: {response.status_code} {response.content[:300]!r}"
    )


def _call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultnet", "server", "--port", "0", "--seed", "7"]
        + ["--loopback-only"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = read_line(proc.stdout, 20)
        url = line.split(" listening on ")[1].split()[0]
        yield url
        # Still serving after the fuzz, and nothing crashed inside it.
        status, version = _call(url, "GET", "/version")
        assert status == 200 and version["version"] == __version__
        assert proc.poll() is None, "the server exited during the fuzz"
    finally:
        proc.terminate()  # the exact process started above
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr, stderr.decode()[-2000:]


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_api_fuzz(operation: Any, server_url: str) -> None:
    # The document's own examples, and data generated from its schemas.
    cases = st.one_of(operation.as_strategy(), *operation.get_strategies_from_examples())

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def fuzz(case: schemathesis.Case) -> None:
        # Something for the fuzzer to find under the document's example names, even
        # after a generated DELETE (409 when already there).
        _call(server_url, "POST", "/proxies", {"name": "redis", "upstream": "127.0.0.1:6379"})
        _call(server_url, "POST", "/proxies/redis/toxics", {"type": "latency"})
        response = case.call(base_url=server_url, timeout=10)
        case.validate_response(
            response,
            checks=[
                no_unexpected_server_error,
                status_code_conformance,
                response_schema_conformance,
            ],
        )

    fuzz()


def test_no_internal_errors_were_logged(server_url: str) -> None:
    status, body = _call(server_url, "GET", "/events?limit=10000")
    assert status == 200
    errors = [e for e in body["events"] if e["event"] in ("api_error", "proxy_failed")]
    assert errors == []


def test_the_fuzz_check_goes_red_on_a_5xx() -> None:
    # The detector above, broken on purpose: a 500 that is not "address in use" fails it.
    case = SimpleNamespace(method="GET", formatted_path="/proxies")

    def response(status: int, error: str) -> SimpleNamespace:
        return SimpleNamespace(status_code=status, content=json.dumps({"error": error}).encode())

    check = no_unexpected_server_error
    assert check(None, response(404, "proxy not found"), case) is None
    assert check(None, response(500, "listen address 127.0.0.1:1 is already in use"), case) is None
    for status, error in ((500, "internal error: KeyError('x')"), (502, ""), (503, "in use")):
        with pytest.raises(AssertionError, match=f"GET /proxies: {status}"):
            check(None, response(status, error), case)
