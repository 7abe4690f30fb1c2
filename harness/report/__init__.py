"""See a run: a timeline picture and a one-page report for a run directory.

Layout, bottom up (each module imports only those above it in this list):

* ``_model``: the plain data drawn (lanes, fault intervals, posts, markers, runs) and
  the one table of post outcomes and marker kinds every view reads;
* ``_files``: reading a run directory safely (regular files inside it only) and JSON
  in its writer's shape;
* ``_faults``: a proxy's event log -> its fault intervals;
* ``_posts``: one send-channel call -> its post, scored (claimed by its answer,
  received by the observer);
* ``_evidence``: a run directory -> a :class:`Run` (proxy log, bot events, call
  records, observer transcript, result), as a table of named loading steps;
* ``_timeline``: a :class:`Report` -> a matplotlib figure (PNG, SVG) and what it drew;
* ``_html``: a :class:`Report` and its SVG -> the self-contained report.html;
* ``_build``: which kind of directory it is, :func:`build`, and the one-call hooks the
  runners use (:func:`publish_run`, :func:`publish_pair`);
* ``cli``: ``faultnet report RUN_DIR`` (also ``python -m harness.report``).
"""

from harness.report._build import (
    Built,
    NotARunDir,
    build,
    load_report,
    publish_pair,
    publish_run,
    replay_command,
)
from harness.report._evidence import load_run
from harness.report._files import MalformedEvidence
from harness.report._model import (
    DETECTIONS,
    OUTCOMES,
    FaultInterval,
    Lane,
    Marker,
    Post,
    Report,
    Run,
)
from harness.report._timeline import Drawn

__all__ = [
    "DETECTIONS",
    "OUTCOMES",
    "Built",
    "Drawn",
    "FaultInterval",
    "Lane",
    "MalformedEvidence",
    "Marker",
    "NotARunDir",
    "Post",
    "Report",
    "Run",
    "build",
    "load_report",
    "load_run",
    "publish_pair",
    "publish_run",
    "replay_command",
]
