"""The fleet soak: N reference bots posting at once, each through its own faultnet link,
while a seeded plan of ``faultnet chaos`` faults runs on those links.

    python -m harness.fleet --env auto [--mode main|storm|control] [--bots 12]
        [--time-scale F] [--seed S] [--run-dir DIR] [--verify]
    python -m harness.fleet.verify RUN_DIR      (or python -m harness.fleet_verify)

Layout: :mod:`~harness.fleet._plan` the plan (a chaos plan document; chaos plans it),
:mod:`~harness.fleet._run` the runner and its command line, and the verifier:
:mod:`~harness.fleet._records` reads a run directory, :mod:`~harness.fleet._checks`
is its table of named checks, :mod:`~harness.fleet.verify` the verdict and its command.

The run only RECORDS; the verifier judges, and the two share nothing but the run
directory, whose ``manifest.json`` names every file (the runner prints the run
directory as its last line). What the run directory holds:

* ``manifest.json``: mode, seed, time scale, the timings the verifier bounds by, the
  plan's slots, one entry per bot (label, nick, owner, link address, the files below),
  ``status``;
* ``chaos-plan.json``: the plan document chaos planned from (absent with --chaos-plan);
* ``faults.jsonl``: faultnet chaos's join log, one line per decision
  (:mod:`faultnet.chaos._joinlog`: ``began`` and ``mono`` are CLOCK_MONOTONIC, the clock
  every bot stamps its events with; an episode's ``result.conns`` the connections it
  took);
* ``bots/LABEL/posts.jsonl``: every post the workload made, written by the task that
  drove the bot: the text, ``sent``/``done`` monotonic stamps, the bot's reply verbatim;
* ``bots/LABEL/fds.jsonl``: the bot's descriptor count, sampled after every post;
* ``LABEL.stderr``: the bot's stderr (its own BOTEVENT transport events);
* ``calls/LABEL/``: the drivers.mcp call record of every MCP request to that bot;
* ``observer.jsonl``: the transcript of the observer (the leader, on a direct link);
* ``verdict.json``: with ``--verify``, the verifier's verdict.

Topology: owners are minted in the environment's registry (the enclave allows 3 live
bots per owner, the leader counting), each owner's leader connects and spawns two
workers; every worker gets its own in-process :class:`faultnet.Proxy`, named by its
label, which is chaos's target ``LABEL@local``. The observer is the environment's
leader, on a direct link, so nothing a fault does reaches it.

Faults (:mod:`harness.fleet._plan`): ``--planner episodes`` (default) plans outages that
end in a thaw or in the connections they took torn down (chaos's
``episode:freeze-sever`` and ``episode:blackhole-reset``: what was held is lost), or an
instant sever/reset; ``--planner chaos`` the link faults at chaos's weights;
``--chaos-plan FILE`` any chaos plan file (checked before anything starts). Modes:
``main`` (faults on random links, never two at once on one link), ``storm`` (waves in
which every link goes down at the same instant), ``control`` (main's workload and plan
with ``--defect no-confirm`` bots, which must lose posts; see the verifier).

Exit codes: 0 the run completed (with ``--verify``: the verifier's code), 1 the run could
not do its job (a bot never connected), 2 usage or environment.
"""

from harness.fleet._plan import fleet_plan, plan_document
from harness.fleet._run import MODES, main
from harness.fleet.verify import Verdict, verify

__all__ = ["MODES", "Verdict", "fleet_plan", "main", "plan_document", "verify"]
