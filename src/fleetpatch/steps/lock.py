"""A host's lock for one `with` block on this side."""
from __future__ import annotations

import dataclasses

from .. import lockview, protocol
from ..errors import HostFailure, Status
from ..hostcalls import HostResult, base_request
from ..inventory import Host
from ..remote import Remote
from .context import Job, probe


class HostLock:
    """The host's lock for one `with` block, released when the block ends however
    it ends: a refusal, a HostFailure, a bug in this process. A rollback that
    follows a failure runs inside the same block, so it keeps the lock.

    The release costs no round trip when the block's work ends with an agent
    request: it is chained onto that request (`release_followup`). Otherwise
    `__exit__` sends it."""

    def __init__(self, remote: Remote, host: Host, job: Job, command: str):
        self.remote, self.host, self.job = remote, host, job
        self.command = command  # recorded in the lock, and how a refusal says to clear one left by a dead run
        self.held = False       # this run may hold the lock: release it at the end
        self._riding = False    # the release was chained onto the running request

    def __enter__(self) -> "HostLock":
        return self

    def probe(self, files: list[str], content: bool) -> protocol.ProbeReply:
        """The locking probe (again, inside the block: the lock is re-entrant for this run).
        A lock whose holder is provably dead (a run on this machine whose pid is gone,
        e.g. killed with -9) is taken over: only a live holder, or one elsewhere, needs a human."""
        self.held = True  # from the moment the request leaves, the lock may be ours
        reply = probe(self.remote, self.host, self.job, files, content, lock=self.command)
        if reply.get("locked"):
            return reply
        held = reply.get("lock") or {}
        if self.job.break_lock or not lockview.provably_dead_here(held):
            self.held = False  # another run's lock: not ours to release
            raise HostFailure(Status.LOCKED, lockview.refusal(self.host.name, held, self.command, self.job.inventory_arg))
        dead = held.get("holder", "a dead run")
        self.job.progress(self.host.name, "fetch", f"taking over the lock of {dead} (that process is gone)")
        took = probe(self.remote, self.host, dataclasses.replace(self.job, break_lock=True), files, content,
                     lock=self.command)
        took["lock_taken_over"] = dead
        self.taken_over = (f"\n  took over the lock left by {dead}: "
                           f"{lockview.assess(held).why}")
        return took

    def release_followup(self) -> list[protocol.Request]:
        """The unlock request to chain onto the request (or follow) that ends the work."""
        if not self.held:
            return []
        self._riding = True
        return [dict(base_request(self.host, self.job), op="unlock")]

    def chained_done(self, reply: dict) -> None:
        """The request answered: if the release rode on it and the agent ran it, the lock is free.
        (A follow that ended at its deadline before the decision arrived ran nothing.)"""
        if self._riding and any(r.get("unlocked") for r in reply.get("then") or []):
            self.held = False
        self._riding = False

    # The release after a failure gets a short wait of its own: after a stalled call the
    # connection is likely stalled too, and the operator must not wait minutes for it.
    RELEASE_TIMEOUT_S = 20.0

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._riding = False
        if self.held:
            self.held = False
            try:
                self.remote.call("unlock", base_request(self.host, self.job), timeout=self.RELEASE_TIMEOUT_S)
            except Exception as e:  # the run's own failure comes first; this is said after it
                note = (f"\n  the lock {self.host.engine.state_dir}/{protocol.LOCK_FILE} was NOT released "
                        f"({getattr(e, 'message', e)}); once this run (and any agent of it still at work on "
                        "the host) has ended, a plain rerun from this machine takes it over; from another "
                        "machine, rerun with --break-lock")
                if isinstance(exc, HostFailure):
                    exc.message += note
                else:
                    self.release_note = note
        return False

    release_note = ""
    taken_over = ""

    def annotate(self, result: HostResult) -> HostResult:
        """The result, with the lock it took over from a dead run and the release's failure, if any."""
        result.message += self.taken_over + self.release_note
        return result
