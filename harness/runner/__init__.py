"""The runner: what makes an experiment module a command, and runs its attempts.

Arguments, BOT_BIN, the environment (a running one, or a private one per attempt brought
down by its exact PID), the run directory, the repeat loop with logged seeds, the result
document and the exit codes (0 passed, 1 a check failed, 2 usage or environment). The
pair runner (:mod:`harness.pair`), the demo and the fleet reuse its pieces. It sits
above :mod:`harness.experiment` (the API experiments are written against) and
:mod:`harness.report` (each kept attempt's HTML report).

* :mod:`._arguments` -- the common flags, an experiment's parser, the environment.
* :mod:`._attempts` -- an attempt, the repeat loop, the run directory, the result
  document, exit codes, and the command an experiment module gets.
* :mod:`._supervisor` -- a command whose children cannot outlive it, even after a
  SIGKILL (:func:`supervised`: every command that starts a server or bots runs under
  it, the experiments', the pair's, the fleet's and the demo's).
"""

from harness.runner._arguments import add_common_arguments, build_parser, environment
from harness.runner._attempts import (
    CLEANED,
    amain,
    commands,
    conclude,
    default_run_dir,
    main,
    open_run,
    repeat_attempts,
    run_attempt,
    run_cancellable,
    writable_dir,
    writable_file,
)
from harness.runner._supervisor import supervised

__all__ = [
    "CLEANED",
    "add_common_arguments",
    "amain",
    "build_parser",
    "commands",
    "conclude",
    "default_run_dir",
    "environment",
    "main",
    "open_run",
    "repeat_attempts",
    "run_attempt",
    "run_cancellable",
    "supervised",
    "writable_dir",
    "writable_file",
]
