"""The data planes the proxies of one trio run share: one of each kind, not one each.

A plane (:mod:`faultnet.planes`) forwards any number of links, each of which is its
owner's (a link's events go to the ``on_event`` it was added with; a connection ends its
own link). So the proxies of a trio run that choose the same plane (its name, and whether
it may splice) share one instance of it: :func:`acquire` makes and starts it for the
first, hands the same one to the next, and :func:`release` stops it when the last of them
has stopped. A proxy's stop ends its own connections' links, never the plane under the
others.

Why: a plane per proxy was an OS thread, an epoll and a delivering task per proxy; a
server with 1,000 proxies ran 1,002 threads in 78 MiB, and starting each plane was ~24-50 %
of creating a proxy (issue 36).

Per trio run, not per process: a plane delivers its events through the run's token, and
a process may run trio more than once (the test suite does). The table lives in a
:class:`trio.lowlevel.RunVar`, so it goes with its run.
"""

from __future__ import annotations

import trio

from faultnet import planes

__all__ = ["acquire", "release"]


class _Shared:
    """One shared plane and how many proxies use it."""

    __slots__ = ("plane", "users")

    def __init__(self, plane: planes.Plane) -> None:
        self.plane = plane
        self.users = 0


#: (plane name, splice) -> the shared plane of this run.
_RUN_PLANES: trio.lowlevel.RunVar[dict[tuple[str, bool], _Shared]] = trio.lowlevel.RunVar(
    "faultnet_shared_planes"
)


def _table() -> dict[tuple[str, bool], _Shared]:
    try:
        return _RUN_PLANES.get()
    except LookupError:
        table: dict[tuple[str, bool], _Shared] = {}
        _RUN_PLANES.set(table)
        return table


def acquire(name: str, *, splice: bool = True) -> planes.Plane:
    """The plane *name* (with or without splice) of this trio run, started: made by the
    first caller, the same instance for every later one until the last :func:`release`.
    ValueError naming the available planes for an unknown *name*."""
    table = _table()
    key = (name, splice)
    shared = table.get(key)
    if shared is None:
        plane = planes.make_plane(name, splice=splice)
        plane.start(trio.lowlevel.current_trio_token())
        shared = table[key] = _Shared(plane)
    shared.users += 1
    return shared.plane


def release(plane: planes.Plane) -> None:
    """One user of *plane* fewer; the last one stops it (links still in it are their
    owners' to end: the caller has ended its own)."""
    table = _table()
    for key, shared in table.items():
        if shared.plane is plane:
            shared.users -= 1
            if shared.users == 0:
                del table[key]
                plane.stop()
            return
    raise ValueError("not a shared plane of this run")
