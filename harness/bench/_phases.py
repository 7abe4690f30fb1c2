"""The run's phases over the arms (direct, socat, faultnet): bulk, RTT, churn,
request/response, loss, UDP and the callgrind line. Each appends its figures under
``arms[ARM][LINE]`` and its checks to the run's list."""

from __future__ import annotations

import functools
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultnet.controls import LOSS_MARGIN
from harness.bench._children import Child, proc_cpu_s
from harness.bench._compiled import callgrind_line, pingpong_compiled
from harness.bench._context import _dataplane_argv, _log, _median, _pin, _Run, _unpin
from harness.bench._lossy import LOSS_APPLY_S, LOSS_PERCENTS, UdpArms, udp_round_trips
from harness.bench._measure import _us, bulk_once, percentile, pingpong
from harness.bench._reqresp import PIPELINES, RedisArms, churn, find_redis, redis_rps
from harness.bench._stream import GIB


def _bulk_phase(ctx: _Run, block: bytes, expected_sha: str | None) -> None:
    """One verified transfer of ``p.bytes`` per arm and round; the medians, the CPU per
    GiB of the proxy and of the ends, and a check per arm."""
    p = ctx.p
    for arm in ctx.order:
        ctx.arms[arm]["bulk"] = {"rounds": []}
    for r, round_order in ctx.rounds():
        for arm in round_order:
            one = _bulk_round(ctx, arm, block, expected_sha)
            ctx.arms[arm]["bulk"]["rounds"].append(one)
            _log(
                f"bulk {arm:8} round {r + 1}/{p.rounds}: {one['mbps'] or 0:7.0f} MB/s"
                + ("" if one["verified"] else f"  NOT VERIFIED: {one['why']}")
            )
    for arm in ctx.order:
        b = ctx.arms[arm]["bulk"]
        b["mbps"] = _median([x["mbps"] for x in b["rounds"] if x["mbps"] is not None])
        b["proxy_cpu_s_per_gib"] = _per_gib(b["rounds"], "proxy_cpu_s", p.bytes)
        b["ends_cpu_s_per_gib"] = _per_gib(b["rounds"], "ends_cpu_s", p.bytes)
        b["cpus"] = len(os.sched_getaffinity(0))
        bad = [x["why"] for x in b["rounds"] if not x["verified"]]
        ctx.checks.append(
            {
                "name": f"bulk {arm}: byte count and content",
                "ok": not bad,
                "detail": bad[0] if bad else f"{p.bytes} bytes x {p.rounds}, {p.verify}",
            }
        )


def _bulk_round(ctx: _Run, arm: str, block: bytes, expected_sha: str | None) -> dict[str, Any]:
    """One transfer through *arm*, with the CPU its proxy and its ends spent on it."""
    p = ctx.p
    upstream_pid = ctx.pids[0]
    c0 = ctx.cpu_of(arm)
    # The ends' CPU: this process sends, the upstream child receives (utime +
    # stime from /proc, which keeps the time of its threads that have ended).
    e0, u0 = time.process_time(), proc_cpu_s(upstream_pid)
    one = bulk_once(
        ctx.addrs[arm], block, p.bytes, p.verify, expected_sha,
        corrupt="corrupt" in p.sabotage and arm == "faultnet",
    )  # fmt: skip
    e1, u1 = time.process_time(), proc_cpu_s(upstream_pid)
    c1 = ctx.cpu_of(arm)
    if c0 is not None and c1 is not None:
        one["proxy_cpu_s"] = c1 - c0
    if u0 is not None and u1 is not None:
        one["ends_cpu_s"] = (e1 - e0) + (u1 - u0)
    return one


def _per_gib(rounds: list[dict[str, Any]], key: str, size: int) -> float | None:
    """The median over *rounds* of ``round[key]`` per GiB moved (None if none has it)."""
    values = [x[key] / (size / GIB) for x in rounds if key in x]
    return _median(values) if values else None


