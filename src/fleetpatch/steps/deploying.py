"""deploy: per host lock, plan, apply, back up, write, restart (inside the drain
when a router is in front of the host), and verify that the patched path ran."""
from __future__ import annotations

from .. import drain, protocol
from ..errors import Status
from ..hostcalls import HostResult
from . import execution, servers
from .context import HostRun, deploy_command, host_step, sha256
from .lock import HostLock
from .plan import (Plan, can_prove, clash_message, describe_states, file_bytes, make_plan, packed, restart_switched,
                   revision_files, unprovable_message)
from .restarting import Restart, restart_and_verify, restart_reason
from .rolling_back import rollback_after_failure
from .verify import verify_again


@host_step
def deploy(run: HostRun) -> HostResult:
    with HostLock(run.remote, run.host, run.job, deploy_command(run.job)) as lock:
        run.lock = lock
        run.progress("fetch", "lock + read files")
        reply = lock.probe(revision_files(run.job), content=True)
        result = _deploy_locked(run, reply)
        if reply.get("timings"):   # the agent's start and the pre-flight read, as the host timed them
            result.details["probe_timings"] = reply["timings"]
    return lock.annotate(result)


def refusal(run: HostRun, plan: Plan) -> HostResult | None:
    """Why this host's files are left untouched, if they are."""
    name, label = run.name, plan.label
    if plan.clashes:   # not a hand edit: another fleetpatch patch holds the files
        return run.result(False, Status.CONFLICT,
                          clash_message(name, label, plan.clashes, run.job.inventory_arg,
                                        "refused, left untouched and not restarted: ")
                          + f"\n{describe_states(plan)}", patch=label)
    if plan.misfits:   # not a hand edit: the patch was made for another layout of the package
        return run.result(False, Status.CONFLICT,
                          f"{name}: refused, left untouched and not restarted: {label} does not fit this "
                          f"host's package\n{describe_states(plan)}\n  check that the patch's engine_versions admit "
                          "only versions with these files", patch=label)
    if plan.conflicts or (not plan.already and len(plan.changes) != len(plan.states)):
        return run.result(False, Status.DRIFT,
                          f"{name}: refused, left untouched and not restarted: the files match neither "
                          f"{label}'s pre-image nor its post-image\n{describe_states(plan)}\n"
                          "  inspect the hand edits (fleetpatch fetch), restore the originals, then rerun",
                          patch=label)
    proof = can_prove(run, plan)
    if not proof.ok and not plan.already:
        # Not overridden by --force: a file is never changed without a way to prove the result.
        return run.result(False, Status.ERROR, unprovable_message(run, plan, proof, "refused"), patch=label,
                          details={"refused": "unprovable"})
    if plan.preflight is not None and not run.job.force:
        return run.result(False, Status.NOT_EXECUTED, plan.preflight.message, patch=label,
                          executed_path=plan.preflight.executed_path)
    return None


def interrupted_before_writing(run: HostRun, label: str | None) -> HostResult | None:
    """A host whose Ctrl-C came while it was read and planned: it writes and restarts nothing.
    (Once the write is sent, the host finishes it, and its restart and verification.)"""
    if not run.job.interrupt.is_set():
        return None
    return run.result(False, Status.INTERRUPTED, f"{run.name}: interrupted ({run.job.interrupt.cause}) before "
                                                 "anything was written; untouched, not restarted", patch=label)


def _deploy_locked(run: HostRun, reply: protocol.ProbeReply) -> HostResult:
    job = run.job
    run.progress("pre-flight")
    plan, revision = make_plan(job, run.host, reply)
    run.version = plan.version
    refused = refusal(run, plan) or interrupted_before_writing(run, plan.label)
    if refused is not None:
        return refused
    probe = probe_spec(run, plan, revision, reply)
    if plan.already and run.host.servers and not job.no_restart:
        return servers.deploy_each(run, plan, probe, applied=False)
    if plan.already:
        return already_applied(run, plan, reply, probe)
    run.progress("apply", f"{len(plan.changes)} file{'' if len(plan.changes) == 1 else 's'}")
    apply_req = apply_request(run, plan, reply, revision)
    if probe is not None:
        apply_req["probe"] = probe
    if run.host.servers and not job.no_restart:
        # every server's restart is now pending; the probe goes in with each server's restart, not here
        run.remote.call("apply", {k: v for k, v in apply_req.items() if k != "probe"} | {"restart": None})
        return servers.deploy_each(run, plan, probe, applied=True)
    if job.no_restart:
        lock = run.lock
        lock.chained_done(run.remote.call("apply", dict(apply_req, restart=None, then=lock.release_followup())))
        return run.result(True, Status.APPLIED,
                          f"{run.name}: {plan.label} applied; restart pending (--no-restart): the next deploy or "
                          "`fleetpatch verify-logs` after a restart proves it", patch=plan.label)
    return with_switch_note(run, plan, reply, restart_and_verify(run, plan, Restart("apply", apply_req, ""),
                                                                 undo_step(run)))


