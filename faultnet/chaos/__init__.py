"""Seeded chaos: a plan of faults computed before anything is touched, rails that refuse
loudly, and a join log in which every decision is one line.

Layout (each module holds one job; the planner is pure, the rest do I/O):

* :mod:`~faultnet.chaos._draws` -- randomness as ``sha256("<seed>:<counter>")``;
* :mod:`~faultnet.chaos._catalogue` -- every mode of :data:`faultnet.modes.MODES`,
  every toxic of :data:`faultnet.toxics.TOXICS`, the process faults and the compound
  episodes (:data:`EPISODES`), with weights, durations and undos (:func:`catalogue`);
* :mod:`~faultnet.chaos._plan` -- plan files and the planner (:func:`load_config`,
  :func:`make_plan`); the format is ``sample-plan.toml`` beside it;
* :mod:`~faultnet.chaos._rails` -- the rails, one function each;
* :mod:`~faultnet.chaos._allowlist` -- the PID allowlist (:func:`register_process`);
* :mod:`~faultnet.chaos._targets` -- proxies in this process and on faultnet servers;
* :mod:`~faultnet.chaos._joinlog` -- the join log;
* :mod:`~faultnet.chaos._run` -- the runner: walk, rails, act, undo (:class:`Runner`);
* :mod:`~faultnet.chaos._recover` -- after a SIGKILL: undo what a join log says was
  left (``faultnet chaos undo``);
* :mod:`~faultnet.chaos.cli` -- ``faultnet chaos``.

From Python, with proxies in this process::

    config = load_config(proxies=["db"], duration=30, gap=(1, 3))
    plan = make_plan(config, seed=7)
    log = JoinLog("chaos-log.jsonl", seed=7, dry=False)
    result = await Runner(plan, log, proxies={"db": proxy}, armed=True,
                          marker=Path("run/.faultnet-chaos-armed"), time_unit=0.1).run()

Guarantee: every fault the runner applied is undone when the run ends for any reason
a process can observe (the plan's end, an exception, cancellation, a catchable signal
under :func:`run_with_signals`). SIGKILL of chaos itself is the one exception: the join
log then says what was applied, or about to be (each fault's ``intent`` line is written
before it is applied), and not undone, and :func:`recover` (``faultnet chaos undo``)
undoes it.
"""

from faultnet.lazyexports import lazy_exports

# Imported on first use (PEP 562), so that `faultnet --help`, which imports
# faultnet.chaos.cli to register `faultnet chaos`, does not import trio, the proxy and
# the server client with it (0.27 s, measured with -X importtime).
#: Public name -> the private module that defines it.
_EXPORTS = {
    "Allowlist": "_allowlist",
    "register_process": "_allowlist",
    "EPISODES": "_catalogue",
    "Fault": "_catalogue",
    "PlanError": "_catalogue",
    "catalogue": "_catalogue",
    "Draws": "_draws",
    "choose_seed": "_draws",
    "draw": "_draws",
    "JoinLog": "_joinlog",
    "LOCAL": "_plan",
    "Plan": "_plan",
    "PlanConfig": "_plan",
    "Slot": "_plan",
    "load_config": "_plan",
    "make_plan": "_plan",
    "RAILS": "_rails",
    "recover": "_recover",
    "CATCHABLE_SIGNALS": "_run",
    "Runner": "_run",
    "RunResult": "_run",
    "run_with_signals": "_run",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(
    __name__, {k: f"faultnet.chaos.{m}" for k, m in _EXPORTS.items()}
)
