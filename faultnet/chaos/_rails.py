"""The rails: the checks that stand between a plan and the things it would break.

Each rail is one function here returning ``None`` (go on) or the reason it refuses; the
runner calls each through this module before acting, logs every refusal as one join-log
line naming the rail, and never acts on a refused step. Each rail has a test that makes
it fire and a test that removes it and watches the harm it prevents happen.

======================  =================================================================
rail                    what it refuses
======================  =================================================================
``unarmed``             a real run without BOTH ``--armed`` and the marker file: two
                        deliberate acts, because one flag is one typo (or one shell
                        history search) away from a run nobody meant
``loopback``            a target beyond loopback (a server URL, or a proxy's listen or
                        upstream address) unless ``--allow-non-loopback``; only literal
                        loopback addresses and ``localhost`` count (no DNS lookup)
``unnamed``             a server or proxy the plan does not name (given with ``--api`` or
                        to the Python API, or in a slot of a plan built by hand)
``pid-allowlist``       a signal to a process not in the allowlist, or whose PID no longer
                        names the process listed (start time, command line), checked
                        before EVERY signal; every line is pinned before the first fault
                        and one that cannot be is refused at the start (see
                        :mod:`faultnet.chaos._allowlist`)
``pid-cwd``             with ``--pid-cwd DIR`` only: a signal to a listed process whose
                        working directory is not DIR or under it (a stale allowlist, a
                        process of another run)
======================  =================================================================
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection
from pathlib import Path

from faultnet.addresses import is_loopback

__all__ = ["MARKER_NAME", "RAILS", "check_armed", "check_loopback", "check_named", "url_host"]

RAILS = ("unarmed", "loopback", "unnamed", "pid-allowlist", "pid-cwd")

#: The marker file's name when none is given: beside the join log.
MARKER_NAME = ".faultnet-chaos-armed"


def check_armed(armed: bool, marker: Path | None) -> str | None:
    """Refuse unless *armed* (``--armed``) and the *marker* file exists."""
    missing = []
    if not armed:
        missing.append("--armed was not given")
    if marker is None or not marker.exists():
        missing.append(f"marker file {marker} does not exist")
    return "; ".join(missing) or None


def check_loopback(hosts: Collection[str], allow_non_loopback: bool) -> str | None:
    """Refuse a target any of whose *hosts* is not a loopback address."""
    if allow_non_loopback:
        return None
    beyond = [h for h in hosts if not is_loopback(h)]
    if beyond:
        return f"{', '.join(beyond)} is not loopback (--allow-non-loopback to allow)"
    return None


def check_named(target: str, named: Collection[str]) -> str | None:
    """Refuse a target (a proxy key or a server URL) the plan does not name."""
    if target in named:
        return None
    return f"{target} is not named in the plan"


def url_host(url: str) -> str:
    """The host of a server URL, as the loopback rail reads it."""
    return urllib.parse.urlsplit(url).hostname or ""
