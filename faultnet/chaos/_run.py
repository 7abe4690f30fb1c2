"""The runner: walks a plan's timeline, asks the rails, acts, logs, and undoes.

Theory of operation. The plan is complete before the runner starts
(:mod:`faultnet.chaos._plan`); the runner walks :meth:`Plan.timeline` in order, one step
at a time, sleeping until each step's moment (``at`` x ``time_unit`` seconds after the
start). A dry run walks the same timeline without sleeping and without touching
anything, so it logs exactly the steps a real run attempts (attempts, not outcomes: it
cannot know that a PID will have exited or a proxy will be gone; a real run's skips are
where the two diverge, each with its rail or reason).

Before anything else the allowlist is pinned (:meth:`Allowlist.pin`): every line is
bound to a start time before the first fault, and a line that cannot be is one
``refuse`` record.

For each fault step, in this order: a planned skip (``busy``) is logged; the
``unnamed`` rail; the once-per-run budget (spent when a fault FIRES, so a slot a rail
stopped does not spend it, and a later slot for a spent fault is a logged skip); the
``loopback`` rail on what is known without contact; then, real runs only, the target is
resolved (a proxy in this process, a proxy on its server, or an allowlisted process),
the ``loopback`` rail is asked again about its listen and upstream hosts, and the fault
is applied. The ``pid-allowlist`` (and ``pid-cwd``) rail is asked in a dry run too: it
only reads ``/proc``, so a dry run skips what a real run would skip there. A proxy named
``NAME@local`` that this process was not given is skipped as absent in both.

An episode (``episode:freeze-sever``...) applies its down mode and remembers the ids of
the connections it took; its undo is its ending mode on those ids only (none taken: the
ending is a logged skip). Each applied step's record has ``began``: CLOCK_MONOTONIC
when its call began (``mono`` is when it returned), so effects can be looked for from
the moment the fault started to bite.

Every fault applied is remembered until its undo step. Whatever is still applied when
the walk ends, for any reason (the end of the plan, an exception, cancellation by one of
the signals :func:`run_with_signals` catches), is undone in a shielded block, newest
first: thaw, restore, remove the toxic, SIGCONT the stopped process (re-verified first).
Anything that could not be undone is one ``undo_failed`` line naming what remains. The
one exception is SIGKILL of chaos itself: no code runs, so a frozen proxy stays frozen
(``faultnet chaos undo --log FILE`` reads the join log and undoes what it left).

Write-ahead: a real run writes a fault's ``intent`` line (one ``write()`` on an
``O_APPEND`` file: in the page cache, so a SIGKILL cannot lose it) BEFORE it calls the
target or sends the signal, and the ``fault`` line after. A SIGKILL between the two
leaves an intent without its fault line, which ``faultnet chaos undo`` undoes as a fault
that may be in force (it was: 7 of 30 kills aimed there left a freeze nobody undid).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from faultnet.chaos import _rails
from faultnet.chaos._allowlist import Allowlist
from faultnet.chaos._catalogue import Fault
from faultnet.chaos._joinlog import JoinLog
from faultnet.chaos._plan import LOCAL, Plan, Slot, split_proxy_key
from faultnet.chaos._targets import (
    LocalTarget,
    ProxyTarget,
    ServerTarget,
    TargetAbsent,
    TargetFailed,
)
from faultnet.procs import ProcessIdentity

__all__ = ["CATCHABLE_SIGNALS", "RunResult", "Runner", "run_with_signals"]

#: Test-only: when set (to a file path), a real run creates that file after applying a
#: fault and before logging it, then waits forever. It makes the window a SIGKILL of
#: chaos can land in (a fault in force, its ``fault`` line not written) reachable on
#: purpose; tests/faultnet/chaos/test_recover.py kills chaos there.
PAUSE_AFTER_APPLY_ENV = "FAULTNET_CHAOS_TEST_PAUSE_AFTER_APPLY"

#: Seconds the exit undo may take in all before what is left is logged as not undone.
UNDO_BOUND_S = 30.0

#: The signals that end a run cleanly (every fault undone): each whose default action
#: ends a process and that a process can catch. SIGKILL cannot be caught.
CATCHABLE_SIGNALS = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)


@dataclass
class _Applied:
    """A fault in force that chaos must undo."""

    slot: Slot
    fault: Fault
    target: ProxyTarget | None = None
    process: ProcessIdentity | None = None
    #: An episode: the ids of the connections its down mode took.
    taken: list[int] | None = None

    def remains(self) -> str:
        stream = self.slot.detail.get("stream")
        what = self.slot.fault + (f" ({stream})" if stream else "")
        if self.process is not None:
            what += f" pid {self.process.pid}"
        return f"{what} on {self.slot.target}"


@dataclass
class RunResult:
    log: JoinLog
    #: The run was refused as a whole (the ``unarmed`` rail): nothing was touched.
    refused: bool = False
    signal: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: What was still applied when chaos gave up undoing it.
    not_undone: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 done (skips by rails included); 1 a step failed or a fault was not undone;
        2 refused (an unarmed run); 128+N after signal N, every fault undone."""
        if self.refused:
            return 2
        if self.counts.get("error") or self.counts.get("undo_failed"):
            return 1
        if self.signal is not None:
            return 128 + self.signal
        return 0