def _churn_phase(ctx: _Run) -> None:
    """Connection churn: connect, one round trip, close, one after another."""
    for arm in ctx.order:
        ctx.arms[arm]["churn"] = {"rounds": []}
    errors: dict[str, str] = {}
    for _r, round_order in ctx.rounds():
        for arm in round_order:
            if arm in errors:
                continue
            try:
                ctx.arms[arm]["churn"]["rounds"].append(churn(ctx.addrs[arm], ctx.p.churn))
            except OSError as exc:
                errors[arm] = str(exc) or type(exc).__name__
    for arm in ctx.order:
        c = ctx.arms[arm]["churn"]
        c["per_s"] = _median([x["per_s"] for x in c["rounds"] if x["per_s"]])
        c["p99_us"] = _median([x["p99_us"] for x in c["rounds"]])
        ctx.checks.append(
            {
                "name": f"churn {arm}: every connection's echo came back intact",
                "ok": arm not in errors,
                "detail": errors.get(arm, f"{ctx.p.churn} connections x {ctx.p.rounds}"),
            }
        )
        _log(f"churn {arm:8}: {c['per_s'] or 0:.0f} connections/s, p99 {c['p99_us'] or 0:.0f} us")


def _reqresp_phase(ctx: _Run) -> None:
    """redis-benchmark GETs through each arm, not pipelined and pipelined."""
    found = find_redis()
    if isinstance(found, str):
        for arm in ctx.order:
            ctx.arms[arm]["reqresp"] = {"skipped": found}
        _log(f"request/response line skipped: {found}")
        return
    server, bench = found
    socat_path = ctx.p.socat if "socat" in ctx.addrs else None
    redis = RedisArms(server, socat_path, _dataplane_argv(ctx.p))
    try:
        for arm in ctx.order:
            ctx.arms[arm]["reqresp"] = {f"p{n}": [] for n in PIPELINES}
        for _r, round_order in ctx.rounds():
            for pipeline in PIPELINES:
                for arm in round_order:
                    rps = redis_rps(bench, redis.addrs[arm], ctx.p.requests, pipeline)
                    ctx.arms[arm]["reqresp"][f"p{pipeline}"].append(rps)
        for arm in ctx.order:
            rr = ctx.arms[arm]["reqresp"]
            for n in PIPELINES:
                rr[f"p{n}_rps"] = _median(rr[f"p{n}"])
            _log(
                f"redis {arm:8}: GET "
                + ", ".join(f"-P {n}: {rr[f'p{n}_rps']:.0f}/s" for n in PIPELINES)
            )
    finally:
        redis.stop()


def on_connection(proxy: Child, command: str) -> Callable[[socket.socket], None]:
    """A bulk transfer's ``on_connected``: send ``COMMAND PEER`` (PEER the client's
    host:port) to the proxy child once it has the connection."""

    def apply(sock: socket.socket) -> None:
        # This connection only (by its client port), once the proxy has it.
        peer = "{}:{}".format(*sock.getsockname()[:2])
        deadline = time.monotonic() + LOSS_APPLY_S
        while proxy.request(f"{command} {peer}")["affected"] != 1:
            if time.monotonic() > deadline:
                raise OSError(f"the proxy never had the connection from {peer}")
            time.sleep(0.01)  # a bounded poll: the proxy's accept has no event here

    return apply


def _loss_level(ctx: _Run, proxy: Child, block: bytes, pct: int) -> dict[str, Any]:
    rounds = [
        bulk_once(ctx.addrs["faultnet"], block, ctx.p.loss_bytes, "compare", None,
                  on_connected=on_connection(proxy, f"loss {pct}"))
        for _ in range(ctx.p.rounds)
    ]  # fmt: skip
    ok = [r for r in rounds if r["verified"]]
    level = {
        "rounds": rounds,
        "mbps": _median([r["mbps"] for r in ok]),
        "retransmits": _median([r["retransmits"] for r in ok]),
        "retransmits_needed": _median([r["retransmits_needed"] for r in ok]),
    }
    _log(
        f"loss {pct}%: {level['mbps'] or 0:7.0f} MB/s, "
        f"{level['retransmits_needed'] or 0:.0f} retransmits needed "
        f"({level['retransmits'] or 0:.0f} in all) per "
        f"{ctx.p.loss_bytes >> 20} MiB"
    )
    return level


