"""A multi-node server (`nodes:` in the inventory): its ranks deployed, restarted,
verified and rolled back as one unit.

Every rank's connection and lock are taken and every rank's files are checked
before the first byte is written: one refusal, or one rank that cannot be
reached, leaves the whole group untouched. Then, inside rank 0's drain (it alone
serves HTTP), every rank's install is written, every rank is stopped, then every
rank is started, rank 0 first (it holds the rendezvous the others join), and every
rank is judged at once, each on its own log and probe records: rank 0 by its ready
line and the patch's expect lines, a rank above 0 by its own "up" line. A failure
on any rank fails the group, naming the rank and its host; with `--on-failure
rollback` every rank is rolled back. A run cut between the stops and the starts
(a killed laptop) leaves each stopped rank's restart pending in its ledger, so the
next deploy restarts the group, and the next rollback undoes it.
"""
from __future__ import annotations

import contextlib
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .. import drain, protocol
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from ..inventory import Host
from . import execution
from .context import HeldLock, HostRun, Job, connect, deploy_command, finish_run, new_run, probe, rollback_command
from .deploying import already_applied, apply_request, interrupted_before_writing, probe_spec, refusal
from .follow import PeerSmoke, Watch, follow_ahead, prove_wait, rollback_smoke, smoke_spec
from .lock import HostLock
from .plan import make_plan, revision_files
from .recorded import deployed, wanted_name
from .restarting import launch_after_restart, restart_reason
from .servers import judged_without, restore_install
from .verify import cut_off, fold_rollback, newest_first, no_answer, verify


class NodeGroup:
    """One command's view of a node group: a HostRun per rank, in rank order (each its own
    connection, agent and lock)."""

    def __init__(self, job: Job, runs: list[HostRun]):
        self.job, self.runs = job, runs
        self.name = runs[0].host.node_group

    @property
    def rank0(self) -> HostRun:
        return self.runs[0]

    def who(self, run: HostRun) -> str:
        return f"rank {run.host.node_rank} ({run.name})"

    def untouched(self, cause: HostRun, result: HostResult) -> list[HostResult]:
        """`cause`'s own result, and every other rank left as it was because of it."""
        out = []
        for run in self.runs:
            if run is cause:
                out.append(result)
            else:
                out.append(run.result(False, Status.SKIPPED, f"{run.name}: untouched: node group {self.name} was "
                                                              f"not changed, because {self.who(cause)} is "
                                                              f"{result.status}", patch=result.patch))
        return out

    def each(self, fn: Callable[..., HostResult], *per_rank: list) -> list[HostResult]:
        """`fn(run, *its items of per_rank)` on every rank at once (the follows: rank 0 is ready only
        once every rank has joined)."""
        with ThreadPoolExecutor(max_workers=len(self.runs), thread_name_prefix="fleetpatch-rank") as pool:
            return list(pool.map(fn, self.runs, *per_rank))


def group_step(fn: Callable[[NodeGroup], list[HostResult]]):
    """A node group's operation as `step(job, hosts)`: every rank's connection opened first (a rank
    that cannot be reached leaves the group untouched), one result per rank, every failure a result."""

    def run(job: Job, hosts: list[Host]) -> list[HostResult]:
        group = NodeGroup(job, [new_run(job, h) for h in hosts])
        try:
            results = _opened(group) or fn(group)
        except HostFailure as f:   # before any rank was changed: the steps catch the later ones
            results = [run.result(False, f.status, f.message) for run in group.runs]
        except Exception as e:  # a bug must not take the other hosts down with it
            results = [run.result(False, Status.ERROR, f"{run.name}: {type(e).__name__}: {e}") for run in group.runs]
        except BaseException:
            for run in group.runs:
                run.remote.close()
            raise
        return [finish_run(run, result) for run, result in zip(group.runs, results)]

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def _opened(group: NodeGroup) -> list[HostResult] | None:
    """Every rank connected (at once), or the results of a group left untouched."""
    def opened(run: HostRun) -> HostResult | None:
        try:
            connect(run)
        except HostFailure as f:
            return run.result(False, f.status, f.message)
        return None
    failed = [(run, r) for run, r in zip(group.runs, group.each(opened)) if r is not None]
    return group.untouched(*failed[0]) if failed else None


@contextlib.contextmanager
def _locked(group: NodeGroup, command: str):
    """Every rank's lock for one block, released at its end (never riding on a rank's follow:
    the other ranks' work, or their rollback, may still follow)."""
    with contextlib.ExitStack() as stack:
        for run in group.runs:
            lock = stack.enter_context(HostLock(run.remote, run.host, group.job, command))
            run.lock = HeldLock(lock)
        yield