class Runner:
    """One run of one plan. Construct, then ``await runner.run()`` (once).

    *proxies* are the proxies in this process, by name (targets ``NAME@local``);
    *servers* the server URLs given on the command line (each must be named by the
    plan); *allowlist* the PID allowlist file; *marker* the arming marker file;
    *pid_cwd* a directory every signalled process must work under (the ``pid-cwd``
    rail; None: not checked).
    """

    def __init__(
        self,
        plan: Plan,
        log: JoinLog,
        *,
        proxies: Mapping[str, Any] | None = None,
        servers: Sequence[str] = (),
        allowlist: str | Path | None = None,
        dry: bool = False,
        armed: bool = False,
        marker: Path | None = None,
        time_unit: float = 1.0,
        allow_non_loopback: bool = False,
        pid_cwd: str | Path | None = None,
    ) -> None:
        self.plan = plan
        self.log = log
        self.local = dict(proxies or {})
        self.servers = [s.rstrip("/") for s in servers]
        self.allowlist = Allowlist(allowlist, cwd_root=pid_cwd)
        self.dry = dry
        self.armed = armed
        self.marker = marker
        self.time_unit = time_unit
        self.allow_non_loopback = allow_non_loopback
        self.result = RunResult(log)
        self._applied: dict[int, _Applied] = {}
        self._spent: dict[str, int] = {}
        self._named = set(plan.config.proxies) | set(plan.config.targets("process"))

    # -- logging -------------------------------------------------------------------------

    def _write(self, event: str, **fields: Any) -> None:
        self.log.write(event, **fields)
        self.result.counts[event] = self.result.counts.get(event, 0) + 1

    def _slot_fields(
        self, slot: Slot, action: str | None = None, at: float | None = -1.0
    ) -> dict[str, Any]:
        return {
            "action": action or slot.fault,
            "target": slot.target,
            "counter": slot.counter,
            "at": slot.at if at == -1.0 else at,
            "detail": dict(slot.detail, duration=slot.duration),
        }

    def _skip(self, slot: Slot, *, rail: str | None = None, reason: str) -> None:
        self._write("skip", **self._slot_fields(slot), rail=rail, reason=reason)

    # -- the run -------------------------------------------------------------------------

    async def run(self) -> RunResult:
        plan = self.plan
        # Pinned first, before anything can take time: the window in which a listed
        # PID can be reused unnoticed is the one between the spawner's line and this.
        refusals = self.allowlist.pin() if plan.config.processes else []
        me = ProcessIdentity.of(os.getpid())
        self._write(
            "seed",
            action="seed",
            detail={"seed": plan.seed, "chosen": plan.seed_chosen},
            # Who ran it (not printed): `faultnet chaos undo` will not act under a live run.
            extra={"chaos": {"pid": me.pid, "start_time": me.start_time}},
        )
        self._write(
            "plan",
            action="plan",
            detail={
                "slots": len(plan.slots),
                "time_unit": self.time_unit,
                "allowlist": str(self.allowlist.path) if self.allowlist.path else None,
                "config": plan.config.to_json(),
                **({"capped": True} if plan.capped else {}),
            },
        )
        for r in refusals:
            self._write(
                "refuse",
                action="allowlist",
                target=f"process:{r.name}" if r.name else "",
                rail="pid-allowlist",
                reason=f"line {r.line}: {r.reason}" if r.line else r.reason,
                detail={"pid": r.pid} if r.pid is not None else None,
            )
        for url in self.servers:
            if _rails.check_named(url, plan.config.servers) is not None:
                self._write(
                    "refuse",
                    action="server",
                    target=url,
                    rail="unnamed",
                    reason=f"server {url} is named by no target of the plan: never contacted",
                )
        for name in self.local:
            key = f"{name}@{LOCAL}"
            if _rails.check_named(key, self._named) is not None:
                self._write(
                    "refuse",
                    action="proxy",
                    target=key,
                    rail="unnamed",
                    reason=f"proxy {key} is not named in the plan: never touched",
                )
        unarmed = _rails.check_armed(self.armed, self.marker)
        if self.dry:
            self._write(
                "check",
                action="arming",
                rail="unarmed" if unarmed else None,
                reason=f"a real run now would be refused: {unarmed}"
                if unarmed
                else "a real run now would be armed",
            )
        elif unarmed is not None:
            self.result.refused = True
            self._write("refuse", action="run", rail="unarmed", reason=unarmed)
            for slot in plan.slots:
                self._skip(slot, rail="unarmed", reason="the run is not armed")
            self._end()
            return self.result
        try:
            await self._walk()
        finally:
            with trio.CancelScope(shield=True):
                await self._undo_all()
            self._end()
        return self.result

    def _end(self) -> None:
        self.allowlist.close()  # after every undo: SIGCONT goes through the pinned pidfds
        counts = dict(self.result.counts)
        self._write(
            "end",
            action="end",
            detail={"counts": counts, "not_undone": self.result.not_undone},
        )

    async def _walk(self) -> None:
        start = trio.current_time()
        for at, kind, slot in self.plan.timeline():
            if not self.dry:
                await trio.sleep_until(start + at * self.time_unit)
            if kind == "fault":
                await self._fault(slot)
            else:
                applied = self._applied.pop(slot.index, None)
                if applied is not None:
                    await self._undo(applied, reason="due", at=at)

    # -- faults --------------------------------------------------------------------------

    async def _fault(self, slot: Slot) -> None:
        if slot.skip is not None:
            self._skip(slot, reason=slot.skip)
            return
        fault = self.plan.config.faults[slot.fault]
        refused = _rails.check_named(slot.target, self._named)
        if refused is not None:
            self._skip(slot, rail="unnamed", reason=refused)
            return
        if fault.once and fault.name in self._spent:
            self._skip(
                slot,
                reason=f"spent: {fault.name} runs once per run and fired at counter "
                f"{self._spent[fault.name]}",
            )
            return
        target: ProxyTarget | None = None
        if fault.on == "proxy":
            name, where = split_proxy_key(slot.target)
            known: list[str] = []
            if where == LOCAL and name in self.local:
                known = await LocalTarget(slot.target, self.local[name]).hosts()
            elif where != LOCAL:
                known = [_rails.url_host(where)]
            refused = _rails.check_loopback(known, self.allow_non_loopback)
            if refused is not None:
                self._skip(slot, rail="loopback", reason=refused)
                return
            target = self._resolve(name, where)
            if target is None:
                self._skip(slot, reason=f"absent: no proxy {name} in this process")
                return
            if self.dry:
                self._fired(slot, fault, _Applied(slot, fault))
                return
            try:
                refused = _rails.check_loopback(await target.hosts(), self.allow_non_loopback)
            except TargetAbsent as exc:
                self._skip(slot, reason=f"absent: {exc}")
                return
            except TargetFailed as exc:
                self._write("error", **self._slot_fields(slot), reason=str(exc))
                return
            if refused is not None:
                self._skip(slot, rail="loopback", reason=refused)
                return
            self._intend(slot)
            began = time.monotonic()
            try:
                result = await self._apply(slot, fault, target)
            except (TargetAbsent, TargetFailed) as exc:
                self._write("error", **self._slot_fields(slot), reason=str(exc))
                return
            await _pause_after_apply()
            taken = result.get("conns") if fault.kind == "episode" else None
            applied = _Applied(slot, fault, target=target, taken=taken)
            self._fired(slot, fault, applied, result, began=began)
            return
        await self._signal(slot, fault)

    async def _signal(self, slot: Slot, fault: Fault) -> None:
        """A process fault: the allowlist's verdict (a dry run asks it too), then the
        signal through a pidfd."""
        proc_name = slot.target.split(":", 1)[1]
        verdict = self.allowlist.verify(proc_name)
        if verdict.identity is None:
            self._skip(slot, rail=verdict.rail, reason=f"{proc_name}: {verdict.reason}")
            return
        if self.dry:
            self._fired(slot, fault, _Applied(slot, fault))
            return
        sig = signal.Signals[slot.detail["signal"]]
        ident = verdict.identity
        self._intend(slot, process={"pid": ident.pid, "start_time": ident.start_time})
        began = time.monotonic()
        if not self.allowlist.signal(ident, sig):
            self._skip(slot, rail="pid-allowlist", reason=f"{proc_name}: gone")
            return
        await _pause_after_apply()
        self._fired(
            slot,
            fault,
            _Applied(slot, fault, process=ident),
            {"pid": ident.pid, "start_time": ident.start_time},
            began=began,
        )

    def _intend(self, slot: Slot, **extra: Any) -> None:
        """Write-ahead: the ``intent`` line of a fault about to be applied (real runs), on
        disk before the call, so that ``faultnet chaos undo`` knows a fault may be in
        force even if chaos is killed before the fault's own line (its ``fault``,
        ``skip`` or ``error`` line closes the intent)."""
        self._write("intent", **self._slot_fields(slot), extra=extra or None)

    def _resolve(self, name: str, where: str) -> ProxyTarget | None:
        if where == LOCAL:
            proxy = self.local.get(name)
            return LocalTarget(f"{name}@{LOCAL}", proxy) if proxy is not None else None
        return ServerTarget(f"{name}@{where}", where, name)

    @staticmethod
    async def _apply(slot: Slot, fault: Fault, target: ProxyTarget) -> dict[str, Any]:
        d = slot.detail
        if fault.kind == "toxic":
            return await target.add_toxic(d["name"], d["type"], d["stream"], dict(d["attributes"]))
        if fault.kind == "episode":
            assert fault.down is not None
            return await target.apply_mode(fault.down, stream="both", include_new=False)
        return await target.apply_mode(
            fault.name, stream=d.get("stream", "both"), include_new=bool(d.get("include_new"))
        )

    def _fired(
        self,
        slot: Slot,
        fault: Fault,
        applied: _Applied,
        result: dict[str, Any] | None = None,
        began: float | None = None,
    ) -> None:
        if fault.once:
            self._spent[fault.name] = slot.counter
        if fault.undo is not None:
            self._applied[slot.index] = applied
        self._write("fault", **self._slot_fields(slot), result=result, began=began)

    # -- undo ----------------------------------------------------------------------------

    async def _undo(self, applied: _Applied, *, reason: str, at: float | None = None) -> None:
        """Undo one applied fault; *at* is the planned moment (None: at exit)."""
        slot, fault = applied.slot, applied.fault
        fields = self._slot_fields(slot, action=fault.undo, at=at)
        if self.dry:
            self._write("undo", **fields, reason=reason)
            return
        result: dict[str, Any]
        if fault.kind == "episode" and not applied.taken:
            # Still an undo line, as in a dry run (which cannot know what was taken).
            result = {"connections": 0, "conns": [], "note": "the outage took no connection"}
            self._write("undo", **fields, reason=reason, result=result)
            return
        began = time.monotonic()
        try:
            if applied.process is not None:
                verdict = Allowlist.check(applied.process)
                if verdict.identity is None:
                    # Not the process chaos stopped any more: nothing of ours is stopped.
                    self._write("skip", **fields, rail="pid-allowlist", reason=verdict.reason)
                    return
                if not self.allowlist.signal(verdict.identity, signal.SIGCONT):
                    self._write("skip", **fields, rail="pid-allowlist", reason="gone")
                    return
                result = {"pid": applied.process.pid}
            elif applied.target is not None and fault.kind == "toxic":
                result = await applied.target.remove_toxic(slot.detail["name"])
            elif applied.target is not None and fault.kind == "episode":
                result = await applied.target.apply_mode(
                    fault.undo or "", stream="both", include_new=False, only=applied.taken
                )
            elif applied.target is not None and fault.undo is not None:
                result = await applied.target.apply_mode(
                    fault.undo, stream=slot.detail.get("stream", "both"), include_new=False
                )
            else:  # pragma: no cover - every applied fault has a target or a process
                raise TargetFailed("nothing to undo it with")
        except (TargetAbsent, TargetFailed, OSError) as exc:
            self.result.not_undone.append(applied.remains())
            self._write("undo_failed", **fields, reason=f"{exc}; remains: {applied.remains()}")
            return
        self._write("undo", **fields, reason=reason, result=result, began=began)

    async def _undo_all(self) -> None:
        pending = sorted(self._applied.values(), key=lambda a: a.slot.index, reverse=True)
        self._applied.clear()
        with trio.move_on_after(UNDO_BOUND_S) as bound:
            while pending:
                await self._undo(pending[0], reason="exit")
                pending.pop(0)
        if bound.cancelled_caught:
            for applied in pending:
                self.result.not_undone.append(applied.remains())
                self._write(
                    "undo_failed",
                    **self._slot_fields(applied.slot, action=applied.fault.undo, at=None),
                    reason=f"no time left ({UNDO_BOUND_S} s); remains: {applied.remains()}",
                )


async def _pause_after_apply() -> None:
    """The test-only pause of :data:`PAUSE_AFTER_APPLY_ENV` (nothing when it is unset)."""
    where = os.environ.get(PAUSE_AFTER_APPLY_ENV)
    if where:
        await trio.Path(where).touch()
        await trio.sleep_forever()


async def run_with_signals(runner: Runner) -> RunResult:
    """Run *runner*; any of :data:`CATCHABLE_SIGNALS` ends the run early, logged, with
    every fault undone (exit code 128 + the signal)."""
    with trio.open_signal_receiver(*CATCHABLE_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for sig in signals:
                    runner.result.signal = int(sig)
                    runner._write(
                        "signal",
                        action=signal.Signals(sig).name,
                        reason="ending the run: every applied fault is undone",
                    )
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            await runner.run()
            nursery.cancel_scope.cancel()
    return runner.result
