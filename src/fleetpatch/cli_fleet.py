"""Fleet-wide commands: rollout, and the local demo fleet. What runs a rollout is imported
in its body: `fleetpatch --help` and `--version` never load it."""
from __future__ import annotations

import functools
import os
from pathlib import Path

from invoke.exceptions import Exit

from .cli_common import (COMMON, HELP, PATCH_NEEDED, ROUTER, Common, check_probe_off, choice, command, count, finish,
                         helps, make_drainer, prepare, required, router_settings, run_tunnels, seconds)


@command(help=helps(*COMMON, "patch", "timeout", "force", "break_lock", *ROUTER,
                    bake="watch the canary and each batch SECONDS (process alive, health, no new traceback or "
                         "forbid line) before the next batch; a failure counts against --max-failures",
                    canary="canary hosts when the inventory has no `canary` group, a whole number "
                           "(default 1; 0 skips the canary stage)",
                    batch="hosts per batch after the canary, a whole number of 1 or more (default: all the rest; "
                          "under a router, as many as --max-unavailable allows without taking out a router's "
                          "last healthy worker)",
                    max_failures="stop starting hosts once more than K have failed, a whole number (default 0)",
                    on_failure="rollback (default) or keep the hosts that fail", no_probe=HELP["no_probe"]))
def rollout(c, patch=None, inventory=None, hosts=None, group=None, report=None, parallel=None, patches=None,
            canary=None, batch=None, max_failures=None, on_failure="rollback", timeout=None, force=False,
            break_lock=False, drain_timeout=None, max_unavailable=None, no_router=False, bake=None,
            accept_new_host_keys=False, verbose=False, no_probe=False):
    """Deploy fleet-wide: the canary first, then batches, within a failure budget."""
    from . import rollout as fleet
    from .dialer import Interrupt
    from .dials import Dials
    on_failure = choice("on-failure", on_failure, ("rollback", "keep"))
    canary_n = count("canary", canary, minimum=0)
    batch_n = count("batch", batch, minimum=1)
    budget = count("max-failures", max_failures, minimum=0, default=0)
    parallel_n = count("parallel", parallel, minimum=1)
    timeout_s = seconds("timeout", timeout)
    bake_s = seconds("bake", bake)
    router = router_settings(drain_timeout, max_unavailable, no_router)
    inv, selected, dirs, patch_obj, rev = prepare(
        inventory=inventory, hosts=hosts, group=group, patches=patches,
        patch=required("patch", patch, PATCH_NEEDED), changes_hosts=True, report=report)
    check_probe_off(patch_obj, selected, no_probe)
    canary_group = inv.groups.get("canary")
    routed = not router["no_router"] and any(h.router is not None for h in selected)
    stages_planned, has_canary = fleet.plan_stages(selected, canary_group, canary_n, batch_n)
    with Dials(Interrupt()) as dials:
        if not routed:   # under a router, its drain decides how many go at once, once the routers are checked
            dials.start(fleet.first_out(stages_planned, parallel_n), inv.hosts, accept_new_host_keys)
        # loaded while the first hosts' connections are made
        from . import drain, steps
        from . import report as rep
        from .bake import bake_host
        job = steps.Job(hosts_by_name=inv.hosts, patch=patch_obj, rev=rev, patch_dirs=dirs, timeout=timeout_s,
                        on_failure=on_failure, force=force, break_lock=break_lock,
                        accept_new_host_keys=accept_new_host_keys, inventory_arg=inventory, probe=not no_probe,
                        bake_s=bake_s, interrupt=dials.interrupt, known_hosts=dials.known_hosts, dials=dials)
        with run_tunnels(job) as tunnels:   # router.via's connections: this run's, closed at its end
            if routed and batch_n is None:   # as many at once as the routers can spare
                batch_n = drain.default_batch(selected, router, tunnels)
                stages_planned, has_canary = fleet.plan_stages(selected, canary_group, canary_n, batch_n)
            # what is out at once: a stage, or `parallel` of its hosts
            at_once = [st[i:i + fleet.default_parallel(len(st), parallel_n)] for st in stages_planned
                       for i in range(0, len(st), fleet.default_parallel(len(st), parallel_n))]
            job.drain = make_drainer(selected, at_once, router, tunnels, require_listed=not break_lock)
            console = rep.make_console()
            started = rep.now_iso()
            n_batches = len(stages_planned) - (1 if has_canary else 0)
            with rep.View("rollout", [h.name for h in selected], console=console) as view:
                job.progress = view.progress
                for i, stage in enumerate(stages_planned):
                    canary_stage = has_canary and i == 0
                    k = i if has_canary else i + 1
                    for h in stage:
                        view.stage(h.name, "canary" if canary_stage else f"batch {k} of {n_batches}")

                results, stop, stages = fleet.rollout(
                    selected,
                    fleet.by_unit(functools.partial(steps.deploy, job), functools.partial(steps.deploy_nodes, job)),
                    stages=stages_planned, has_canary=has_canary, parallel=parallel_n, max_failures=budget,
                    bake=functools.partial(bake_host, job, seconds=bake_s) if bake_s else None,
                    interrupt=job.interrupt)
    finish(console, "rollout", results, started, Common(report=report, verbose=verbose), stop,
           extra={"stages": stages})


@command(help={"down": "stop the demo fleet and remove what it created on this machine (from any folder)",
               "root": "where the demo fleet lives (default $XDG_STATE_HOME/fleetpatch/demo, else "
                       "~/.local/state/fleetpatch/demo)",
               "containers": "run each host's engine in a Docker container (needs a reachable Docker daemon)",
               "engine": "sglang (default) or vllm: the demo fleet's engine (vllm: 0.33.0 hosts on Model Runner V1 "
                         "and V2)"})
def demo(c, down=False, root=None, containers=False, engine="sglang"):
    """Run the demo: a local fleet of 4 sshd hosts, the shipped patch rolled out under traffic through sglang-router (when installed), a one-path patch caught twice."""
    from fleetpatch_demo import run as demo_run  # the demo's fleet code is only loaded for this command
    where = Path(os.path.expanduser(root)) if root else None   # None: the demo's per-user state folder
    code = demo_run.down(where) if down else demo_run.up(where, containers=containers, engine=engine)
    if code:
        raise Exit(code=code)


TASKS = [rollout, demo]
