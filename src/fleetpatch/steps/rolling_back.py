"""rollback: restore a host's original files byte for byte, restart, and check
that the patch's markers are gone; and the rollback that follows a failed deploy."""
from __future__ import annotations

from .. import drain, protocol
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from . import execution, follow
from .context import HostRun, host_step, rollback_command, running_launch
from .follow import Watch
from .lock import HostLock
from .recorded import Deployed, deployed, wanted_name, with_notes
from .servers import rollback_servers
from .verify import cut_off, fold_rollback, newest_first, no_answer


@host_step
def rollback(run: HostRun) -> HostResult:
    job = run.job
    with HostLock(run.remote, run.host, job, rollback_command(job)) as lock:
        run.lock = lock
        run.progress("fetch", "lock + read ledger")
        reply = lock.probe([], content=False)
        run.version = reply.get("version")
        ledger = reply.get("ledger") or {}
        names = [wanted_name(job)] if wanted_name(job) else newest_first(ledger)
        if not names and ledger.get("restart_pending") and ledger.get("rolled_back"):
            # an earlier rollback restored the files (or the next run finished it for a
            # killed one) but the server still runs the patched code: restart and check it
            return lock.annotate(_pending_rollback_restart(run, reply))
        if not names:
            return run.result(True, Status.OK, f"{run.name}: no patch recorded as applied; nothing to roll back")
        # Every patch's markers are needed for the checks: refuse before the first restore, not between two.
        entries = ledger.get("patches", {})
        found = {d.name: d for d in deployed(job, run.host, [(n, entries[n]) for n in names if n in entries])}
        if run.host.servers:   # the install restored once, then each server restarted on its own
            result = rollback_servers(run, names, {n: d.patch for n, d in found.items()})
            return with_notes(lock.annotate(result), list(found.values()))

        def undo_all() -> HostResult:
            result = None
            for i, name in enumerate(names):
                result = _rollback_locked(run, reply, name, last=i == len(names) - 1, found=found.get(name))
                if not result.ok:
                    break
            return result
        result = drain.around_restart(job, run.host, run.remote, undo_all)
    return with_notes(lock.annotate(result), list(found.values()))


def _pending_rollback_restart(run: HostRun, reply: protocol.ProbeReply) -> HostResult:
    rolled = reply["ledger"]["rolled_back"]
    name = max(rolled, key=lambda n: rolled[n].get("at", ""))
    label = rolled[name]["label"]
    run.progress("restart", f"pending restart after rolling back {label}")
    out = run.remote.call("restart", protocol.RestartRequest(**run.request(),
                                                             reason=f"pending restart after rollback {label}"))
    found = deployed(run.job, run.host, [(name, rolled[name])])
    watch = Watch(protocol.log_window(out["restart"]), running_launch(run.host, {}), [found[0].patch], [label],
                  want_markers=False)
    verdicts, timings = follow.follow_and_judge(run, watch)
    result = with_notes(follow.verdict_result(run, verdicts, [label], timings), found)
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = (f"{run.name}: {label} was rolled back with its restart pending; restarted, the server "
                          "runs without the patch's markers")
    return result


def _rollback_locked(run: HostRun, reply: protocol.ProbeReply, name: str, last: bool,
                     found: Deployed | None = None) -> HostResult:
    entry = (reply.get("ledger") or {}).get("patches", {}).get(name)
    if entry is None:
        return run.result(False, Status.ERROR, f"{run.name}: {name} is not recorded as applied on this host; "
                                               "`fleetpatch status` shows what is")
    # The patch's markers are what the check after the restore looks for: have them before anything changes.
    patch = (found or deployed(run.job, run.host, [(name, entry)])[0]).patch
    label = entry["label"]
    run.progress("rollback", label)
    request = protocol.RollbackRequest(**run.request(), package_dir=reply["package_dir"], name=name,
                                       force=run.job.force)
    probing = execution.probe_wanted(run.job, run.host, None)
    if probing:   # it watches the imports only: what files the restored server loads
        request["probe"] = execution.probe_request(run.host, run.profile, label, reply["package_dir"],
                                                   {p: [] for p in entry["files"]}, run.job.token)
    try:
        out = run.remote.call("rollback", request, ahead=follow.follow_ahead(run.job, run.host, probing))
    except HostFailure as f:   # a cut or stalled channel: say which patch and what the host may be in
        if not no_answer(f):
            raise
        return cut_off(run, label, f, "rollback (restore and restart)")
    restored = {p: (rec or {}).get("sha256") for p, rec in out["files"].items()}
    bad = [p for p, rec in entry["files"].items() if restored.get(p) != rec["before"]]
    if bad:
        return run.result(False, Status.ERROR, f"{run.name}: after restoring, {', '.join(bad)} do not match the "
                                               "recorded original sha256", files=restored)
    if "restart" not in out:  # every file already held its original: nothing ran the patch, no restart
        return run.result(True, Status.ROLLED_BACK, f"{run.name}: {label} forgotten: its files already held their "
                                                    "original sha256; not restarted", files=restored)
    watch = Watch(protocol.AFTER_RESTART, running_launch(run.host, {}), [patch], [label], want_markers=False,
                  ends_work=lambda ok: last or not ok,
                  execution=execution.ExecutionView(out.get("probe")) if probing else None)
    try:
        verdicts, timings = follow.follow_and_judge(run, watch)
    except HostFailure as f:
        if not no_answer(f):
            raise
        return cut_off(run, label, f, "rollback's verification")
    result = follow.verdict_result(run, verdicts, [label], timings)
    result.files = restored
    if result.ok:
        result.status = Status.ROLLED_BACK
        imports = [line for line in result.message.splitlines() if line.lstrip().startswith(
            ("the restarted server", "note: the restarted server"))]   # what the probe saw it load
        result.message = "\n".join([f"{run.name}: {label} rolled back; {len(restored)} files restored to their "
                                     f"original sha256; server back without the patch's markers"] + imports)
    return result


def rollback_after_failure(run: HostRun, failed: HostResult) -> HostResult:
    """Undo a host whose deploy failed, under the same lock (--on-failure rollback)."""
    run.progress("rollback", failed.status)
    try:
        reply = run.lock.probe([], content=False)
        rb = _rollback_locked(run, reply, run.job.patch.name, last=True)
    except HostFailure as f:
        failed.message += f"\n  rollback FAILED: {f.message}"
        failed.details["rollback"] = {"status": f.status, "message": f.message}
        return failed
    return fold_rollback(failed, rb)
