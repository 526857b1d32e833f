"""Is a host's lock held by a live run or left by a dead one, and what clears it.

A pure judgement of the lock record the agent reads (`protocol.LockRecord`,
with `idle_s` and `age_s` measured on the host's own clock) plus, for a holder
on this same machine, whether its process still runs. A lock is left by a dead
run when its holder's channel ended after it changed the host (`orphaned`), when
its holder is a process on this machine that no longer runs, or when it was not
renewed for `LOCK_STALE_PERIODS` renewal periods. The judgement only decides
what fleetpatch says: no lock is ever cleared without `--break-lock`.
"""
from __future__ import annotations

import os
import re
import shlex
import socket
from dataclasses import dataclass

from .agent.procs import proc_stat
from .protocol import LOCK_RENEW_S, LOCK_STALE_PERIODS

HOLDER = re.compile(r"^(?P<user>[^@]+)@(?P<laptop>.+) pid (?P<pid>\d+)$")


@dataclass
class LockView:
    holder: str
    command: str | None     # what the holder was doing, e.g. "deploy-patch --patch NAME"
    since: str
    age_s: float | None
    alive: bool
    why: str                # the evidence: "renewed 2 s ago", "pid 42 no longer runs on this machine", ...

    def age(self) -> str:
        return ago(self.age_s) if self.age_s is not None else "age unknown"

    def cell(self) -> str:
        """The status table's lock column: holder, age, live or dead."""
        return f"{self.holder}, {self.age()}, " + ("live" if self.alive else "DEAD run")


def ago(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d"


def boot_id() -> str | None:
    """This machine's boot (Linux): two laptops may share a hostname, never a boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), which a reused pid does not share."""
    stat = proc_stat(pid)
    return stat.start if stat else None


def process_runs(pid: int, start: int | None) -> bool:
    """Whether the process `pid` (started at `start`, when known) still runs here."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, another user's
    stat = proc_stat(pid)
    if stat is None:
        return True  # no /proc (macOS): the pid exists
    return stat.state not in ("Z", "X") and (start is None or stat.start == start)


def assess(lock: dict, here: str | None = None, runs=process_runs, boot: str | None = None) -> LockView:
    """Judge one lock record (see the module doc). `here` is this machine's hostname and
    `boot` its boot id: the holder's pid is looked up here only when both match."""
    here = socket.gethostname() if here is None else here
    boot = boot_id() if boot is None else boot
    holder = str(lock.get("holder") or "unknown holder")
    parsed = HOLDER.match(holder)
    laptop = lock.get("laptop") or (parsed.group("laptop") if parsed else None)
    pid = lock.get("pid") or (int(parsed.group("pid")) if parsed else None)
    renew_s = float(lock.get("renew_s") or LOCK_RENEW_S)
    idle = lock.get("idle_s")
    view = LockView(holder, lock.get("command"), str(lock.get("since") or "?"), lock.get("age_s"), True, "")
    lost = lock.get("orphaned")
    if lost:
        view.alive = False
        view.why = (f"its channel ended at {lost.get('at', '?')} ({lost.get('how', '?')}) after it ran "
                    f"{'+'.join(lost.get('after') or []) or 'nothing'} on this host")
    elif laptop == here and lock.get("boot_id") in (None, boot) and pid and not runs(int(pid), lock.get("pid_start")):
        view.alive = False
        view.why = f"its process (pid {pid}) no longer runs on this machine ({here})"
    elif idle is not None and idle > LOCK_STALE_PERIODS * renew_s:
        view.alive = False
        view.why = f"it was not renewed for {ago(idle)} (a live run renews it every {renew_s:g} s)"
    else:
        view.why = f"renewed {ago(idle)} ago" if idle is not None else "renewal unknown"
    return view


def provably_dead_here(lock: dict, here: str | None = None, runs=process_runs, boot: str | None = None) -> bool:
    """True when the holder is a fleetpatch run of this machine (same hostname and boot)
    whose process no longer runs: nothing of it can still be working on the host, so
    the next run may take the lock over without a human. A holder elsewhere, or one
    that merely stopped renewing, is reported as dead, never taken over."""
    here = socket.gethostname() if here is None else here
    boot = boot_id() if boot is None else boot
    parsed = HOLDER.match(str(lock.get("holder") or ""))
    laptop = lock.get("laptop") or (parsed.group("laptop") if parsed else None)
    pid = lock.get("pid") or (int(parsed.group("pid")) if parsed else None)
    if laptop != here or lock.get("boot_id") not in (None, boot) or not pid or int(pid) == os.getpid():
        return False
    return not runs(int(pid), lock.get("pid_start"))


def clear_command(host: str, command: str | None, inventory: str | None = None) -> str:
    """The one line that clears a dead run's lock and finishes its work on `host`
    (with the --inventory this run was given: the default one may not name the host)."""
    where = f" --inventory {shlex.quote(str(inventory))}" if inventory else ""
    return f"fleetpatch {command or 'deploy-patch --patch NAME'} --break-lock --hosts {host}{where}"


DEPLOY = re.compile(r"^deploy-patch --patch (?P<name>[^@\s]+)(?:@(?P<rev>\S+))?$")


def clear_advice(host: str, command: str | None, inventory: str | None = None,
                 patch_here: bool = True) -> list[tuple[str, str]]:
    """What clears a dead run's lock on `host` and deals with its work: (what it does, command)
    pairs, the one that works on this laptop first. Its rollback works from any laptop (the host
    records the patch); its deploy only where the patch's folder is (`patch_here`: on this one)."""
    deploying = DEPLOY.match(command or "")
    if not deploying:
        return [("clear the lock and finish its work", clear_command(host, command, inventory))]
    name = deploying.group("name")
    undo = ("undo its work (works from any laptop: the host records the patch)",
            clear_command(host, f"rollback --patch {name}", inventory))
    if patch_here:
        return [("clear the lock and finish its work", clear_command(host, command, inventory)),
                ("or clear it and " + undo[0], undo[1])]
    return [("clear the lock and " + undo[0], undo[1]),
            (f"or finish its work where the patch's folder is (this laptop has no patches/{name}; "
             "or add --patches DIR)", clear_command(host, command, inventory))]


def refusal(host: str, lock: dict, command: str, inventory: str | None = None) -> str:
    """Why a deploy or rollback (`command`) did not start on `host`, and what to do."""
    v = assess(lock)
    doing = f" ({v.command})" if v.command else ""
    if v.alive:
        return (f"{host}: locked by a live fleetpatch run: {v.holder}{doing}, since {v.since} ({v.age()}), "
                f"{v.why}; wait for it to end (`fleetpatch status --hosts {host}` shows the lock); a live "
                "run's lock is never broken without --break-lock")
    return (f"{host}: locked by a dead fleetpatch run: {v.holder}{doing}, since {v.since} ({v.age()}): {v.why}; "
            f"check what it left (`fleetpatch status --hosts {host}`: restart pending, last verification), "
            f"then clear the lock and finish with:\n  {clear_command(host, command, inventory)}")