def _annotated(group: NodeGroup, results: list[HostResult]) -> list[HostResult]:
    return [run.lock.lock.annotate(r) if run.lock is not None else r for run, r in zip(group.runs, results)]


def _locked_probes(group: NodeGroup, files: list[str], content: bool) -> tuple[list, list[HostResult] | None]:
    replies = []
    for run in group.runs:
        run.progress("fetch", "lock + read files")
        try:
            replies.append(run.lock.probe(files, content=content))
        except HostFailure as f:
            return replies, group.untouched(run, run.result(False, f.status, f.message))
        run.version = replies[-1].get("version")
    return replies, None


# ----------------------------------------------------------------------- deploy

@group_step
def deploy_nodes(group: NodeGroup) -> list[HostResult]:
    """deploy-patch and rollout of a node group."""
    results: list[HostResult] = []
    try:
        with _locked(group, deploy_command(group.job)):
            replies, refused = _locked_probes(group, revision_files(group.job), content=True)
            results = refused or _deploy_locked(group, replies)
    finally:
        results = _annotated(group, results) if results else results
    return results


def _deploy_locked(group: NodeGroup, replies: list) -> list[HostResult]:
    job = group.job
    mixed = _mixed_versions(group)   # before any rank's own plan: the group's first refusal
    if mixed is not None:
        return group.untouched(group.rank0, mixed)
    plans, specs, revisions = [], [], []
    for run, reply in zip(group.runs, replies):
        run.progress("pre-flight")
        try:
            plan, revision = make_plan(job, run.host, reply)
        except HostFailure as f:
            return group.untouched(run, run.result(False, f.status, f.message))
        run.version = plan.version
        refused = refusal(run, plan)
        if refused is not None:
            return group.untouched(run, refused)
        plans.append(plan)
        revisions.append(revision)
        specs.append(probe_spec(run, plan, revision, reply))
    if job.interrupt.is_set():   # Ctrl-C while the ranks were read: no rank is written or restarted
        return [interrupted_before_writing(run, plan.label) for run, plan in zip(group.runs, plans)]
    reasons = [None if not p.already else restart_reason(r.get("ledger") or {}, r.get("server") or {},
                                                        job.patch.name) for p, r in zip(plans, replies)]
    writes = [(plan, reply, revision) for plan, reply, revision in zip(plans, replies, revisions)]
    if job.no_restart:
        return _apply_only(group, writes)
    if all(p.already for p in plans) and not any(reasons):
        return _group_verdict(group, group.each(already_applied, plans, replies, specs))
    return _restart_group(group, writes, specs, reasons)


def _mixed_versions(group: NodeGroup) -> HostResult | None:
    versions = {run.version for run in group.runs}
    if len(versions) < 2:
        return None
    each = ", ".join(f"{group.who(run)} {run.version}" for run in group.runs)
    return group.rank0.result(False, Status.ERROR, f"{group.rank0.name}: refused, nothing changed on any rank: node "
                                                   f"group {group.name}'s hosts run different engine versions "
                                                   f"({each}); a multi-node server runs one release on every rank: "
                                                   "install the same one on each, or fix the group in the inventory")


def _apply_all(group: NodeGroup, writes: list) -> list[HostResult] | None:
    """Write every rank's install that needs it, its restart left pending; None when all are written.
    A rank that fails has written nothing (the agent's all-or-nothing); those written before it are
    restored, so that no rank of the group runs other code than the rest."""
    written: list[tuple[HostRun, bool]] = []   # each rank written, and whether its restart was pending before
    for run, (plan, reply, revision) in zip(group.runs, writes):
        if plan.already:
            continue
        run.progress("apply", f"{len(plan.changes)} file{'' if len(plan.changes) == 1 else 's'}")
        try:
            # every rank is restarted once all are written
            run.remote.call("apply", dict(apply_request(run, plan, reply, revision), restart=None))
        except HostFailure as f:
            out = group.untouched(run, run.result(False, f.status, f.message, patch=plan.label))
            for w, before in written:
                out[group.runs.index(w)] = _restored_unrestarted(group, w, before, run, f.status, plan.label)
            return out
        written.append((run, bool((reply.get("ledger") or {}).get("restart_pending"))))
    return None


