"""Fleet orchestration: a bounded pool, canary first, batches, a failure budget,
and an interrupt that starts nothing new but lets hosts in flight finish.

Fabric's ThreadingGroup starts one thread per host with no bound; here at most
`parallel` hosts work at once, and a host that was never started is reported
as `skipped`, not left to guess."""
from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from . import dialer
from .errors import Status, interrupt_cause
from .inventory import Host, units_of
from .hostcalls import HostResult

MAX_PARALLEL = 32

HostFn = Callable[[Host], HostResult]
# a node group's step: its ranks in rank order in, one result per rank out
GroupFn = Callable[[list[Host]], list[HostResult]]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_UNREACHABLE = {Status.UNREACHABLE, Status.HOST_KEY_REJECTED, Status.AUTH_FAILED}


def _failed(results: dict) -> list[HostResult]:
    """The hosts that failed or were unreachable, not skipped."""
    return [r for r in results.values() if not r.ok and r.status not in (Status.SKIPPED, Status.INTERRUPTED)]


def _failed_units(results: dict) -> int:
    """What a failure budget counts: each host alone, a node group once however many of its ranks failed."""
    return len({r.details.get("node_group") or r.host for r in _failed(results)})


def _tagged(result: HostResult, host: Host) -> HostResult:
    """The result names the node group and rank of a host that runs one (the report's node_group, node_rank)."""
    if host.node_group is not None:
        result.details.setdefault("node_group", host.node_group)
        result.details.setdefault("node_rank", host.node_rank)
    return result


def _over_budget(budget: int, failures: int, grouped: bool) -> str:
    what = _plural(failures, "host") if not grouped else \
        f"{_plural(failures, 'unit')} (a host, or a node group counted once)"
    return (f"more than --max-failures {budget}: {what} had failed "
            f"or {'was' if failures == 1 else 'were'} unreachable when the stop came")


UnitFn = Callable[[list[Host]], list[HostResult]]


def each_host(fn: HostFn) -> UnitFn:
    """A step of one host as the step of a unit: each of its hosts on its own, a node group's
    ranks at once (a read of every rank takes as long as one)."""
    def unit_fn(unit: list[Host]) -> list[HostResult]:
        if len(unit) == 1:
            return [_tagged(fn(unit[0]), unit[0])]
        with ThreadPoolExecutor(max_workers=len(unit), thread_name_prefix="fleetpatch-rank") as pool:
            return [_tagged(r, h) for r, h in zip(pool.map(fn, unit), unit)]
    return unit_fn


def by_unit(fn: HostFn, group_fn: GroupFn) -> UnitFn:
    """A host alone by `fn`; a node group's ranks together by `group_fn`."""
    def unit_fn(unit: list[Host]) -> list[HostResult]:
        if len(unit) == 1 and unit[0].node_group is None:
            return [fn(unit[0])]
        return [_tagged(r, h) for r, h in zip(group_fn(unit), unit)]
    return unit_fn


@dataclass
class Stop:
    """Why the fleet stopped starting hosts (None while it goes on)."""

    reason: str | None = None
    interrupted: bool = False
    cause: str = "Ctrl-C"   # what interrupted it: "Ctrl-C", "SIGTERM" or "SIGHUP"
    event: threading.Event = field(default_factory=threading.Event)
    interrupt: dialer.Interrupt | None = None   # the run's Ctrl-C, fired for the hosts at work
    # where a Ctrl-C pressed again is answered (the terminal: the run's output may be piped)
    tell: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    def set(self, reason: str, interrupted: bool = False) -> None:
        if self.reason is None:
            self.reason = reason
        self.interrupted = self.interrupted or interrupted
        self.event.set()

    def lift(self) -> None:
        """Go on after all (a bake proved the unproven hosts that stopped it), unless interrupted."""
        if not self.interrupted:
            self.reason = None
            self.event.clear()

    def describe(self, results: dict) -> str | None:
        """The `stopped:` line, counted over the final results: hosts in flight when
        the stop came may have failed too, and the line says so truthfully."""
        if self.reason is None:
            return None
        groups: dict[str, list[str]] = {}
        for r in _failed(results):
            cat = "unreachable" if r.status in _UNREACHABLE else "failed"
            groups.setdefault(cat, []).append(r.host if r.status == cat else f"{r.host} {r.status}")
        tally = ", ".join(f"{len(h)} {cat} ({', '.join(h)})" for cat, h in sorted(groups.items()))
        not_started = sum(1 for r in results.values() if r.status == Status.SKIPPED)
        parts = [self.reason]
        if tally and not self.interrupted:
            parts.append(f"in the end {tally}")
        if not_started:   # every host had started (a hangup mid-run on the last one): nothing to say
            parts.append(f"{_plural(not_started, 'host')} not started (skipped, untouched)")
        return "stopped: " + "; ".join(parts)


