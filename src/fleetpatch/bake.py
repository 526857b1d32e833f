"""--bake S: watch a finished batch before the next one starts.

After the canary and each batch, every host of it is watched S seconds ON the
host (agent op `bake`: the server process alive, its health endpoint 200, no
new log line holding the patch's `forbid` texts). A host failing its bake is a
failed host: it counts against --max-failures, and with --on-failure rollback
it is rolled back (drained first when a router is in front of it). A host with
several servers (`servers:`) has each of them watched at once, over a connection each.

A host whose verdict is `unproven` (its patched function ran, none of its added lines
yet) is watched instead under the traffic it serves: verify-logs again every
PROVE_EVERY_S until an added line ran (then `verified`, proved by traffic) or S
seconds passed (still `unproven`). deploy-patch --bake does only that."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time

from . import drain, steps
from .errors import Status
from .router import RouterError


@steps.host_step
def _watch(run: "steps.HostRun") -> "steps.HostResult":
    seconds = run.job.bake_s
    run.progress("bake", f"{seconds:g}s")
    forbid = list(getattr(run.job.patch, "forbid", None) or [])
    out = run.remote.call("bake", run.request(seconds=seconds, forbid=forbid), timeout=seconds + 60)
    if out.get("ok"):
        return run.result(True, Status.VERIFIED, f"{run.name}: baked {seconds:g} s")
    return run.result(False, Status.ERROR,
                      f"{run.name}: failed during the bake (--bake {seconds:g}): {out.get('problem')}")


def _watch_each(job, host) -> "steps.HostResult":
    """The host's bake: each of its servers watched at the same time; the first that fails, named."""
    views = host.server_views()
    if len(views) == 1:
        return _watch(job, host)
    job.progress(host.name, "bake", f"{job.bake_s:g}s, each of {len(views)} servers")
    quiet = dataclasses.replace(job, progress=lambda *_: None)   # the host's progress is said here, once
    with concurrent.futures.ThreadPoolExecutor(len(views)) as pool:
        watched = list(pool.map(lambda view: _watch(quiet, view), views))
    failed = [(v, w) for v, w in zip(views, watched) if not w.ok]
    result = failed[0][1] if failed else watched[0]
    if failed:
        result.message = result.message.replace(f"{host.name}: ", f"{host.name}: server {failed[0][0].server_name} ",
                                                1)
        result.details["server"] = failed[0][0].server_name
    job.progress(host.name, "done", result.status)
    return result


PROVE_EVERY_S = 1.0   # between two reads of the probe's records while an unproven host is baked


def prove_under_traffic(job, host, unproven: "steps.HostResult", seconds: float) -> "steps.HostResult":
    """--bake S on an unproven host: its verify-logs once an added line ran within S seconds,
    else `unproven` as it was, saying how long it was watched."""
    job.progress(host.name, "bake", f"{seconds:g}s: waiting for traffic to run an added line")
    deadline = time.monotonic() + seconds
    while not job.interrupt.is_set():
        time.sleep(max(0.0, min(PROVE_EVERY_S, deadline - time.monotonic())))
        seen = steps.verify_logs(job, host)
        if seen.ok:
            seen.details["bake"] = {"ok": True, "seconds": seconds, "proved": True}
            seen.message += f"\n  proved under traffic during --bake {seconds:g}"
            return seen
        if seen.status != Status.UNPROVEN or time.monotonic() >= deadline:
            break
    unproven.details["bake"] = {"ok": False, "seconds": seconds, "proved": False}
    unproven.message += f"\n  still unproven after --bake {seconds:g} s: no added line ran under the traffic it served"
    if job.on_failure == "rollback":
        steps.fold_rollback(unproven, steps.rollback(job, host))
    return unproven


def with_bake(step, seconds: float | None):
    """deploy-patch's step with --bake S: an unproven host watched under traffic (prove_under_traffic)."""
    if not seconds:
        return step

    def run(job, host):
        result = step(job, host)
        return prove_under_traffic(job, host, result, seconds) if result.status == Status.UNPROVEN else result

    run.__name__ = getattr(step, "__name__", "deploy")
    return run


def bake_host(job, host, passed: "steps.HostResult", seconds: float) -> "steps.HostResult":
    """The host's result after its bake: `passed` unchanged, or the failure (rolled back
    with --on-failure rollback); an unproven host, watched under traffic (prove_under_traffic)."""
    if passed.status == Status.UNPROVEN:
        return prove_under_traffic(job, host, passed, seconds)
    job.bake_s = seconds
    watched = _watch_each(job, host)
    if watched.ok:
        passed.details["bake"] = {"ok": True, "seconds": seconds}
        return passed
    failed = steps.HostResult(host.name, False, watched.status, watched.message,
                              engine_version=passed.engine_version, patch=passed.patch,
                              executed_path=passed.executed_path, markers=passed.markers,
                              details=dict(passed.details, bake={"ok": False, "seconds": seconds,
                                                                 "problem": watched.message}))
    if drain.enabled(job, host):
        # a failing worker does not keep serving: out of its routers (the rollback drains it anyway)
        worker = next((v for v in host.server_views() if v.server_name == watched.details.get("server")), host)
        try:
            for r in drain.routers_of(host.router, job.drain.tunnels).routers:
                r.remove(worker.server.url)
            failed.message += "\n  taken out of the router"
        except RouterError as e:
            failed.message += f"\n  could not take it out of the router: {e}"
    if job.on_failure == "rollback":
        rb = steps.rollback(job, host)
        steps.fold_rollback(failed, rb)
        if "router" in rb.details:
            failed.details["router"] = rb.details["router"]
    return failed
