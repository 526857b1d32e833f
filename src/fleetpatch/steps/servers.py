"""A host with several servers on one install (`servers:` in the inventory).

The install is patched or rolled back once. Then each server, one after the other,
is drained, restarted and judged on its own: its log since its own restart, its
path, its markers and its probe records. One at a time, so that the host keeps
serving throughout and a rollout's batch takes out at most one server per host.
A server that fails does not stop the others (they are restarted and judged too);
with `--on-failure rollback` the install is rolled back and every server that
was restarted on the patch is restarted again without it. The host's result is
its worst server's, with each server's result under `details["servers"]`."""
from __future__ import annotations

import time
from typing import Callable

from .. import drain, protocol
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from . import follow
from .context import HostRun, probe, running_launch, server_runs
from .follow import Watch
from .restarting import Restart, restart_and_verify_now, restart_reason, smoke_expect
from .verify import combine, cut_off, fold_rollback, no_answer, verify_again


def deploy_each(run: HostRun, plan, probe_spec: dict | None, applied: bool) -> HostResult:
    """Restart and verify each server: all of them after the install was written (`applied`); with
    nothing written, those whose own ledger slot or process says so, the others judged again from
    their last restart's window."""
    results: list[tuple[str, HostResult]] = []
    for srun in server_runs(run):
        started = time.monotonic()
        reason, reply = "apply", None
        if not applied:   # this server's ledger slot and process: one read serves both uses
            reply = probe(srun.remote, srun.host, srun.job, [], content=False)
            reason = restart_reason(reply.get("ledger") or {}, reply.get("server") or {}, run.job.patch.name)
        if reason is None:
            result = _verify_last(srun, plan, reply)
        else:
            request = protocol.RestartRequest(**srun.request(), reason=f"{reason}: restart for {plan.label}")
            if probe_spec is not None:
                request["probe"] = probe_spec
            restart = Restart("restart", request, reason)
            result = around_restart_of(srun, lambda: restart_and_verify_now(srun, plan, restart, None), plan.label,
                                       expect=smoke_expect(srun))
        result.duration_s = time.monotonic() - started   # this server's part of the host's run
        results.append((srun.host.server_name, result))
        if not result.ok and run.job.on_failure == "rollback":
            # Written now: the servers restarted so far run the patch, the others never did. Written
            # by an earlier run: every server runs it, judged again or not.
            restarted = [n for n, r in results if r.details.get("restarted", True)] if applied else None
            return rollback_after_failure(run, combine(run, results, plan.label), restarted)
    return combine(run, results, plan.label)


def _verify_last(srun: HostRun, plan, reply: dict) -> HostResult:
    """Nothing to write and no restart due: this server's last restart's window, judged again."""
    last = (reply.get("ledger") or {}).get("last_restart")
    if not last:
        return srun.result(True, Status.ALREADY_APPLIED, f"{srun.name}: {plan.label} already applied; nothing "
                                                         "changed", patch=plan.label, details={"restarted": False})
    result = drain.back_if_left_out(srun.job, srun.host, srun.remote,
                                    verify_again(srun, plan.label, reply, running_launch(srun.host, reply)))
    result.details["restarted"] = False
    return result


def around_restart_of(srun: HostRun, restart: Callable[[], HostResult], label: str, rolling_back: bool = False,
                      **drain_kw) -> HostResult:
    """One server's `restart()` inside its drain. The install was changed before: a router step that
    fails before this server's restart (its take-out refused, its removal or drain failed) leaves
    it running the code from before that change, its restart pending. That is this server's
    result, not the host's "not touched", and the host's other servers are still handled."""
    started = []

    def restart_once() -> HostResult:
        started.append(True)
        return restart()
    try:
        result = drain.around_restart(srun.job, srun.host, srun.remote, restart_once, **drain_kw)
    except HostFailure as f:
        if started:
            raise
        result = srun.result(False, f.status, f.message, patch=label, reason=f.reason)
    return result if started else not_restarted(srun, result, label, rolling_back)


def not_restarted(srun: HostRun, result: HostResult, label: str, rolling_back: bool) -> HostResult:
    """A server whose router step failed before its restart, said as what it is: the drain's
    `reason` (what failed), not its message's "the host was not touched", which is no longer so."""
    why = result.reason if result.reason is not None else result.message
    name = srun.host.server_name
    state = (f"the install is restored from {label}, but {name} was not restarted onto its originals: its "
             "restart is still to do; fix the cause, then rerun rollback") if rolling_back else (
        f"the install is written ({label}), but {name} was not restarted onto it: its restart is still to do; "
        "fix the cause, then rerun deploy-patch (or roll back)")
    result.ok = False
    step = "" if result.status == Status.INTERRUPTED else "its router step failed: "
    result.message = f"{srun.name}: server {name} not restarted: {step}{why}\n  {state}"
    result.details["restarted"] = False
    return result