def _restored_unrestarted(group: NodeGroup, w: HostRun, pending_before: bool, failed: HostRun, why: str,
                          label: str) -> HostResult:
    """A rank written, then restored before any restart because `failed`'s write failed: its server
    never ran the patch, so it is not restarted, and its restart is as pending as before the write."""
    problem = restore_install(w, [group.job.patch.name], [], pending_after=pending_before)
    said = (f"{w.name}: written, then restored to its originals; not restarted (its server never ran the patch): "
            f"node group {group.name} failed at {group.who(failed)} ({why})")
    if problem:
        return w.result(False, Status.ERROR, f"{said}; the restore FAILED: {problem.message}", patch=label)
    result = w.result(False, Status.ROLLED_BACK, said, patch=label)
    result.details["rollback"] = {"status": Status.ROLLED_BACK, "ok": True,
                                  "message": f"{w.name}: restored to its originals before any restart"}
    return result


def _apply_only(group: NodeGroup, writes: list) -> list[HostResult]:
    failed = _apply_all(group, writes)
    if failed is not None:
        return failed
    return [run.result(True, Status.ALREADY_APPLIED if plan.already else Status.APPLIED,
                       f"{run.name}: {plan.label} {'already applied' if plan.already else 'applied'}; restart pending "
                       f"(--no-restart): the next deploy restarts node group {group.name} and proves it",
                       patch=plan.label) for run, (plan, _, _) in zip(group.runs, writes)]


def _restart_group(group: NodeGroup, writes: list, specs: list, reasons: list) -> list[HostResult]:
    """Inside rank 0's drain: write, stop every rank, start every rank, judge every rank."""
    job, rank0 = group.job, group.rank0
    plans = [w[0] for w in writes]
    per_rank: list[HostResult] = []
    rollback = job.on_failure == "rollback"

    def restart_all() -> HostResult:
        nonlocal per_rank
        unwritten = _apply_all(group, writes)
        if unwritten is not None:   # nothing restarted; the ranks written were restored already
            per_rank = _group_verdict(group, unwritten)
            return per_rank[0]
        per_rank = _group_verdict(group, _restarted_and_judged(group, plans, specs, reasons))
        if rollback and not all(r.ok for r in per_rank):
            per_rank = _rolled_back_after(group, per_rank)
        return per_rank[0]

    def undo(failed: HostResult) -> HostResult:   # rank 0's smoke request failed after every rank verified
        nonlocal per_rank
        per_rank = _rolled_back_after(group, _group_verdict(group, [failed] + per_rank[1:]))
        return per_rank[0]

    head = drain.around_restart(job, rank0.host, rank0.remote, restart_all, rollback=undo if rollback else None,
                                expect=list(getattr(job.patch, "smoke_expect", None) or []))
    if not per_rank:   # not drained (or refused before the restart): every rank as it was
        return group.untouched(rank0, head)
    per_rank[0] = head
    return _group_verdict(group, per_rank)


def _group_verdict(group: NodeGroup, per_rank: list[HostResult]) -> list[HostResult]:
    """A failure on any rank fails every rank, each naming the ranks that failed (once: a verdict
    already given is kept)."""
    bad = [(run, r) for run, r in zip(group.runs, per_rank) if not r.ok]
    if not bad or len(group.runs) < 2 or any("node_group_failed" in r.details for r in per_rank):
        return per_rank
    named = ", ".join(f"{group.who(run)}: {r.status}" for run, r in bad)
    for r in per_rank:
        r.details["node_group_failed"] = named
        if r.ok:   # its own verdict passed: the block says first that the group did not
            r.ok, r.status = False, bad[0][1].status
            head, _, rest = r.message.partition("\n")
            own = re.match(r"^OK\s+\S+\s+(.*)$", head)
            r.message = (f"FAIL {r.host}  node group {group.name} failed: {named}\n"
                         f"  this rank on its own: {own.group(1) if own else head}" + (f"\n{rest}" if rest else ""))
        else:
            r.message += f"\n  node group {group.name}: {named}"
    return per_rank


