"""The Invoke collection and the `fleetpatch` Program: `invoke deploy-patch …`
in the repo and `fleetpatch deploy-patch …` anywhere are the same command."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

from invoke import Collection, Program, task
from invoke.exceptions import Exit, ParseError
from rich.console import Console

from . import __version__, report as rep, rollout as fleet
from . import steps
from .engines import sglang
from .errors import UsageError
from .inventory import load_inventory, resolve_inventory_path
from .patchset import load_patch, search_dirs

HELP = {
    "inventory": "the inventory file (default: ./hosts.yaml, or $FLEETPATCH_INVENTORY)",
    "hosts": "comma-separated host names from the inventory",
    "group": "the hosts of this inventory group ('all' is every host)",
    "report": "also write the JSON report to this path",
    "parallel": "hosts worked on at once (default: all selected, capped at 32)",
    "patches": "look patches up in DIR first, then ./patches, then the shipped ones",
    "patch": "NAME (newest revision admitting the host's engine version) or NAME@REV",
    "timeout": "seconds to wait for the markers after a restart (default: server.ready_timeout)",
    "accept_new_host_keys": "trust unknown host keys and record them (a changed key is always refused)",
    "break_lock": "break a lock left behind by a dead fleetpatch run",
    "force": "proceed although the pre-flight check says the patched path would not run",
}

COMMON = ("inventory", "hosts", "group", "report", "parallel", "patches", "accept_new_host_keys")


def _help(*names):
    return {n: HELP[n] for n in names}


def _err(console: Console, msg: str) -> None:
    console.print(f"fleetpatch: error: {msg}", style="bold red", markup=False, highlight=False)


def _timeout(value) -> float | None:
    if value in (None, ""):
        return None
    try:
        t = float(value)
    except ValueError:
        raise UsageError(f"--timeout: expected seconds, got {value!r}") from None
    if t <= 0:
        raise UsageError("--timeout: must be more than 0 seconds")
    return t


def _prepare(*, inventory, hosts, group, patches, patch, changes_hosts):
    inv = load_inventory(resolve_inventory_path(inventory))
    selected = inv.select(hosts or None, group or None, changes_hosts=changes_hosts)
    dirs = search_dirs(patches or None, Path.cwd())
    patch_obj, rev = (load_patch(patch, dirs, sglang.PROFILE) if patch else (None, None))
    return inv, selected, dirs, patch_obj, rev


def _finish(console, task_name, results, started, report_path, stop=None, extra=None, extra_lines=()):
    rep.print_outcome(console, task_name, results, extra_lines)
    ok = all(r.ok for r in results.values())
    if report_path:
        doc_extra = dict(extra or {})
        if stop is not None and stop.reason:
            doc_extra["stopped"] = stop.reason
            doc_extra["interrupted"] = stop.interrupted
        rep.write_report(report_path, task_name, ok, started, results, doc_extra)
    if stop is not None and stop.interrupted:
        raise Exit(code=130)
    if not ok:
        raise Exit(code=1)


def _run_hosts(task_name: str, step, *, inventory, hosts, group, report_path, parallel, patches,
               patch=None, changes_hosts=False, **job_kw):
    console = Console(stderr=False)
    started = rep.now_iso()
    try:
        inv, selected, dirs, patch_obj, rev = _prepare(inventory=inventory, hosts=hosts, group=group,
                                                       patches=patches, patch=patch, changes_hosts=changes_hosts)
        job_kw["timeout"] = _timeout(job_kw.get("timeout"))
    except UsageError as e:
        _err(console, str(e))
        raise Exit(code=2)
    job = steps.Job(hosts_by_name=inv.hosts, patch=patch_obj, rev=rev, patch_dirs=dirs, **job_kw)
    with rep.View(task_name, [h.name for h in selected]) as view:
        job.progress = view.progress
        results, stop = fleet.run_all(selected, functools.partial(step, job), parallel or None)
    _finish(console, task_name, results, started, report_path, stop)


@task(help=_help(*COMMON) | {"dest": "where to put the files (default .fleetpatch/sources)"})
def fetch(c, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None, dest=".fleetpatch/sources",
          accept_new_host_keys=False):
    """Copy the engine files of the profile from each host to DEST/<host>/<path>, with fetch.json."""
    _run_hosts("fetch", steps.fetch, inventory=inventory, hosts=hosts, group=group, report_path=report,
               parallel=parallel, patches=patches, dest=Path(dest), accept_new_host_keys=accept_new_host_keys)


@task(help=_help(*COMMON, "patch", "force"))
def check_patch(c, patch, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None,
                force=False, accept_new_host_keys=False):
    """Dry run: does the patch apply on each host, and would its path run there? Changes nothing."""
    _run_hosts("check-patch", steps.check_patch, inventory=inventory, hosts=hosts, group=group, report_path=report,
               parallel=parallel, patches=patches, patch=patch, force=force,
               accept_new_host_keys=accept_new_host_keys)


@task(help=_help(*COMMON, "patch", "timeout", "force", "break_lock") | {
    "no_restart": "write the files but do not restart (the restart stays pending on the host)",
    "on_failure": "keep (default) or rollback the hosts that fail"})
def deploy_patch(c, patch, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None,
                 no_restart=False, timeout=None, on_failure="keep", force=False, break_lock=False,
                 accept_new_host_keys=False):
    """Per host: lock, fetch, apply, back up, write, restart, and verify the patched path ran."""
    if on_failure not in ("keep", "rollback"):
        _err(Console(), f"--on-failure must be keep or rollback, not {on_failure!r}")
        raise Exit(code=2)
    _run_hosts("deploy-patch", steps.deploy, inventory=inventory, hosts=hosts, group=group, report_path=report,
               parallel=parallel, patches=patches, patch=patch, changes_hosts=True, no_restart=no_restart,
               timeout=timeout, on_failure=on_failure, force=force, break_lock=break_lock,
               accept_new_host_keys=accept_new_host_keys)


@task(help=_help(*COMMON, "patch", "timeout"))
def verify_logs(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None,
                timeout=None, accept_new_host_keys=False):
    """Read the log since fleetpatch's last restart and pass only if the patched path executed."""
    _run_hosts("verify-logs", steps.verify_logs, inventory=inventory, hosts=hosts, group=group, report_path=report,
               parallel=parallel, patches=patches, patch=patch, timeout=timeout,
               accept_new_host_keys=accept_new_host_keys)


