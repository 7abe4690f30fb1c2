"""The experiment API: what an experiment is written against and what it produces.

An experiment (``harness/exp_*.py``) is a module with ``NAME``, ``DESCRIPTION``,
``MAX_REAL_S``, ``add_arguments(parser)`` and ``async def run(ctx: Context)``; the
runner (:mod:`harness.runner`) makes it a command. This package holds no I/O of its own
beyond what a running experiment asks for, and imports nothing that runs experiments,
so the run report (:mod:`harness.report`) can read results with it.

* :mod:`._context` -- :class:`Context` and :class:`BotHandle`: settings, the leader
  observer, workers, bots, the proxy, waits.
* :mod:`._helpers` -- what the API and the runner share: percentiles, BOT_BIN as an
  argv, fresh nicks, attempt seeds.
* :mod:`._scenario` -- steps more than one experiment takes (sync the bots' idle clocks,
  freeze with a record, check that a freeze held, match what the observer received).
* :mod:`._result` -- an experiment's :class:`Result`: checks, headline numbers, the
  internal control, and how they print.
* :mod:`._contract` -- the bot contract, read: a delivery claim, a ``BOTEVENT`` line.
* :mod:`._timescale` -- one :class:`TimeScale` for every wait and every bot timing.

:class:`Context` and :class:`BotHandle` are loaded on first use (PEP 562): they need
trio and the drivers, and the run report imports this package for :class:`Result` and
the contract reader alone. ``import harness.report`` measured 0.3 s and 134 modules
without them, 2.0 s and 321 modules with them (this 2-core box, loaded).
"""

from typing import TYPE_CHECKING

from faultnet.lazyexports import lazy_exports
from harness.experiment._contract import BOTEVENT_RE, claims_delivery, parse_botevents
from harness.experiment._helpers import (
    RunProblem,
    attempt_seeds,
    pct,
    resolve_bot_argv,
    resolved_program,
    unique_nick,
)
from harness.experiment._result import (
    EXIT_ENV,
    EXIT_FAILED,
    EXIT_OK,
    Check,
    ControlValue,
    Drift,
    Result,
    clip,
    control_drift,
    render_result,
    render_side_by_side,
)
from harness.experiment._scenario import (
    FreezeRecord,
    first_after,
    freeze_held,
    freeze_links,
    freeze_worker,
    link_works,
    observed,
    observer_texts,
    rel,
    sender_nick,
    sync_inbound,
    wait_notified,
)
from harness.experiment._timescale import (
    BOT_ENV,
    BOT_FLOORS,
    REAL,
    TimeScale,
    time_scale_from,
)

if TYPE_CHECKING:
    from harness.experiment._context import BotHandle, Context

#: What is loaded on first use, and from where.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {"BotHandle": "harness.experiment._context", "Context": "harness.experiment._context"},
)

__all__ = [
    "BOTEVENT_RE",
    "BOT_ENV",
    "BOT_FLOORS",
    "EXIT_ENV",
    "EXIT_FAILED",
    "EXIT_OK",
    "REAL",
    "BotHandle",
    "Check",
    "Context",
    "ControlValue",
    "Drift",
    "FreezeRecord",
    "Result",
    "RunProblem",
    "TimeScale",
    "attempt_seeds",
    "claims_delivery",
    "clip",
    "control_drift",
    "first_after",
    "freeze_held",
    "freeze_links",
    "freeze_worker",
    "link_works",
    "observed",
    "observer_texts",
    "parse_botevents",
    "pct",
    "rel",
    "render_result",
    "render_side_by_side",
    "resolve_bot_argv",
    "resolved_program",
    "sender_nick",
    "sync_inbound",
    "time_scale_from",
    "unique_nick",
    "wait_notified",
]
