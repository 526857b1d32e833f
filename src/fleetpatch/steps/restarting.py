"""restart and verify: the agent operation that restarts (apply+restart, or a
restart alone), inside the drain when a router is in front of the host, then the
follow judged; and why a deploy with nothing to write must still restart.

What undoes a host that fails is the caller's: it passes its undo step (or None),
so this module needs neither the deploy nor the rollback that use it."""
from __future__ import annotations

from typing import Callable

from .. import drain, protocol
from ..engines import LaunchConfig
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from ..inventory import Host
from . import execution
from .context import HostRun, inventory_launch
from .follow import Watch, follow_ahead, prove_wait, smoke_spec
from .plan import Plan
from .verify import cut_off, verify

Undo = Callable[[HostResult], HostResult]

# A last restart that ended so is retried by the next deploy: the operator fixed the cause.
RETRY_AFTER = (Status.RESTART_FAILED, Status.TIMEOUT)


def restart_reason(ledger: protocol.Ledger, server: dict, name: str) -> str | None:
    """Why a deploy that has nothing to write must still restart, if it must: a restart
    left pending, a server that is down, or a last restart that failed or never got ready.
    Re-reading that restart's window would only repeat its failure."""
    if ledger.get("restart_pending"):
        return "restart pending from an earlier run"
    if not ledger.get("last_restart"):
        return None
    if server.get("alive") is False:
        return "the server is not running"
    verification = (ledger.get("patches", {}).get(name) or {}).get("verification") or {}
    if verification.get("status") in RETRY_AFTER:
        return f"the last restart ended {verification['status']}"
    return None


class Restart:
    """The agent operation that restarts: apply+restart, or a restart alone (with why)."""

    def __init__(self, op: str, request: dict, reason: str):
        self.op, self.request, self.reason = op, request, reason

    @property
    def phase(self) -> str:
        """What a cut connection interrupted, in the host's result."""
        return "write and restart" if self.op == "apply" else "restart"


def restart_and_verify(run: HostRun, plan: Plan, restart: Restart, undo: Undo | None) -> HostResult:
    """The restart, inside the drain when a router is in front of the host. `undo`: what
    turns a failed result into the host rolled back (--on-failure rollback), or None."""
    return drain.around_restart(run.job, run.host, run.remote,
                                lambda: restart_and_verify_now(run, plan, restart, undo),
                                rollback=undo, expect=smoke_expect(run))


def smoke_expect(run: HostRun) -> list[str]:
    """The patch's smoke_expect lines: what the smoke request after a drained restart must show."""
    return list(getattr(run.job.patch, "smoke_expect", None) or [])


def restart_and_verify_now(run: HostRun, plan: Plan, restart: Restart, undo: Undo | None) -> HostResult:
    """Run the agent operation that restarts (apply+restart, or a pending restart),
    verify, and with `undo` undo a host that failed either way (under the same lock:
    the rollback is part of the block)."""
    run.progress("restart", restart.reason)   # here, after the drain: the order things happen in
    probing = "probe" in restart.request
    smoke = smoke_spec(run.host, run.job.patch)
    try:
        out = run.remote.call(restart.op, restart.request, ahead=follow_ahead(run.job, run.host, probing, smoke))
    except HostFailure as f:
        if f.status != Status.RESTART_FAILED:
            return cut_off(run, plan.label, f, restart.phase)
        # The files are written (the ledger says so, restart pending) but the server did not start.
        failed = run.result(False, Status.RESTART_FAILED, f.message, patch=plan.label)
        if undo is not None:
            return undo(failed)
        failed.message += "\n  the files are written and a restart is pending; fix the start, then rerun or roll back"
        return failed
    # With a rollback to follow a failure, the lock stays held until the rollback ends.
    watch = Watch(protocol.AFTER_RESTART, launch_after_restart(run.host, plan), [run.job.patch], [plan.label],
                  ends_work=(lambda ok: ok) if undo is not None else (lambda ok: True),
                  execution=execution.ExecutionView(out.get("probe")) if probing else None,
                  smoke=smoke, smoke_wait=prove_wait(run.job.patch))
    try:
        result = verify(run, watch)
    except HostFailure as f:
        return cut_off(run, plan.label, f, "verification")
    if out.get("timings"):   # the host's own account of the write and the restart (bench/README.md)
        result.details["apply_timings"] = dict(out["timings"], stop_s=(out.get("restart") or {}).get("stop_s"))
    # an unproven host that --bake will watch under traffic is undone only if the bake does not prove it
    if not result.ok and undo is not None and not (result.status == Status.UNPROVEN and run.job.bake_s):
        result = undo(result)
    return result


def launch_after_restart(host: Host, plan: Plan) -> LaunchConfig:
    """Until the new process can be read from /proc (it may die first), the best
    account of it is what fleetpatch started: the inventory's command, or for
    systemd/supervisor the unit, which the old process reflects."""
    return inventory_launch(host, plan.session_env) if host.server.restart.kind == "command" else plan.launch