def _restarted_and_judged(group: NodeGroup, plans, specs, reasons) -> list[HostResult]:
    """Stop every rank, start every rank (rank 0 first), then follow every rank's log at once."""
    label = plans[0].label
    pending = [(run, r) for run, r, plan in zip(group.runs, reasons, plans) if r and plan.already]
    why = "apply" if not pending or not all(p.already for p in plans) else \
        f"{pending[0][1]} ({group.who(pending[0][0])})"
    failed = _stop_all(group, label)
    if failed is not None:
        return failed
    outs: list[dict | None] = []
    started: list[HostRun] = []
    for run, spec in zip(group.runs, specs):
        run.progress("restart", f"rank {run.host.node_rank} of {len(group.runs)}" + ("" if why == "apply" else
                                                                                      f": {why}"))
        request = protocol.RestartRequest(**run.request(), reason=f"{why}: restart for {label}")
        if spec is not None:
            request["probe"] = spec
        try:
            outs.append(run.remote.call("restart", request, ahead=follow_ahead(run.job, run.host, spec is not None,
                                                                               smoke_spec(run.host, run.job.patch))))
        except HostFailure as f:
            return _start_failed(group, run, f, label, started)
        started.append(run)

    # the ranks above 0 keep watching until rank 0's smoke requests were answered: their workers
    # run the requests rank 0 takes
    peer = PeerSmoke() if smoke_spec(group.rank0.host, group.job.patch) is not None else None

    def judge(run: HostRun, out: dict, plan, spec: dict | None) -> HostResult:
        watch = Watch(protocol.AFTER_RESTART, launch_after_restart(run.host, plan), [run.job.patch], [label],
                      ends_work=lambda ok: True,
                      execution=execution.ExecutionView(out.get("probe")) if spec is not None else None,
                      smoke=smoke_spec(run.host, run.job.patch), smoke_wait=prove_wait(run.job.patch),
                      peer_smoke=peer)
        try:
            return verify(run, watch)
        except HostFailure as f:
            return cut_off(run, label, f, "verification")
        finally:
            if peer is not None and not run.host.node_rank:
                peer.finish()   # answered or not, the other ranks stop waiting on rank 0
    results = group.each(judge, outs, plans, specs)
    return _still_up(group, outs, results) if all(r.ok for r in results) else results


def _still_up(group: NodeGroup, outs: list, results: list[HostResult]) -> list[HostResult]:
    """Each rank is judged once its own lines are in, and a rank that dies after that does not stop
    the others (upstream #3099): so once every rank has passed, each one's server is looked at again."""
    for run, out, result in zip(group.runs, outs, results):
        started = (out.get("restart") or {}).get("pid")
        try:
            server = probe(run.remote, run.host, run.job, [], content=False).get("server") or {}
        except HostFailure as f:
            result.ok, result.status = False, f.status
            result.message += f"\n  could not look at the server again once every rank had passed: {f.message}"
            continue
        if not server.get("alive") or (started and server.get("pid") not in (None, started)):
            result.ok, result.status = False, Status.RESTART_FAILED
            result.message += (f"\n  but its server (pid {started}) is no longer running: it exited after it passed, "
                               f"while the other ranks were judged; its log ({run.host.server.log}) says why")
    return results


def _stop_all(group: NodeGroup, label: str, undoing: bool = False) -> list[HostResult] | None:
    """Every rank stopped, its restart left pending (the ledger says so if this run ends here)."""
    stopped: list[HostRun] = []
    for run in reversed(group.runs):   # the ranks above 0 first: rank 0 holds the rendezvous
        run.progress("restart", f"stop rank {run.host.node_rank}")
        try:
            run.remote.call("stop", run.request())
        except HostFailure as f:
            return _start_failed(group, run, f, label, stopped, phase="stop", undoing=undoing)
        stopped.append(run)
    return None


def _start_failed(group: NodeGroup, run: HostRun, f: HostFailure, label: str, done: list[HostRun],
                  phase: str = "start", undoing: bool = False) -> list[HostResult]:
    """A rank that could not be stopped or started (`phase`), `done`: the ranks that were before it.
    The group's files are written (`undoing`: restored) on every rank; each other rank is told
    what happened to its own server."""
    own = cut_off(run, label, f, "rollback's restart" if undoing else "restart") if no_answer(f) else \
        run.result(False, Status.RESTART_FAILED, f.message, patch=label)
    files, rerun = (("restored", "rerun rollback") if undoing else
                    ("written", "rerun deploy-patch (or roll back)"))
    failed = f"the {phase} of {group.who(run)} failed"
    out = []
    for other in group.runs:
        if other is run:
            out.append(own)
            continue
        if phase == "start" and other in done:
            what = (f"started {'without' if undoing else 'on'} {label}, but node group {group.name} is not whole: "
                    f"{failed}")
        elif phase == "start" or other in done:
            what = f"stopped, not started again: {failed}; its restart is pending"
        else:
            what = f"not restarted: {failed}; it runs as before, its restart pending"
        out.append(other.result(False, Status.RESTART_FAILED,
                                f"{other.name}: {what}; the files are {files} on every rank: fix the cause, then "
                                f"{rerun}", patch=label))
    return out


