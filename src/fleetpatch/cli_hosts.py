"""The per-host commands: fetch, check-patch, deploy-patch, verify-logs,
rollback, status.

What runs a command (steps, the rollout loop, the report) is imported in the command's
body: `fleetpatch --help` and `--version` never load it."""
from __future__ import annotations

import functools
from pathlib import Path

from .cli_common import (COMMON, HELP, NO_PATCH, PATCH_NEEDED, ROUTER, Common, OutcomeShown, RunFailed, choice,
                         command, count, ctrl_c_held, helps, prepare, required, router_settings, run_hosts,
                         seconds)


@command(help=helps(*NO_PATCH, dest="where to put the files (default .fleetpatch/sources)"))
def fetch(c, inventory=None, hosts=None, group=None, report=None, parallel=None,
          dest=".fleetpatch/sources", accept_new_host_keys=False, verbose=False):
    """Copy the engine files of the profile from each host to DEST/<host>/<path>, with fetch.json."""
    from . import report as rep, steps
    rep.check_report_path(dest, flag="--dest", directory=True)
    run_hosts("fetch", steps.fetch, Common(inventory, hosts, group, report, parallel, None, accept_new_host_keys,
                                           verbose), dest=Path(dest))


@command(help=helps(*COMMON, "patch", "force", "no_router"))
def check_patch(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=None, patches=None,
                force=False, no_router=False, accept_new_host_keys=False, verbose=False):
    """Dry run: show whether the patch applies on each host and would run there, changing nothing."""
    from . import drain, steps
    run_hosts("check-patch", drain.with_router_check(steps.check_patch),
              Common(inventory, hosts, group, report, parallel, patches, accept_new_host_keys, verbose),
              patch=required("patch", patch, PATCH_NEEDED), force=force, router=router_settings(no_router=no_router))


@command(help=helps(*COMMON, "patch", "timeout", "force", "break_lock", *ROUTER,
                    no_restart="write the files but do not restart (the restart stays pending on the host)",
                    bake="watch a host whose verdict is unproven SECONDS under the traffic it serves: verified as "
                         "soon as an added line runs",
                    on_failure="keep (default) or rollback the hosts that fail", no_probe=HELP["no_probe"]))
def deploy_patch(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=None, patches=None,
                 no_restart=False, timeout=None, on_failure="keep", force=False, break_lock=False,
                 drain_timeout=None, max_unavailable=None, no_router=False, bake=None, accept_new_host_keys=False,
                 verbose=False, no_probe=False):
    """Deploy a patch: per host lock, apply, back up, write, restart, and verify the patched path ran."""
    from . import steps
    from .bake import with_bake
    bake_s = seconds("bake", bake)
    run_hosts("deploy-patch", with_bake(steps.deploy, bake_s),
              Common(inventory, hosts, group, report, parallel, patches, accept_new_host_keys, verbose),
              patch=required("patch", patch, PATCH_NEEDED), changes_hosts=True, no_restart=no_restart,
              timeout=timeout, on_failure=choice("on-failure", on_failure, ("keep", "rollback")), force=force,
              break_lock=break_lock, router=router_settings(drain_timeout, max_unavailable, no_router or no_restart),
              probe=not no_probe, group_step=steps.deploy_nodes, bake_s=bake_s)


@command(help=helps(*COMMON, "patch", "timeout", no_probe=HELP["no_probe"]))
def verify_logs(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=None, patches=None,
                timeout=None, accept_new_host_keys=False, verbose=False, no_probe=False):
    """Read the log since fleetpatch's last restart, and pass only if the patched path executed."""
    from . import steps
    run_hosts("verify-logs", steps.verify_logs,
              Common(inventory, hosts, group, report, parallel, patches, accept_new_host_keys, verbose),
              patch=patch, timeout=timeout, probe=not no_probe)


@command(help=helps(*COMMON, "patch", "timeout", "break_lock", *ROUTER,
                    force="restore the originals even over files changed since fleetpatch wrote them, and restart "
                          "even where the engine would refuse server.restart's start and env"))
def rollback(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=None, patches=None,
             timeout=None, force=False, break_lock=False, drain_timeout=None, max_unavailable=None, no_router=False,
             accept_new_host_keys=False, verbose=False):
    """Restore the original files byte for byte, restart, and check that the patch's markers are gone."""
    from . import steps
    run_hosts("rollback", steps.rollback,
              Common(inventory, hosts, group, report, parallel, patches, accept_new_host_keys, verbose),
              patch=patch, changes_hosts=True, timeout=timeout, force=force, break_lock=break_lock,
              router=router_settings(drain_timeout, max_unavailable, no_router), group_step=steps.rollback_nodes)


@command(help=helps(*NO_PATCH))
def status(c, inventory=None, hosts=None, group=None, report=None, parallel=None,
           accept_new_host_keys=False, verbose=False):
    """Show one table of the fleet: reachable, engine version, patches applied, drift, server up, last check."""
    from . import report as rep, rollout as fleet, steps
    parallel_n = count("parallel", parallel, minimum=1)
    inv, selected, dirs, _, _ = prepare(inventory=inventory, hosts=hosts, group=group, patches=None,
                                        patch=None, changes_hosts=False, report=report)
    console = rep.make_console()
    started = rep.now_iso()
    job = steps.Job(hosts_by_name=inv.hosts, patch_dirs=dirs, accept_new_host_keys=accept_new_host_keys,
                    inventory_arg=inventory)
    results, stop = fleet.run_all(selected, fleet.each_host(functools.partial(steps.status, job)), parallel_n,
                                  job.interrupt)
    ok = all(r.ok for r in results.values()) and not stop.interrupted
    with ctrl_c_held():   # every host has answered: a late Ctrl-C no longer cuts the table off
        if report:   # first: a terminal that hung up, or a reader gone, cannot take it away
            rep.write_report(report, "status", ok, started, results,
                             {"stopped": stop.describe(results), "interrupted": True} if stop.interrupted else None)
        console.print(rep.status_table(results))
        if verbose:
            rep.print_evidence(console, results)
        for r in results.values():
            if not r.ok:
                rep.say(console, r.message, style="red")
        rep.print_notes(console, results)   # ok now, not after the next restart
        text, _ = rep.last_line("status", results, stop.interrupted)
        rep.say(console, text, style="bold green" if ok else "bold red")
    if stop.interrupted:
        raise OutcomeShown
    if not ok:
        raise RunFailed("status failed")


TASKS = [fetch, check_patch, deploy_patch, verify_logs, rollback, status]
