"""rollback: restore a host's original files byte for byte, restart, and check
that the patch's markers are gone; and the rollback that follows a failed deploy."""
from __future__ import annotations

from dataclasses import dataclass

from .. import drain, protocol
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from . import execution, follow
from .context import HostRun, host_step, rollback_command, running_launch, session_env
from .follow import Watch
from .lock import HostLock
from .plan import restart_predictions
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
        if job.interrupt.is_set() and (names or ledger.get("restart_pending")):
            # Ctrl-C while the ledger was read: nothing is restored or restarted
            return lock.annotate(run.result(False, Status.INTERRUPTED, f"{run.name}: interrupted "
                                            f"({job.interrupt.cause}) before anything was restored; untouched, "
                                            "not restarted"))
        refused = (names or ledger.get("restart_pending")) and restart_refusal(run, reply)
        if refused:
            return lock.annotate(refused)
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
            # Each restart of a GPU server is a model load: every patch but the last is restored
            # without one, and the last one's restart (and its check) covers them all.
            undone: list[Undone] = []
            for name in names[:-1]:
                failed = _restore_only(run, reply, name, found.get(name), undone)
                if failed is not None:
                    if undone:
                        failed.message += (f"\n  restored before it: {', '.join(u.label for u in undone)}; the "
                                           "server's restart is pending: rerun rollback to finish")
                    return failed
            return _rollback_locked(run, reply, names[-1], found=found.get(names[-1]), undone=undone)
        result = drain.around_restart(job, run.host, run.remote, undo_all)
    return with_notes(lock.annotate(result), list(found.values()))


def restart_refusal(run: HostRun, reply: protocol.ProbeReply) -> HostResult | None:
    """The host refused, untouched, where the server runs but a `command` restart (the inventory's
    start and env) would not start it: a typo in hosts.yaml would take a running server down.
    None where the restart may go ahead (--force, another restart kind, a server not running). On
    a host of several servers, each one's settings (the first one's process is the one read)."""
    host = run.host
    launch = running_launch(host, reply)
    if run.job.force or launch.source != "process":
        return None
    version = reply.get("version")
    if not run.profile.predict(version, launch).starts:
        return None
    for view, planned in restart_predictions(host, run.profile, version, session_env(reply)):
        if planned.starts:
            continue
        which = f"server {view.server_name}: " if host.servers else ""
        return run.result(False, Status.ERROR, (
            f"FAIL {run.name}  rollback refused: {which}the inventory's start and env would not start the server: "
            f"{planned.error}\n    cause: {planned.cause}\n  nothing was restored or restarted; the running server, "
            "started otherwise, keeps running: fix server.restart in hosts.yaml, or rerun with --force"))
    return None


def _pending_rollback_restart(run: HostRun, reply: protocol.ProbeReply) -> HostResult:
    rolled = reply["ledger"]["rolled_back"]
    name = max(rolled, key=lambda n: rolled[n].get("at", ""))
    label = rolled[name]["label"]
    run.progress("restart", f"pending restart after rolling back {label}")
    out = run.remote.call("restart", protocol.RestartRequest(**run.request(),
                                                             reason=f"pending restart after rollback {label}"))
    found = deployed(run.job, run.host, [(name, rolled[name])])
    watch = Watch(protocol.log_window(out["restart"]), running_launch(run.host, {}), [found[0].patch], [label],
                  want_markers=False, smoke=follow.rollback_smoke(run.host, [found[0].patch]))
    verdicts, timings = follow.follow_and_judge(run, watch)
    result = with_notes(follow.verdict_result(run, verdicts, [label], timings), found)
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = "\n".join([f"{run.name}: {label} was rolled back with its restart pending; restarted, the "
                                    "server runs without the patch's markers"] + follow.smoke_note(timings))
    return result


@dataclass
class Undone:
    """A patch restored by this rollback: its markers, label and restored files, checked at the restart."""
    patch: object
    label: str
    files: dict


def _entry_of(run: HostRun, reply: protocol.ProbeReply, name: str, found: Deployed | None):
    """The ledger entry of `name` and its patch (whose markers the check after the restore looks
    for: had before anything changes); (None, the host's failed result) when it is not recorded."""
    entry = (reply.get("ledger") or {}).get("patches", {}).get(name)
    if entry is None:
        return None, run.result(False, Status.ERROR, f"{run.name}: {name} is not recorded as applied on this host; "
                                                     "`fleetpatch status` shows what is")
    return entry, (found or deployed(run.job, run.host, [(name, entry)])[0]).patch