def default_parallel(n_hosts: int, parallel: int | None) -> int:
    if parallel is None or parallel <= 0:
        return max(1, min(n_hosts, MAX_PARALLEL))
    return parallel


def run_stage(hosts: list[Host], fn: UnitFn, parallel: int, results: dict, stop: Stop,
              budget: int | None = None) -> None:
    """Run `fn` on the units of `hosts` (a host alone, or a node group's ranks), at most
    `parallel` units at once. With a `budget`, stop starting units once more than `budget`
    have failed (counted over `results`)."""
    pending = units_of(hosts)
    in_flight: dict[Future, list[Host]] = {}

    def take(fut: Future, unit: list[Host]) -> None:
        for host, result in zip(unit, fut.result()):
            results[host.name] = result

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="fleetpatch") as pool:
        try:
            while pending or in_flight:
                while pending and len(in_flight) < parallel and stop.reason is None:
                    unit = pending.pop(0)
                    in_flight[pool.submit(fn, unit)] = unit
                if not in_flight:
                    break
                done, _ = wait(list(in_flight), timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    take(fut, in_flight.pop(fut))
                    failures = _failed_units(results)
                    if budget is not None and failures > budget:
                        stop.set(_over_budget(budget, failures, any(r.details.get("node_group")
                                                                    for r in results.values())))
        except KeyboardInterrupt as e:
            stop.cause = interrupt_cause(e)
            if stop.interrupt is not None:   # a host still connecting, or draining, is left untouched at once
                stop.interrupt.fire(stop.cause)
            stop.set(f"interrupted ({stop.cause}): no new host was started; the hosts in flight were let finish "
                     "(or roll back)", interrupted=True)
            # Let each host in flight finish or undo its step; a Ctrl-C again says what is waited for.
            while in_flight:
                try:
                    done, _ = wait(list(in_flight), timeout=0.5)
                except KeyboardInterrupt:
                    stop.tell(still_waiting([h.name for unit in in_flight.values() for h in unit]))
                    continue
                for fut in done:
                    take(fut, in_flight.pop(fut))
    for unit in pending:
        for host in unit:
            results.setdefault(host.name, _tagged(_skipped(host, stop), host))


def still_waiting(hosts: list[str], pid: int | None = None) -> str:
    """The answer to a Ctrl-C pressed again while hosts in flight finish their step."""
    pid = os.getpid() if pid is None else pid
    shown = ", ".join(hosts[:8]) + (f", … ({len(hosts) - 8} more)" if len(hosts) > 8 else "")
    return (f"fleetpatch: interrupted; still waiting for {_plural(len(hosts), 'host')} in flight ({shown}) to finish "
            "(or roll back) the step each is in, so that none is left half-done and locked; to quit now anyway: "
            f"kill -9 {pid} (then `fleetpatch status` shows what each host was left in)")


def _skipped(host: Host, stop: Stop) -> HostResult:
    why = f"interrupted ({stop.cause})" if stop.interrupted else (stop.reason or "the run stopped")
    return HostResult(host.name, False, Status.SKIPPED, f"{host.name}: not started ({why}); untouched")


def run_all(hosts: list[Host], fn: UnitFn, parallel: int | None,
            interrupt: dialer.Interrupt | None = None) -> tuple[dict, Stop]:
    """`fn` on every unit of `hosts`, at most `parallel` at once; Ctrl-C fires `interrupt`."""
    results: dict = {}
    stop = Stop(interrupt=interrupt)
    run_stage(hosts, fn, default_parallel(len(units_of(hosts)), parallel), results, stop)
    return {h.name: results[h.name] for h in hosts}, stop


def _bake_stage(stage: list[Host], bake: Callable[[Host, HostResult], HostResult], results: dict, stop: Stop,
                budget: int) -> None:
    """Watch the stage's successful hosts at once; failures join the stage's results."""
    # an unproven host serves, on the right path: its bake may prove it under traffic
    good = [h for h in stage if results[h.name].ok or results[h.name].status == Status.UNPROVEN]
    baked: dict = {}
    watching = Stop(interrupt=stop.interrupt, tell=stop.tell)
    run_stage(good, each_host(lambda h: bake(h, results[h.name])), max(1, len(good)), baked, watching)
    for name, r in baked.items():
        results[name] = r
    if watching.interrupted:   # Ctrl-C during the bake stops the rollout too: no next batch
        stop.cause = watching.cause
        stop.set(watching.reason, interrupted=True)
    failures = _failed_units(results)
    if failures > budget and stop.reason is None:
        stop.set(f"more than --max-failures {budget}: {_plural(failures, 'host')} had failed (bake included)")
    elif failures <= budget and any(r.ok for r in baked.values()):
        stop.lift()   # the bake proved what had failed the budget


def plan_stages(hosts: list[Host], canary_group: list[str] | None, canary: int | None,
                batch: int | None) -> tuple[list[list[Host]], bool]:
    """The canary stage (if any), then batches, in inventory order; and whether
    the first stage is a canary. A node group is one unit: all of its ranks are in one
    stage, it counts once towards --canary N and --batch N, and it is in the canary
    when the `canary` group names any of its hosts."""
    units = units_of(hosts)
    if canary_group and canary != 0:
        first = [u for u in units if any(h.name in canary_group for h in u)]
    else:
        n = 1 if canary is None else max(0, canary)
        first = units[:n]
    rest = [u for u in units if u not in first]
    stages = [first] if first else []
    size = batch if batch and batch > 0 else max(1, len(rest))
    for i in range(0, len(rest), size):
        stages.append(rest[i:i + size])
    return [[h for u in stage for h in u] for stage in stages], bool(first)


def first_out(stages: list[list[Host]], parallel: int | None) -> list[Host]:
    """The hosts a rollout starts with: its first stage's first `parallel` (inventory order)."""
    if not stages:
        return []
    return stages[0][:default_parallel(len(stages[0]), parallel)]


def rollout(hosts: list[Host], fn: UnitFn, *, stages: list[list[Host]], has_canary: bool, parallel: int | None,
            max_failures: int, bake: Callable[[Host, HostResult], HostResult] | None = None,
            interrupt: dialer.Interrupt | None = None) -> tuple[dict, Stop, list[list[str]]]:
    """The `stages` of plan_stages, one after the other. `bake(host, result)`: after each stage, the
    result of watching each host that succeeded (--bake); a host failing it counts against the
    budget like any failure. Ctrl-C fires `interrupt`."""
    results: dict = {}
    stop = Stop(interrupt=interrupt)
    for i, stage in enumerate(stages):
        if stop.reason is not None:
            break
        is_canary = has_canary and i == 0
        run_stage(stage, fn, default_parallel(len(units_of(stage)), parallel), results, stop,
                  budget=0 if is_canary else max_failures)
        if bake is not None and not stop.interrupted:
            _bake_stage(stage, bake, results, stop, 0 if is_canary else max_failures)
        bad = [h.name for h in stage if not results[h.name].ok] if is_canary else []
        if bad and not stop.interrupted:
            # the canary's budget is 0: its first failure is the reason, whatever run_stage said
            stop.reason = None
            stop.set(f"the canary failed ({', '.join(f'{n}: {results[n].status}' for n in bad)})")
    for h in hosts:
        results.setdefault(h.name, _tagged(_skipped(h, stop), h))
    return {h.name: results[h.name] for h in hosts}, stop, [[h.name for h in s] for s in stages]
