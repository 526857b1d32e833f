"""Verification: the follow judged into the host's result, verify-logs, what a
result says when the host's answer never came, and the shaping of results that
every step shares: a host's servers combined into one result, a failed result
with the rollback that undid it, and the order stacked patches are undone in."""
from __future__ import annotations

from .. import protocol
from ..errors import HostFailure, NoAnswer, Status
from ..hostcalls import HostResult, patch_lost_message
from . import execution, follow
from .context import HostRun, host_step, probe, running_launch, server_runs
from .follow import Watch
from .recorded import deployed, wanted_name, with_notes


def verify(run: HostRun, watch: Watch, already: bool = False) -> HostResult:
    """Follow and judge the markers; `already`: nothing was written (re-read the last restart's window)."""
    run.progress("verify", waiting_for(watch))
    verdicts, timings = follow.follow_and_judge(run, watch)
    result = follow.verdict_result(run, verdicts, watch.labels, timings)
    if already and result.ok:
        result.status = Status.ALREADY_APPLIED
        result.message = f"{run.name}: {watch.labels[0]} already applied; nothing changed; still verified\n" + \
            result.message
    return result


def waiting_for(watch: Watch) -> str:
    """What the first progress line of a verification names: a patch without markers is proved by
    the probe's record of an added line (patch.yaml may leave markers out)."""
    if any(getattr(p, "markers", None) for p in watch.patches):
        return "waiting for markers"
    return "waiting for an added line to run"


def verify_again(run: HostRun, label: str, reply: protocol.ProbeReply, launch) -> HostResult:
    """Nothing to write and no restart due: the window of the last restart (the ledger of
    `reply`) judged again, for the host or for one of its servers."""
    job = run.job
    ledger, server = reply.get("ledger") or {}, reply.get("server") or {}
    last = ledger.get("last_restart") or {}
    verification = last_verified(run, ledger, label)
    if reply.get("window_intact") is False and verification is not None and server.get("pid") == last.get("pid"):
        # The log since that restart was rotated, truncated or deleted away: re-reading it
        # would wait for lines that are gone. The process fleetpatch verified still runs.
        return run.result(True, Status.ALREADY_APPLIED,
                          f"{run.name}: {label} already applied; nothing changed; the server fleetpatch verified "
                          f"at {verification.get('at')} (pid {last.get('pid')}, "
                          f"{verification.get('executed_path') or 'its path'}) still runs; its log since that restart "
                          "is no longer there to re-read", patch=label, executed_path=verification.get("executed_path"))
    view = execution.ExecutionView() if execution.probe_wanted(job, run.host, job.patch) else None
    # No verdict was ever recorded after that restart: the run that made it died first (the one
    # --break-lock finishes), maybe before its smoke requests, which prove a line that runs per
    # request. They go out now, as after a restart.
    smoke = follow.smoke_spec(run.host, job.patch) if not last.get("verdict_epoch") else None
    return verify(run, Watch(protocol.log_window(last), launch, [job.patch], [label], execution=view, smoke=smoke,
                             smoke_wait=follow.prove_wait(job.patch) if smoke else 0.0), already=True)


def last_verified(run: HostRun, ledger: protocol.Ledger, label: str) -> dict | None:
    """The verification that passed at the last restart of this host (or of this server), if it did."""
    if run.host.server_name:   # the patch's own verification is whichever server recorded last
        own = ledger.get("last_verification") or {}
        passed = own.get("status") == Status.VERIFIED and label in (own.get("labels") or [])
        return {"at": own.get("at")} if passed else None
    verification = (ledger.get("patches", {}).get(run.job.patch.name) or {}).get("verification") or {}
    return verification if verification.get("status") == Status.VERIFIED else None


def no_answer(f: HostFailure) -> bool:
    """The host's answer never came: the connection (or the agent) died or stalled."""
    return f.cause is not None


def cut_off(run: HostRun, label: str, f: HostFailure, phase: str) -> HostResult:
    """A failure of the call that writes, restarts or verifies, with what the host was
    being asked to do. When no answer came, say what that means for the host."""
    message = f.message
    undoing = phase.startswith("rollback")
    if no_answer(f):
        detail = f.message.removeprefix(run.name + ": ")
        if f.cause in (NoAnswer.CHANNEL_CLOSED, NoAnswer.AGENT_EXITED):   # nothing more to say than why it ended
            detail = "the session ended before the agent's reply" + (
                "" if detail.endswith("no output") else ": " + detail.split("without an answer: ", 1)[-1])
        message = (f"{run.name}: the connection was lost during the {phase} of {label}, before the host "
                   f"answered ({detail})\n" + (
                       "  the host may be rolled back and restarted: its ledger says what was done; `fleetpatch "
                       "status` shows it, and a plain rerun of rollback finishes it (a restore cut half-way is "
                       "completed, a pending restart done)" if undoing else
                       "  the host may be patched and restarted: its ledger says what was done; `fleetpatch status` "
                       "shows it, and a plain rerun of deploy finishes it (a write cut half-way is undone, a pending "
                       "restart done) or rollback undoes it"))
    return run.result(False, f.status, message, patch=label)