@task(help=_help(*COMMON, "patch", "timeout", "break_lock") | {
    "force": "restore the originals even over files changed since fleetpatch wrote them"})
def rollback(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None,
             timeout=None, force=False, break_lock=False, accept_new_host_keys=False):
    """Restore the original files byte for byte, restart, and check the patch's markers are gone."""
    _run_hosts("rollback", steps.rollback, inventory=inventory, hosts=hosts, group=group, report_path=report,
               parallel=parallel, patches=patches, patch=patch, changes_hosts=True, timeout=timeout, force=force,
               break_lock=break_lock, accept_new_host_keys=accept_new_host_keys)


@task(help=_help(*COMMON))
def status(c, inventory=None, hosts=None, group=None, report=None, parallel=0, patches=None,
           accept_new_host_keys=False):
    """One table: reachable, engine version, patches applied, drift, server up, last verification."""
    console = Console()
    started = rep.now_iso()
    try:
        inv, selected, dirs, _, _ = _prepare(inventory=inventory, hosts=hosts, group=group, patches=patches,
                                             patch=None, changes_hosts=False)
    except UsageError as e:
        _err(console, str(e))
        raise Exit(code=2)
    job = steps.Job(hosts_by_name=inv.hosts, patch_dirs=dirs, accept_new_host_keys=accept_new_host_keys)
    results, stop = fleet.run_all(selected, functools.partial(steps.status, job), parallel or None)
    console.print(rep.status_table(results))
    ok = all(r.ok for r in results.values())
    if report:
        rep.write_report(report, "status", ok, started, results)
    bad = {n: r for n, r in results.items() if not r.ok}
    for n, r in bad.items():
        console.print(r.message, style="red", markup=False, highlight=False)
    if bad:
        console.print(f"FAILED on {len(bad)} of {len(results)} hosts: "
                      + ", ".join(f"{n} ({r.status})" for n, r in bad.items()), style="bold red", markup=False)
        raise Exit(code=1)


ns = Collection(fetch, check_patch, deploy_patch, verify_logs, rollback, status)


def _extend_namespace():
    """Tasks whose modules pull in more (rollout, demo, bench) register here."""
    try:
        from . import cli_fleet
    except ImportError:
        return
    for t in cli_fleet.TASKS:
        ns.add_task(t)


_extend_namespace()


class FleetpatchProgram(Program):
    """Usage errors exit 2 and Ctrl-C exits 130, as the contract says."""

    def parse_core(self, argv):
        try:
            return super().parse_core(argv)
        except ParseError as e:
            print(f"fleetpatch: error: {e}", file=sys.stderr)
            sys.exit(2)

    def parse_tasks(self):
        try:
            return super().parse_tasks()
        except ParseError as e:
            print(f"fleetpatch: error: {e}", file=sys.stderr)
            sys.exit(2)

    def run(self, argv=None, exit=True):
        try:
            return super().run(argv, exit)
        except KeyboardInterrupt:
            print("fleetpatch: interrupted", file=sys.stderr)
            sys.exit(130)


program = FleetpatchProgram(namespace=ns, name="fleetpatch", binary="fleetpatch", version=__version__)


def main():
    program.run()
