"""Fleet-wide commands: rollout, and the local demo fleet."""
from __future__ import annotations

import functools
from pathlib import Path

from invoke import task
from invoke.exceptions import Exit
from rich.console import Console

from . import report as rep
from . import rollout as fleet
from . import steps
from .cli import COMMON, _err, _finish, _help, _prepare, _timeout
from .errors import UsageError


@task(help=_help(*COMMON, "patch", "timeout", "force", "break_lock") | {
    "canary": "canary hosts when the inventory has no `canary` group (default 1; 0 skips the canary stage)",
    "batch": "hosts per batch after the canary (default: all the rest)",
    "max_failures": "stop starting hosts once more than K have failed (default 0)",
    "on_failure": "rollback (default) or keep the hosts that fail"})
def rollout(c, patch, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None, canary=-1,
            batch=0, max_failures=0, on_failure="rollback", timeout=None, force=False, break_lock=False,
            accept_new_host_keys=False):
    """Fleet-wide deploy: the canary first, then batches, within a failure budget."""
    console = Console()
    started = rep.now_iso()
    try:
        if on_failure not in ("keep", "rollback"):
            raise UsageError(f"--on-failure must be rollback or keep, not {on_failure!r}")
        if max_failures < 0 or batch < 0:
            raise UsageError("--max-failures and --batch must not be negative")
        inv, selected, dirs, patch_obj, rev = _prepare(inventory=inventory, hosts=hosts, group=group,
                                                       patches=patches, patch=patch, changes_hosts=True)
        job = steps.Job(hosts_by_name=inv.hosts, patch=patch_obj, rev=rev, patch_dirs=dirs,
                        timeout=_timeout(timeout), on_failure=on_failure, force=force, break_lock=break_lock,
                        accept_new_host_keys=accept_new_host_keys)
    except UsageError as e:
        _err(console, str(e))
        raise Exit(code=2)
    canary_group = inv.groups.get("canary")
    with rep.View("rollout", [h.name for h in selected]) as view:
        job.progress = view.progress

        def on_stage(i, stage, is_canary):
            for h in stage:
                view.progress(h.name, "queued", "canary" if is_canary else f"batch {i}")

        results, stop, stages = fleet.rollout(
            selected, functools.partial(steps.deploy, job), canary_group=canary_group,
            canary=None if canary < 0 else canary, batch=batch or None, parallel=parallel or None,
            max_failures=max_failures, on_stage=on_stage)
    lines = [f"stopped: {stop.reason}"] if stop.reason else []
    _finish(console, "rollout", results, started, report, stop, extra={"stages": stages}, extra_lines=lines)


@task(help={"down": "stop the demo fleet and remove what it started",
            "root": "where the demo fleet lives (default .fleetpatch/demo)"})
def demo(c, down=False, root=".fleetpatch/demo"):
    """Start a local demo fleet (4 sshd hosts, 2 on spec v2), roll the shipped patch out,
    then show a one-path patch stopped by the pre-flight check and, forced, failing loudly."""
    from .demo import run as demo_run
    code = demo_run.down(Path(root)) if down else demo_run.up(Path(root))
    if code:
        raise Exit(code=code)


TASKS = [rollout, demo]