def _loss_phase(ctx: _Run, proxy: Child, block: bytes) -> None:
    """Bulk through faultnet with each of LOSS_PERCENTS applied to the transfer's own
    connection (each way) once it is open: throughput and the sender's retransmits, all
    of them and those the proxy lacked (the needed ones, which the check judges)."""
    line = {f"p{pct}": _loss_level(ctx, proxy, block, pct) for pct in LOSS_PERCENTS}
    ctx.arms["faultnet"]["loss"] = line
    for arm in ("direct", "socat"):
        ctx.arms[arm]["loss"] = {"n/a": "loss is a faultnet mode"}
    bad = [
        f"{pct} %: {r['why']}" for pct in LOSS_PERCENTS for r in line[f"p{pct}"]["rounds"]
        if not r["verified"]
    ]  # fmt: skip
    ctx.checks.append(
        {
            "name": "loss: every transfer arrived intact at 0/1/5 % loss",
            "ok": not bad,
            "detail": bad[0] if bad else f"{ctx.p.loss_bytes} bytes x {ctx.p.rounds} per level",
        }
    )
    # Judged on the retransmits the proxy lacked, with the controls' margin: loopback
    # reorders now and then, and the sender's spurious retransmits (up to 66 in a 16 MiB
    # transfer with no loss at all) outnumbered 5 %'s real ones in 4 of 12 whole-suite
    # runs when all were counted.
    top_pct = LOSS_PERCENTS[-1]
    base, top = line["p0"]["retransmits_needed"], line[f"p{top_pct}"]["retransmits_needed"]
    ctx.checks.append(
        {
            "name": f"loss: at {top_pct} % the sender resent over {LOSS_MARGIN} more segments"
            " the proxy lacked than at 0 %",
            "ok": base is not None and top is not None and top > base + LOSS_MARGIN,
            "detail": f"median retransmits the proxy lacked: {base} at 0 %, {top} at {top_pct} %",
        }
    )


def _udp_phase(ctx: _Run) -> None:
    """UDP echo round trips per second, direct and through the faultnet UDP proxy."""
    udp = UdpArms()
    try:
        for arm in ("direct", "faultnet"):
            ctx.arms[arm]["udp"] = {"rounds": []}
        for r in range(ctx.p.rounds):
            for arm in ("direct", "faultnet")[:: 1 if r % 2 == 0 else -1]:
                ctx.arms[arm]["udp"]["rounds"].append(
                    udp_round_trips(udp.addrs[arm], ctx.p.datagrams)
                )
    finally:
        udp.stop()
    ctx.arms["socat"]["udp"] = {"n/a": "not measured"}
    for arm in ("direct", "faultnet"):
        u = ctx.arms[arm]["udp"]
        u["per_s"] = _median([x["per_s"] for x in u["rounds"] if x["per_s"]])
        lost = sum(x["lost"] for x in u["rounds"])
        altered = sum(x["altered"] for x in u["rounds"])
        u["lost"] = lost
        ctx.checks.append(
            {
                "name": f"udp {arm}: no datagram came back altered",
                "ok": altered == 0,
                "detail": f"{ctx.p.datagrams} x {ctx.p.rounds}: {altered} altered, {lost} lost",
            }
        )
        _log(f"udp  {arm:8}: {u['per_s'] or 0:.0f} datagrams/s round trip, {lost} lost")


def _callgrind_phase(ctx: _Run, up_port: int) -> None:
    """User-space instructions per 64-byte round trip of socat's connection process and
    of the faultnet proxy process, each under callgrind (faultnet.bench._compiled)."""
    arms = ctx.arms
    arms["direct"]["instructions"] = {"n/a": "no proxy"}
    if ctx.client is None:
        why = "no compiled client"
        for arm in ("socat", "faultnet"):
            arms[arm]["instructions"] = {"skipped": why}
        return
    socat = ctx.p.socat if "socat" in ctx.addrs else None
    line = callgrind_line(ctx.client, up_port, socat, _dataplane_argv(ctx.p), ctx.p.callgrind)
    for arm in ("socat", "faultnet"):
        if "skipped" in line:
            arms[arm]["instructions"] = {"skipped": line["skipped"]}
        elif arm in line:
            arms[arm]["instructions"] = {"per_rtt": line[arm], "round_trips": ctx.p.callgrind}
        else:
            arms[arm]["instructions"] = {"error": line.get(f"{arm}_error", "not measured")}
    _log(
        "callgrind: instructions per round trip: "
        + ", ".join(
            f"{a} {arms[a]['instructions'].get('per_rtt', '-')}" for a in ("socat", "faultnet")
        )
    )