def _restore_only(run: HostRun, reply: protocol.ProbeReply, name: str, found: Deployed | None,
                  undone: list[Undone]) -> HostResult | None:
    """Restore one patch of several without a restart (the last one's restart follows); it joins
    `undone`. None when done; else the host's failed result, its restart left pending."""
    entry, patch = _entry_of(run, reply, name, found)
    if entry is None:
        return patch
    run.progress("rollback", entry["label"])
    request = protocol.RollbackRequest(**run.request(), package_dir=reply["package_dir"], name=name,
                                       force=run.job.force)
    request["restart"] = None
    try:
        out = run.remote.call("rollback", request)
    except HostFailure as f:
        if not no_answer(f):
            raise
        return cut_off(run, entry["label"], f, "rollback (restore)")
    restored = {p: (rec or {}).get("sha256") for p, rec in out["files"].items()}
    bad = [p for p, rec in entry["files"].items() if restored.get(p) != rec["before"]]
    if bad:
        return run.result(False, Status.ERROR, f"{run.name}: after restoring, {', '.join(bad)} do not match the "
                                               "recorded original sha256", files=restored)
    undone.append(Undone(patch, entry["label"], restored))
    return None


def _rollback_locked(run: HostRun, reply: protocol.ProbeReply, name: str, found: Deployed | None = None,
                     undone: list[Undone] | None = None) -> HostResult:
    """Restore `name` and restart once, then check that neither its markers nor those of the
    patches `undone` before it (restored without a restart) are in the log."""
    entry, patch = _entry_of(run, reply, name, found)
    if entry is None:
        return patch
    label = entry["label"]
    run.progress("rollback", label)
    request = protocol.RollbackRequest(**run.request(), package_dir=reply["package_dir"], name=name,
                                       force=run.job.force)
    probing = execution.probe_wanted(run.job, run.host, None)
    earlier = list(undone or [])
    labels = [u.label for u in earlier] + [label]
    if probing:   # it watches the imports only: what files the restored server loads (and the patches left)
        left = {k: v for k, v in execution.stacked_added(reply.get("ledger") or {}, name).items() if k not in labels}
        request["probe"] = execution.probe_request(run.host, run.profile, ", ".join(labels), reply["package_dir"],
                                                   {p: [] for u in earlier for p in u.files} |
                                                   {p: [] for p in entry["files"]}, run.job.token, left,
                                                   reply.get("version"))
    # the smoke requests the deploy sent (patch.yaml's prove), so a rolled-back server is proven to
    # answer requests too (smoke-failed otherwise); no added line is wanted from them
    smoke = follow.rollback_smoke(run.host, [patch])
    try:
        out = run.remote.call("rollback", request, ahead=follow.follow_ahead(run.job, run.host, probing, smoke))
    except HostFailure as f:   # a cut or stalled channel: say which patch and what the host may be in
        if not no_answer(f):
            raise
        return cut_off(run, ", ".join(labels), f, "rollback (restore and restart)")
    restored = {p: (rec or {}).get("sha256") for p, rec in out["files"].items()}
    bad = [p for p, rec in entry["files"].items() if restored.get(p) != rec["before"]]
    restored = {p: h for u in earlier for p, h in u.files.items()} | restored
    if bad:
        return run.result(False, Status.ERROR, f"{run.name}: after restoring, {', '.join(bad)} do not match the "
                                               "recorded original sha256", files=restored)
    if "restart" not in out:  # every file already held its original: nothing ran the patch, no restart
        return run.result(True, Status.ROLLED_BACK, f"{run.name}: {label} forgotten: its files already held their "
                                                    "original sha256; not restarted", files=restored)
    watch = Watch(protocol.AFTER_RESTART, running_launch(run.host, {}), [u.patch for u in earlier] + [patch], labels,
                  want_markers=False, execution=execution.ExecutionView(out.get("probe")) if probing else None,
                  smoke=smoke)
    try:
        verdicts, timings = follow.follow_and_judge(run, watch)
    except HostFailure as f:
        if not no_answer(f):
            raise
        return cut_off(run, ", ".join(labels), f, "rollback's verification")
    result = follow.verdict_result(run, verdicts, labels, timings)
    result.files = restored
    if result.ok:
        result.status = Status.ROLLED_BACK
        imports = [line for line in result.message.splitlines() if line.lstrip().startswith(
            ("the restarted server", "note: the restarted server"))]   # what the probe saw it load
        result.message = "\n".join([f"{run.name}: {', '.join(labels)} rolled back; {len(restored)} files restored to "
                                     f"their original sha256; server restarted once, back without the patches' "
                                     "markers" if earlier else
                                     f"{run.name}: {label} rolled back; {len(restored)} files restored to their "
                                     f"original sha256; server back without the patch's markers"] + imports
                                   + follow.smoke_note(timings))
    return result


def rollback_after_failure(run: HostRun, failed: HostResult) -> HostResult:
    """Undo a host whose deploy failed, under the same lock (--on-failure rollback)."""
    run.progress("rollback", failed.status)
    try:
        reply = run.lock.probe([], content=False)
        rb = _rollback_locked(run, reply, run.job.patch.name)
    except HostFailure as f:
        failed.message += f"\n  rollback FAILED: {f.message}"
        failed.details["rollback"] = {"status": f.status, "message": f.message}
        return failed
    return fold_rollback(failed, rb)