def with_switch_note(run: HostRun, plan: Plan, reply: protocol.ProbeReply, result: HostResult) -> HostResult:
    """The result of a deploy's restart, with a note where that restart moved the server to another
    path than it ran (the inventory's start and env lead elsewhere); a failed restart moved nothing."""
    switched = restart_switched(run.host, run.profile, plan.version, reply, result.executed_path) if result.ok else None
    if switched:
        result.details.setdefault("notes", []).append(switched)
    return result


def apply_request(run: HostRun, plan: Plan, reply: protocol.ProbeReply, revision) -> protocol.ApplyRequest:
    """The request that writes the revision's files on the host and records the patch there."""
    job = run.job
    return protocol.ApplyRequest(**run.request(), package_dir=reply["package_dir"], name=job.patch.name,
                                 rev=revision.rev, label=plan.label, diff_sha256=revision.diff_sha256,
                                 files=apply_files(reply, plan), record=deploy_record(job, revision, plan, reply))


def deploy_record(job, revision, plan: Plan, reply: protocol.ProbeReply | None = None) -> protocol.PatchRecord:
    """What the host keeps of the patch, so verify-logs and rollback work from any laptop:
    the manifest, the revision, and its added lines where this host's files put them; with
    the lines of the patches below it as this one's files number them (`stacked`)."""
    from ..patchrecord import record_of
    from ..probe.verdict import added_lines
    offsets = {r.path: list(r.offsets or []) for r in plan.changes}
    record = record_of(job.patch, revision, added_lines(revision.diff_text, offsets))
    stacked = execution.stacked_added((reply or {}).get("ledger") or {}, job.patch.name, revision, plan.states)
    if stacked:
        record["stacked"] = stacked
    return record


def probe_spec(run: HostRun, plan: Plan, revision, reply: protocol.ProbeReply) -> dict | None:
    """What the probe watches in this host's restart (None: it is off for this host)."""
    if not execution.probe_wanted(run.job, run.host, run.job.patch):
        return None
    added = execution.added_of(revision, plan.states)
    stacked = execution.stacked_added(reply.get("ledger") or {}, run.job.patch.name,
                                      None if plan.already else revision, plan.states)
    probe = execution.probe_request(run.host, run.profile, plan.label, reply["package_dir"], added, run.job.token,
                                    stacked, reply.get("version"))
    return execution.with_splice_hints(probe, {r.path: r.new for r in plan.changes if r.new}, run.job.splice_hints)


def apply_files(reply: protocol.ProbeReply, plan: Plan) -> list[protocol.ApplyFile]:
    """The apply request's files: what each must hold now (sha256; None: absent) and after."""
    files = []
    for r in plan.changes:
        if r.state == "creates":
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_CREATE, before=None, after=sha256(r.new),
                                            content=packed(r.new)))
        elif r.state == "deletes":
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_DELETE,
                                            before=sha256(file_bytes(reply, r.path)), after=None))
        else:
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_MODIFY,
                                            before=sha256(file_bytes(reply, r.path)), after=sha256(r.new),
                                            content=packed(r.new)))
    return files


def already_applied(run: HostRun, plan: Plan, reply: protocol.ProbeReply, probe: dict | None) -> HostResult:
    job = run.job
    ledger, server = reply.get("ledger") or {}, reply.get("server") or {}
    reason = restart_reason(ledger, server, job.patch.name)
    if reason and not job.no_restart:
        request = protocol.RestartRequest(**run.request(), reason=f"{reason}: restart for {plan.label}")
        if probe is not None:
            request["probe"] = probe
        return with_switch_note(run, plan, reply, restart_and_verify(run, plan, Restart("restart", request, reason),
                                                                     undo_step(run)))
    # Nothing to write: prove it still runs from the window of the last restart.
    last = ledger.get("last_restart")
    if job.no_restart or not last:
        return run.result(True, Status.ALREADY_APPLIED, f"{run.name}: {plan.label} already applied; nothing changed",
                          patch=plan.label)
    return drain.back_if_left_out(job, run.host, run.remote, verify_again(run, plan.label, reply, plan.launch))


def undo_step(run: HostRun):
    """What undoes this host if its deploy fails: the rollback under the same lock with
    --on-failure rollback, else nothing."""
    return (lambda failed: rollback_after_failure(run, failed)) if run.job.on_failure == "rollback" else None