def _rtt_phase(ctx: _Run, key: str, cpu: int | None) -> None:
    """64-byte ping-pong, the pings split over the rounds; results under ``arms[*][key]``.
    With *cpu*, every process on the path (and this one) runs on that one CPU."""
    old = _pin(ctx.pids, {cpu}) if cpu is not None else {}
    try:
        _rtt_rounds(ctx, key, "" if cpu is None else f" (all on CPU {cpu})")
    finally:
        _unpin(old)


def ping(client: str | None, addr: tuple[str, int], count: int, warmup: int) -> list[int]:
    """RTT samples in ns: the compiled client's if built, else the Python one's."""
    if client is not None:
        return pingpong_compiled(client, addr, count, warmup)
    return pingpong(addr, count, warmup)


@dataclass
class RttTally:
    """One arm's ping-pong over the rounds: every sample, each round's p50, the proxy's
    CPU around them, and the first failure (after which the arm is not measured again)."""

    samples: list[int] = field(default_factory=list)
    round_p50: list[float | None] = field(default_factory=list)
    cpu_s: float | None = None
    error: str | None = None

    def measure(
        self,
        client: str | None,
        addr: tuple[str, int],
        count: int,
        warmup: int,
        cpu: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.record(lambda: ping(client, addr, count, warmup), cpu)

    def record(
        self, run: Callable[[], list[int]], cpu: Callable[[], float | None] = lambda: None
    ) -> None:
        """One round: ``run()``'s samples (its OSError ends the arm's measuring)."""
        if self.error is not None:
            return
        c0 = cpu()
        try:
            got = run()
            self.samples += got
            self.round_p50.append(_us(percentile(sorted(got), 50)))
        except OSError as exc:  # includes an echo that came back different
            self.error = str(exc) or type(exc).__name__
            self.round_p50.append(None)
        c1 = cpu()
        if c0 is not None and c1 is not None:
            self.cpu_s = (self.cpu_s or 0.0) + (c1 - c0)

    def summary(self, untimed: int) -> dict[str, Any]:
        """The figures; *untimed*: the warm-up round trips the CPU also paid for."""
        xs = sorted(self.samples)
        out: dict[str, Any] = {
            "samples": len(xs),
            "p50_us": _us(percentile(xs, 50)),
            "p99_us": _us(percentile(xs, 99)),
            "mean_us": statistics.fmean(xs) / 1000 if xs else None,
            "round_p50_us": self.round_p50,
        }
        if self.cpu_s is not None and xs:
            # Includes warm-up round trips and connection setup: an upper bound.
            out["proxy_cpu_us_per_rtt"] = self.cpu_s * 1e6 / (len(xs) + untimed)
        return out


def added_over(base: dict[str, Any], figures: dict[str, Any]) -> None:
    """Put into *figures* its p50 over *base*'s, overall and round by round."""
    b50, a50 = base["p50_us"], figures["p50_us"]
    figures["added_p50_us"] = None if None in (a50, b50) else a50 - b50
    figures["round_added_p50_us"] = [
        None if a is None or d is None else a - d
        for a, d in zip(figures["round_p50_us"], base["round_p50_us"], strict=False)
    ]


def _rtt_rounds(ctx: _Run, key: str, where: str) -> None:
    per_round = max(1, ctx.p.pings // ctx.p.rounds)
    warmup = min(200, max(1, per_round // 10))
    tally = {arm: RttTally() for arm in ctx.order}
    for _r, round_order in ctx.rounds():
        for arm in round_order:
            cpu = functools.partial(ctx.cpu_of, arm)
            tally[arm].measure(ctx.client, ctx.addrs[arm], per_round, warmup, cpu)
    for arm in ctx.order:
        t = tally[arm]
        rtt = ctx.arms[arm][key] = t.summary(warmup * ctx.p.rounds)
        ctx.checks.append(
            {
                "name": f"rtt {arm}{where}: every echo came back intact",
                "ok": t.error is None,
                "detail": t.error or f"{rtt['samples']} timed round trips",
            }
        )
        if t.error is not None:
            _log(f"rtt  {arm:8}{where}: FAILED: {t.error}")
        else:
            _log(f"rtt  {arm:8}{where}: p50 {rtt['p50_us']:.1f} us, p99 {rtt['p99_us']:.1f} us")
    for arm in ctx.order[1:]:
        added_over(ctx.arms["direct"][key], ctx.arms[arm][key])
