"""Fidelity: every fault mode held against the kernel's own version of it.

faultnet's controls prove a mode is in force against faultnet's own probe; this proves
it against the real thing. In a network namespace of its own (root), each row of
:data:`CASES` runs one real client (a raw socket with keepalive or TCP_USER_TIMEOUT,
redis-py against redis-server, psycopg against PostgreSQL, curl) twice: once against
the kernel's version of the fault (nftables dropping both ways, dropping SYNs, a random
share, rejecting with a reset; ``ss -K``; no listener; SIGSTOP) and once through
faultnet's mode, and records what the client saw (:class:`Observation`). A pair is
judged the same when the outcome is the same and faultnet's time to notice is within
1.25x + 0.3 s of the kernel's (:func:`judge`, by its table of checks); for a dead route
(blackhole, partition) the client must also take in no more segments after the fault
than the kernel let it; a row of many tries (syn_loss's 128 connects, loss's 192
downloads) is judged by its shares too, within a binomial bound (a median of a few
heavy-tailed times moves more than the judge allows; the shares of many do not).

Rows with ``contrast`` are two failures known to differ (faultnet's ``reset`` against a
firewall's reject): shown with the reason, not judged. Every TCP mode has a row or a
reason for none (``NOT_HELD`` in _cases.py). :data:`UDP_CASES` (_udp.py) hold the UDP
proxy's loss, freeze and blackhole against nft on datagrams and SIGSTOP, run and judged
the same way.

The toxics have no kernel twin here (no netem): each is held to its own promise by
its row in _toxics.py (latency, jitter, bandwidth, slicer, limit_data, timeout,
slow_close, reset_peer, toxicity), through a real proxy, no root needed; the HTTP
toxics' rows hold each against nginx making the same fault, seen by the same client.

Run it with ``python -m harness.fidelity`` or ``faultnet fidelity``; ``--record`` keeps
the rows in recorded.json, the README's fidelity column (:mod:`harness.fidelity.readme`).
"""

from __future__ import annotations

from faultnet.lazyexports import lazy_exports

__all__ = [
    "CASES",
    "Case",
    "Observation",
    "Row",
    "UDP_CASES",
    "Verdict",
    "enter_private_netns",
    "judge",
    "postgres_server",
    "run",
]

# Exported on first use (PEP 562): `faultnet fidelity` is registered on every faultnet
# call, and the run's modules import the proxy and trio (tests/faultnet/test_cli_imports
# holds --version and --help to not importing them).
_EXPORTS = {
    "CASES": "harness.fidelity._cases",
    "Case": "harness.fidelity._cases",
    "Observation": "harness.fidelity._observe",
    "Verdict": "harness.fidelity._observe",
    "judge": "harness.fidelity._observe",
    "enter_private_netns": "harness.fidelity._world",
    "postgres_server": "harness.fidelity._world",
    "Row": "harness.fidelity._run",
    "UDP_CASES": "harness.fidelity._udp",
    "run": "harness.fidelity._run",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
