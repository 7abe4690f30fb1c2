"""``scripts/bench`` (``python -m harness.bench``): direct loopback vs socat vs the faultnet proxy, in one run.

What one run measures, each arm against the same upstream process:

* **bulk throughput**: one connection carries ``--bytes`` (default 1 GiB) client to server.
  The stream is one random block (1 MiB + 13 bytes, from ``--seed``) repeated; the
  receiver compares every byte it gets against that block (``--verify compare``: one
  memcmp per block, ~0.03 CPU-s per GiB) or hashes the stream with SHA-256, which the bench
  compares with a digest precomputed over the same stream (``--verify sha256``; inline
  SHA-256 ran ~1.7 GB/s here, which caps direct loopback). Byte count and content are checks:
  a mismatch fails the run (exit 1). Rounds alternate the arms; the median is reported.
  With it, each arm's CPU per GiB: the proxy's, and the ends' (this process sending, the
  upstream receiving); from those the target against direct gets its ceiling on this
  machine: direct's time per GiB over (ends' + proxy's CPU per GiB) / CPUs, the most any
  proxy on these CPUs could reach (a proxied GiB crosses TCP twice and costs its ends
  more wake-ups: 0.65 CPU-s against direct's 0.45, measured here).
* **RTT**: 64-byte ping-pong on one connection (TCP_NODELAY both ends), p50 and p99,
  twice: free-running, and with every process on the path pinned to one CPU
  (``--rtt-cpu``), where the RTT added over direct is the proxy's own work.
* **concurrency**: connections opened in batches, each verified by one 64-byte round
  trip; the count held is how many were open and verified at once (capped by
  ``--connections``). socat forks a process per connection, so its concurrency is not
  measured (n/a).
* **freeze** (faultnet only): the proxy process times its own ``freeze()`` over every live
  connection. Then the upstream pushes 64 bytes down every connection and the client
  sends 64 bytes up every one; for ``--freeze-window`` seconds nothing may arrive at the
  client, the upstream's byte counter and the proxy's own counters must not move. After
  ``thaw()`` every connection must receive exactly the pushed bytes then the echo of its
  own (held bytes delivered, in order). Any deviation is a failed check (exit 1).
* **proxy RSS per idle connection**: the proxy process's VmRSS before and after the
  connections are held, divided by their count.
* **request/response** (issue 14): ``redis-benchmark`` GETs, 20 clients, not pipelined
  (``-P 1``) and pipelined (``-P 16``), against a redis-server of our own, through each
  arm (its own socat and faultnet proxy in front of redis); skipped, and said so, when
  redis is not installed. ``--requests`` per arm and round.
* **churn** (issue 14): one client connects, makes one 64-byte round trip, closes, and
  again (``--churn`` connections per arm and round): connections/s and p99 per connection.
* **toxic lines** (issue 32): a second faultnet proxy with one toxic at a time on its
  upstream stream (latency 0 and 5 ms, with one message paced every 1 ms / 200 us;
  slicer; bandwidth; a toxic removed from a live connection; the two-way-loss hop), each
  against a baseline of the same run (socat, a fresh connection, the bare proxy), and
  the instructions per round trip of latency 0 and the hop under callgrind: see
  ``_toxic``. ``--toxic-bytes`` per bulk transfer; 0 skips the section.
* ``--dataplane trio|thread`` picks the faultnet proxy's data plane; the load average at
  the start and end is in the report, beside the figures it moves.

Reading the figures. Rounds alternate the arms, so compare ratios from one run, not
absolutes across runs (other work on the machine moves them). On a small VM an idle vCPU
halts, and waking it dominates a free-running 64-byte RTT through any proxy (socat's p50
measured 45-150 us here depending on load, once above direct's): that is why the RTT
target is judged on the one-CPU measurement, and why "proxy CPU us per round trip" is
shown beside it.
Hashing, measured here: blake2b 0.7 GB/s, sha256 1.7 GB/s (SHA-NI), crc32 2.7 GB/s,
memcmp 38 GB/s; sha256 in the receiver held direct loopback to 1.3 GB/s against 2.3-3.3
without, hence ``compare`` by default.

Processes: the upstream server and the faultnet proxy each run in their own process
(this package, hidden ``--role``), started and stopped by recorded identity
(:mod:`faultnet.procs`); the load generator is this process. CPU and RSS are read from
``/proc/PID/stat`` and ``/proc/PID/status``. Loopback only.

The package, by concern: ``_stream`` (the wire, sizes, targets, bounds), ``_roles`` (the
upstream and proxy processes), ``_children`` (starting and stopping them, /proc readers),
``_reqresp`` (redis-benchmark and the churn loop), ``_measure`` (the load generator's
measurements), ``_context`` (what the phases share), ``_phases`` (bulk, RTT, churn,
request/response, loss, UDP, callgrind), ``_hold`` (hold and freeze), ``_toxic`` (the
toxic lines), ``_targets`` (the ratios, and the targets as one table judged by one loop),
``_toxic_targets`` (the toxic lines' rows and report block), ``_run`` (one run: its
processes and phases), ``_report`` (the table), ``_cli`` (flags and exit codes). It lives
outside ``faultnet/`` because it is a developer tool, not part of the library (as h11
keeps its ``bench/``).

Exit codes: 0 every check passed (targets are reported, not enforced, unless
``--require-targets``); 1 a check failed (or a target missed with ``--require-targets``);
2 usage or environment error.
"""

from harness.bench._cli import build_parser, main, params_from_args
from harness.bench._measure import watch_silence
from harness.bench._report import format_report
from harness.bench._run import BenchParams, run_bench
from harness.bench._stream import human_size, make_block, matches_block, parse_size

__all__ = [
    "BenchParams",
    "build_parser",
    "format_report",
    "human_size",
    "main",
    "make_block",
    "matches_block",
    "params_from_args",
    "parse_size",
    "run_bench",
    "watch_silence",
]