@host_step
def verify_logs(run: HostRun) -> HostResult:
    job, host = run.job, run.host
    reply = probe(run.remote, host, job, [], content=False)
    run.version = reply.get("version")
    if reply.get("patch_lost"):
        return run.result(False, Status.PATCH_LOST, patch_lost_message(host, reply["patch_lost"]),
                          details={"patch_lost": reply["patch_lost"]})
    if host.servers:   # each server's own window: its ledger slot names its last restart
        results = [(s.host.server_name, _verify_logs_of(s, probe(s.remote, s.host, job, [], content=False)))
                   for s in server_runs(run)]
        return combine(run, results, None)
    return _verify_logs_of(run, reply)


def _verify_logs_of(run: HostRun, reply: dict) -> HostResult:
    """verify-logs of one server: the window of its last restart that fleetpatch did."""
    job, host = run.job, run.host
    ledger = reply.get("ledger") or {}
    last = ledger.get("last_restart")
    if not last:
        return run.result(False, Status.ERROR, f"{host.name}: fleetpatch has not restarted this server yet, so "
                                               "there is no log window to read; deploy first")
    recorded = ledger.get("patches", {})
    name = wanted_name(job)
    names = [name] if name else sorted(recorded)
    if not names:
        return run.result(False, Status.ERROR, f"{host.name}: no patch recorded as applied; name one with "
                                               "--patch")
    if name and not job.patch and name not in recorded:
        return run.result(False, Status.ERROR, f"{host.name}: {name} is not recorded as applied on this host "
                                               f"({recorded_list(recorded)}), and there is no {name} folder here to "
                                               "judge it by; `fleetpatch status` shows what is applied")
    found = deployed(job, host, [(n, recorded.get(n)) for n in names])
    # No lock while it reads: the record of its verdict takes the host's lock (in the agent).
    judged = found[0].patch if len(found) == 1 else job.patch
    view = execution.ExecutionView() if execution.probe_wanted(job, host, judged) else None
    result = verify(run, Watch(protocol.log_window(last), running_launch(host, reply), [d.patch for d in found],
                               [d.label for d in found], check="verify-logs", execution=view,
                               record_lock="verify-logs", timeline=execution.recorded_timeline(last)))
    return with_notes(result, found)


def recorded_list(recorded: dict) -> str:
    labels = sorted(e.get("label") or n for n, e in recorded.items())
    return "recorded: " + ", ".join(labels) if labels else "none is"


def combine(run: HostRun, results: list[tuple[str, HostResult]], label: str | None) -> HostResult:
    """The host's result from its servers' (name, result): ok when every server is; else the
    first failed server's status."""
    failed = [(n, r) for n, r in results if not r.ok]
    worst = failed[0][1] if failed else results[-1][1]
    if failed:
        head = (f"{run.name}: {len(failed)} of {len(results)} servers failed: "
                + ", ".join(f"{n} ({r.status})" for n, r in failed))
    else:
        head = f"{run.name}: {len(results)} servers, each {', '.join(sorted({str(r.status) for _, r in results}))}"
    lines = [head] + [f"  [{n}] " + r.message.replace("\n", "\n      ") for n, r in results]
    out = run.result(not failed, worst.status, "\n".join(lines), patch=label or worst.patch,
                     executed_path=worst.executed_path, markers=[m for _, r in results for m in r.markers])
    out.details["servers"] = {n: r.to_json() for n, r in results}
    for key in ("router", "execution"):
        if key in worst.details:
            out.details[key] = worst.details[key]
    return out


def fold_rollback(failed: HostResult, rb: HostResult) -> HostResult:
    """The failed host's result, with the rollback that undid it."""
    failed.details["rollback"] = {"status": rb.status, "ok": rb.ok, "message": rb.message}
    if rb.ok:
        failed.status = Status.ROLLED_BACK
        failed.message += "\n  rolled back: originals restored byte for byte, server restarted without the patch"
    else:
        failed.message += f"\n  rollback did not verify: {rb.message}"
    failed.ok = False
    return failed


def newest_first(ledger: protocol.Ledger) -> list[str]:
    """Patches stack: the last one applied is undone first, so each restores what the next expects."""
    patches = ledger.get("patches", {})
    return sorted(patches, key=lambda n: (patches[n].get("seq", 0), patches[n].get("applied_at", ""), n),
                  reverse=True)
