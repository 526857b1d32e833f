"""status: one host's row of the fleet table, and whether it is a failing host."""
from __future__ import annotations

from .. import lockview, protocol
from ..errors import Status
from ..hostcalls import HostResult, base_request, patch_lost_message
from ..patchset import MANIFEST
from .context import HostRun, host_step
from .plan import restart_hazard

# A last verification that ended so leaves the host ok (a rollback's check records `verified` too).
VERIFIED_LAST = (Status.VERIFIED, Status.ROLLED_BACK)


def drifted(ledger: dict, reply_files: dict) -> list[str]:
    """The files that no longer hold what the last patch that wrote them left there (patches stack)."""
    expected = {}
    for entry in sorted(ledger.get("patches", {}).values(), key=lambda e: (e.get("seq", 0), e.get("applied_at", ""))):
        for p, rec in entry.get("files", {}).items():
            expected[p] = rec["after"]
    return sorted(p for p, sha in expected.items() if (reply_files.get(p) or {}).get("sha256") != sha)


def failed_verification(last_v: dict) -> Status | None:
    """The status of a last verification that did not pass, if it did not."""
    said = last_v.get("status")
    if not said or said in VERIFIED_LAST:
        return None
    try:
        return Status(said)
    except ValueError:
        return Status.ERROR


def since_restart(ledger: dict, host_time: float | None) -> str:
    """' (restarted 12 min ago)', on the host's own clock; '' where either time is unknown."""
    epoch = (ledger.get("last_restart") or {}).get("epoch")
    if not isinstance(epoch, (int, float)) or not isinstance(host_time, (int, float)):
        return ""
    return f" (restarted {lockview.ago(max(0.0, host_time - epoch))} ago)"


def _lock_problem(run: HostRun, view: lockview.LockView, details: dict) -> str | None:
    details["lock_state"] = {"holder": view.holder, "command": view.command, "age_s": view.age_s,
                             "alive": view.alive, "why": view.why, "cell": view.cell()}
    if view.alive:
        return None
    deploying = lockview.DEPLOY.match(view.command or "")
    here = bool(deploying) and any((d / deploying.group("name") / MANIFEST).is_file() for d in run.job.patch_dirs)
    advice = lockview.clear_advice(run.name, view.command, run.job.inventory_arg, patch_here=here)
    details["lock_state"]["clear"] = advice[0][1]   # the command that works on this laptop
    return (f"the lock is left by a dead run: {view.holder}" + (f" ({view.command})" if view.command else "")
            + f", since {view.since} ({view.age()}): {view.why}; once you have checked the host (restart pending, "
            "last verification above), " + "\n".join(f"{what}:\n  {cmd}" for what, cmd in advice))


@host_step
def status(run: HostRun) -> HostResult:
    reply = run.remote.call("probe", protocol.ProbeRequest(**run.request(), files=[], content=False,
                                                          ledger_files=True))
    run.version = reply.get("version")
    ledger = reply.get("ledger") or {}
    drift = drifted(ledger, reply.get("files") or {})
    server = reply.get("server") or {}
    applied = [e["label"] for _, e in sorted(ledger.get("patches", {}).items())]
    last_v = ledger.get("last_verification") or {}
    lock = reply.get("lock")
    details = {"reachable": True, "applied": applied, "drift": drift,
               "server_up": bool(server.get("alive")) and server.get("healthy") is not False,
               "server_pid": server.get("pid"), "last_verification": last_v,
               "restart_pending": bool(ledger.get("restart_pending")),
               "lock": lock, "known_version": run.profile.knows(run.version or "")}
    problems, status_ = [], Status.OK
    if reply.get("container"):
        details["container"] = reply["container"]
    if reply.get("patch_lost"):   # the files are the image's: that, not each file's drift, is the story
        details["patch_lost"] = reply["patch_lost"]
        problems.append(patch_lost_message(run.host, reply["patch_lost"])[len(run.name) + 2:])
        status_, drift = Status.PATCH_LOST, []
        details["drift"] = []
    if drift:
        problems.append("drift in " + ", ".join(drift))
        status_ = Status.DRIFT
    failed = None if run.host.servers else failed_verification(last_v)   # several servers: each judged below
    if failed == Status.UNPROVEN:
        what = ", ".join(last_v.get("labels") or []) or "the patches"
        problems.append(f"the last verification ({last_v.get('check') or 'deploy'} of {what}, at "
                        f"{last_v.get('at', '?')}) ended unproven: the patched code was reached, none of its added "
                        f"lines ran{since_restart(ledger, reply.get('host_time'))}; the server still watches them: "
                        "`fleetpatch verify-logs` judges what ran since, deploy-patch or rollback fix it")
        status_ = status_ if drift else failed
    elif failed is not None:
        what = ", ".join(last_v.get("labels") or []) or "the patches"
        problems.append(f"the last verification ({last_v.get('check') or 'deploy'} of {what}, at "
                        f"{last_v.get('at', '?')}) ended {failed}: the patched code is not proven to run; "
                        "`fleetpatch verify-logs` reads the log again, deploy-patch or rollback fix it")
        status_ = status_ if drift else failed
    if run.host.servers:
        status_ = _each_server(run, details, problems, status_, drift)
    else:
        hazard = restart_hazard(run.host, run.profile, run.version, reply)
        if hazard:
            details["notes"] = [hazard]
    if lock:
        problem = _lock_problem(run, lockview.assess(lock), details)
        if problem:
            problems.append(problem)
            status_ = Status.LOCKED if status_ == Status.OK else status_
    msg = f"{run.name}: " + ("; ".join(problems) if problems else "ok")
    return run.result(not problems, status_, msg, details=details)


def _each_server(run: HostRun, details: dict, problems: list, status_: Status, drift: list) -> Status:
    """A host with several servers: each one's process and last verification (its ledger slot)."""
    details["servers"] = {}
    for view in run.host.server_views():
        reply = run.remote.call("probe", protocol.ProbeRequest(**base_request(view, run.job), files=[], content=False))
        ledger, server = reply.get("ledger") or {}, reply.get("server") or {}
        last_v = ledger.get("last_verification") or {}
        details["servers"][view.server_name] = {
            "server_up": bool(server.get("alive")) and server.get("healthy") is not False,
            "server_pid": server.get("pid"), "last_verification": last_v,
            "restart_pending": bool(ledger.get("restart_pending"))}
        hazard = restart_hazard(view, run.profile, run.version, reply)
        if hazard:
            details.setdefault("notes", []).append(f"server {view.server_name}: {hazard}")
        failed = failed_verification(last_v)
        if failed is not None:
            what = ", ".join(last_v.get("labels") or []) or "the patches"
            problems.append(f"server {view.server_name}: the last verification ({last_v.get('check') or 'deploy'} "
                            f"of {what}, at {last_v.get('at', '?')}) ended {failed}: the patched code is not proven "
                            "to run there; `fleetpatch verify-logs` reads its log again, deploy-patch or rollback "
                            "fix it")
            status_ = status_ if drift or status_ != Status.OK else failed
    mine = details["servers"].values()
    details["server_up"] = all(s["server_up"] for s in mine)
    details["restart_pending"] = any(s["restart_pending"] for s in mine)
    return status_