def rollback_after_failure(run: HostRun, failed: HostResult, restarted: list[str] | None) -> HostResult:
    """--on-failure rollback: the install back to its originals, and each server that runs the
    patch (`restarted`; None: all) restarted again without it."""
    run.progress("rollback", failed.status)
    rb = rollback_servers(run, [run.job.patch.name], {run.job.patch.name: run.job.patch}, restarted)
    return fold_rollback(failed, rb)


def rollback_servers(run: HostRun, names: list[str], patches: dict, restart: list[str] | None = None) -> HostResult:
    """Restore the install from each patch of `names` (newest first), then restart each server of
    `restart` (None: all) and check that the patches' markers are gone from its log."""
    labels: list[str] = []
    problem = restore_install(run, names, labels, restart)
    if problem is not None:
        return problem
    if not labels:
        return run.result(True, Status.OK, f"{run.name}: no patch recorded as applied; nothing to roll back")
    results = []
    for srun in server_runs(run):
        if restart is not None and srun.host.server_name not in restart:
            continue
        started = time.monotonic()
        result = around_restart_of(srun, lambda srun=srun: _restart_without(srun, names, patches, labels),
                                   ", ".join(labels), rolling_back=True)
        result.duration_s = time.monotonic() - started
        results.append((srun.host.server_name, result))
    if not results:
        return run.result(True, Status.ROLLED_BACK, f"{run.name}: {', '.join(labels)} rolled back; files restored to "
                                                    "their original sha256; no server ran the patch: none restarted")
    result = combine(run, results, ", ".join(labels))
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = (f"{run.name}: {', '.join(labels)} rolled back; files restored to their original sha256; "
                          f"{len(results)} servers restarted without the patch's markers\n"
                          + result.message.split("\n", 1)[1])
    return result


def restore_install(run: HostRun, names: list[str], labels: list[str], servers: list[str] | None = None,
                    pending_after: bool | None = None) -> HostResult | None:
    """Restore the install from each patch of `names` (newest first) without a restart (the
    restarts follow, server by server or rank by rank); each restored patch's label joins `labels`.
    None when done; else the host's failed result. `servers`: those left with a restart pending.
    `pending_after`: the server never ran what is undone (a write undone before its restart), so
    its restart is pending only as it was before that write."""
    try:
        reply = run.lock.probe([], content=False)
        entries = (reply.get("ledger") or {}).get("patches", {})
        for name in names:
            entry = entries.get(name)
            if entry is None:
                continue
            request = protocol.RollbackRequest(**run.request(), package_dir=reply["package_dir"], name=name,
                                               force=run.job.force)
            request["restart"] = None
            if servers is not None:
                request["servers_pending"] = servers
            if pending_after is not None:
                request["restart_pending"] = pending_after
            out = run.remote.call("rollback", request)
            bad = [p for p, rec in entry["files"].items()
                   if ((out.get("files") or {}).get(p) or {}).get("sha256") != rec["before"]]
            if bad:
                return run.result(False, Status.ERROR, f"{run.name}: after restoring, {', '.join(bad)} do not match "
                                                       "the recorded original sha256")
            labels.append(entry["label"])
    except HostFailure as f:
        if not no_answer(f):
            return run.result(False, f.status, f.message)
        return cut_off(run, ", ".join(names), f, "rollback (restore)")
    return None


def _restart_without(srun: HostRun, names: list[str], patches: dict, labels: list[str]) -> HostResult:
    label = ", ".join(labels)
    srun.progress("restart", f"without {label}")
    try:
        out = srun.remote.call("restart", protocol.RestartRequest(**srun.request(), reason=f"rollback {label}"))
    except HostFailure as f:
        if not no_answer(f):
            return srun.result(False, f.status, f.message, patch=label)
        return cut_off(srun, label, f, "rollback's restart")
    return judged_without(srun, protocol.log_window(out["restart"]),
                          [(patches[n], lab) for n, lab in zip(names, labels) if patches.get(n) is not None],
                          f"{srun.name}: restarted without {label}'s markers")


def judged_without(run: HostRun, start: dict, watched: list, said: str) -> HostResult:
    """A server restarted after a rollback, judged from `start`: ready, and none of the markers of
    the (patch, label) pairs `watched` in its log; `said` is its message when it passes."""
    labels = [lab for _, lab in watched]
    patches = [p for p, _ in watched]
    watch = Watch(start, running_launch(run.host, {}), patches, labels, want_markers=False,
                  smoke=follow.rollback_smoke(run.host, patches))
    try:
        verdicts, timings = follow.follow_and_judge(run, watch)
    except HostFailure as f:
        if not no_answer(f):
            return run.result(False, f.status, f.message, patch=", ".join(labels))
        return cut_off(run, ", ".join(labels), f, "rollback's verification")
    result = follow.verdict_result(run, verdicts, labels, timings)
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = "\n".join([said] + follow.smoke_note(timings))
    return result
