"""The HTTP toxics' clients and judges: a real client with the retry logic its users turn
on, run once against nginx doing a fault itself and once through the toxic (the pair
rows of :data:`harness.fidelity._toxics.TOXIC_CASES`), and how the two are compared.

Each client makes one GET and reads the whole body, the way its users do: requests
with urllib3's ``Retry`` (``total=3``, the 502/503/504 statuses, no backoff), and
aiohttp with aiohttp-retry (4 attempts, the same statuses, and connection errors and
timeouts retried). What it saw is its outcome class (``answered 503``, or the
exception it raised: what a caller's ``except`` sees), how long it took, and, counted
on the other side (nginx's access log, the toxic's own count of the requests it
matched, its proxy's of the connections it accepted), how many requests it made (its
retries) and on how many connections (a pool that kept its connection, or one that
had to open another: a server that closes after an answer without saying so makes
every client open one, whether or not it first sends a request into the closed one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.fidelity._observe import classify

__all__ = ["CLIENTS", "PACE_RATIO", "same_outcome", "same_pace"]

#: What each client retries: urllib3's ``Retry(total=RETRIES)``, aiohttp-retry's
#: ``attempts=RETRIES + 1`` (its count includes the first).
RETRIES = 3
RETRY_STATUSES = (502, 503, 504)
CONNECT_TIMEOUT_S = 5.0

#: A client's view of one GET: ``outcome``, ``seconds``, ``detail`` (and, added by the
#: row, ``requests`` and ``connections``: how many the server side saw).
Seen = dict[str, Any]
#: A client: the URL and its read timeout (seconds) in, what it saw out.
Client = Callable[[str, float], Seen]


def _answered(status: int, size: int, t0: float) -> Seen:
    return {
        "outcome": f"answered {status}",
        "seconds": time.monotonic() - t0,
        "detail": f"{size} bytes",
    }


def _raised(exc: BaseException, t0: float) -> Seen:
    return {
        "outcome": type(exc).__name__,
        "seconds": time.monotonic() - t0,
        "detail": classify(exc),
    }


def requests_get(url: str, read_timeout: float) -> Seen:
    """requests, its adapter retrying by urllib3's ``Retry``."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    retry = Retry(total=RETRIES, status_forcelist=RETRY_STATUSES, backoff_factor=0)
    with requests.Session() as session:
        session.mount("http://", HTTPAdapter(max_retries=retry))
        t0 = time.monotonic()
        try:
            r = session.get(url, timeout=(CONNECT_TIMEOUT_S, read_timeout))
        except requests.RequestException as exc:
            return _raised(exc, t0)
        return _answered(r.status_code, len(r.content), t0)


def aiohttp_get(url: str, read_timeout: float) -> Seen:
    """aiohttp through aiohttp-retry's ``RetryClient``, in an event loop of its own."""
    return asyncio.run(_aiohttp_get(url, read_timeout))


async def _aiohttp_get(url: str, read_timeout: float) -> Seen:
    import aiohttp
    from aiohttp_retry import ExponentialRetry, RetryClient

    options = ExponentialRetry(
        attempts=RETRIES + 1,
        start_timeout=0.01,  # 0.02, 0.04, 0.08 s between attempts
        statuses=set(RETRY_STATUSES),
        retry_all_server_errors=False,  # its default retries every 5xx: not urllib3's
        exceptions={aiohttp.ClientConnectionError, TimeoutError},
    )
    timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=read_timeout)
    t0 = time.monotonic()
    async with RetryClient(retry_options=options, timeout=timeout) as client:
        try:
            async with client.get(url) as r:
                body = await r.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            return _raised(exc, t0)
        return _answered(r.status, len(body), t0)


#: The clients every pair row runs, by name.
CLIENTS: Mapping[str, Client] = {
    "requests + urllib3 Retry": requests_get,
    "aiohttp + aiohttp-retry": aiohttp_get,
}


# -- the judges --


def same_outcome(sample: Mapping[str, Any], asked: Mapping[str, float]) -> str | None:
    """The toxic's client saw what nginx's did: the same outcome class, after the same
    number of requests (its retries), made on as many connections. None when so, else
    what differs."""
    real, toxic = sample["nginx"], sample["toxic"]
    if min(real["requests"], toxic["requests"]) < 1:  # every client makes one at least
        return f"requests counted: {toxic['requests']} by the toxic, {real['requests']} by nginx"
    for key, what in (
        ("outcome", "outcome"),
        ("requests", "requests made"),
        ("connections", "connections opened"),
    ):
        if toxic[key] != real[key]:
            return f"{what}: {toxic[key]} through the toxic, {real[key]} from nginx"
    return None


#: A slow body's time through the toxic over nginx's. Measured (limit_rate and the
#: toxic both at 16,384 B/s, a 16,384-byte body; each about 1.00 s) at load 9-11:
#: 0.976-1.012 in 20 pairs, both clients; the breakage (the toxic at twice the rate)
#: 0.493-0.532.
PACE_RATIO = (0.75, 1.3)


def same_pace(sample: Mapping[str, Any], asked: Mapping[str, float]) -> str | None:
    """:func:`same_outcome`, and the body took about as long (:data:`PACE_RATIO`)."""
    why = same_outcome(sample, asked)
    if why is not None:
        return why
    ratio = sample["toxic"]["seconds"] / sample["nginx"]["seconds"]
    low, high = PACE_RATIO
    if not low <= ratio <= high:
        return f"took {ratio:.2f} times nginx's time, not {low}-{high}"
    return None