# ----------------------------------------------------------------------- rollback

def _rolled_back_after(group: NodeGroup, failed: list[HostResult]) -> list[HostResult]:
    """--on-failure rollback: every rank restored and restarted without the patch, each failed
    rank's result keeping why it failed."""
    job = group.job
    for run in group.runs:
        run.progress("rollback", "node group " + group.name)
    label = failed[0].patch or job.patch.name
    rolled = _rollback_ranks(group, {job.patch.name: (job.patch, label)})
    return [fold_rollback(f, rb) for f, rb in zip(failed, rolled)]


def _rollback_ranks(group: NodeGroup, watched: dict, pending: bool = False) -> list[HostResult]:
    """Restore every rank's install from the patches of `watched` ({name: (patch, label)}, newest
    first), stop every rank, start every rank, and check that each came back without their
    markers. `pending`: they were restored already, by a rollback killed between the stops and the
    starts, and the restarts are what is left."""
    restored: list[str] = []
    for run in group.runs:
        problem = restore_install(run, list(watched), restored)
        if problem is not None:
            return [problem if o is run else o.result(False, Status.ERROR, f"{o.name}: node group {group.name}'s "
                                                                           f"rollback stopped at {group.who(run)}; "
                                                                           "a rerun of rollback finishes it")
                    for o in group.runs]
    if not restored and not pending:
        return [run.result(True, Status.OK, f"{run.name}: no patch recorded as applied; nothing to roll back")
                for run in group.runs]
    label = ", ".join(lab for _, lab in watched.values())
    patches = [p for p, _ in watched.values()]
    failed = _stop_all(group, label, undoing=True)
    if failed is not None:
        return failed
    started: list[HostRun] = []
    for run in group.runs:
        run.progress("restart", f"without {label}")
        try:
            run.remote.call("restart", protocol.RestartRequest(**run.request(), reason=f"rollback {label}"),
                            # rank 0's follow sends the smoke requests that judged_without waits for
                            ahead=follow_ahead(run.job, run.host, smoke=rollback_smoke(run.host, patches)))
        except HostFailure as f:
            return _start_failed(group, run, f, label, started, undoing=True)
        started.append(run)
    return group.each(lambda run: judged_without(
        run, protocol.AFTER_RESTART, list(watched.values()),
        f"{run.name}: {label} rolled back on every rank of node group {group.name}; restarted without the "
        "patch's markers"))


@group_step
def rollback_nodes(group: NodeGroup) -> list[HostResult]:
    """rollback of a node group: every rank restored, then all stopped, then all started."""
    job = group.job
    results: list[HostResult] = []
    try:
        with _locked(group, rollback_command(job)):
            replies, refused = _locked_probes(group, [], content=False)
            results = refused or _rollback_locked(group, replies)
    finally:
        results = _annotated(group, results) if results else results
    return results


def _rollback_locked(group: NodeGroup, replies: list) -> list[HostResult]:
    """What every rank records as applied (newest first), or, when an earlier rollback restored
    them all and was cut before the restarts, what it restored; rolled back inside rank 0's drain."""
    job = group.job
    ledgers = [reply.get("ledger") or {} for reply in replies]
    watched: dict = {}
    for run, ledger in zip(group.runs, ledgers):
        for n in ([wanted_name(job)] if wanted_name(job) else newest_first(ledger)):
            entry = (ledger.get("patches") or {}).get(n)
            if entry is not None and n not in watched:
                watched[n] = (deployed(job, run.host, [(n, entry)])[0].patch, entry["label"])
    pending = not watched
    for run, ledger in zip(group.runs, ledgers if pending else ()):
        for n, e in (ledger.get("rolled_back") or {}).items() if ledger.get("restart_pending") else ():
            watched.setdefault(n, (deployed(job, run.host, [(n, e)])[0].patch, e["label"]))
    if not watched:
        return [run.result(True, Status.OK, f"{run.name}: no patch recorded as applied; nothing to roll back")
                for run in group.runs]
    rolled: list[HostResult] = []

    def undo() -> HostResult:
        rolled[:] = _rollback_ranks(group, watched, pending)
        return _group_verdict(group, rolled)[0]   # a group that failed stays out of the router
    head = drain.around_restart(job, group.rank0.host, group.rank0.remote, undo)
    if not rolled:   # not drained: every rank as it was
        return group.untouched(group.rank0, head)
    return _group_verdict(group, [head] + rolled[1:])
