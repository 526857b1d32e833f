"""Restarts that drop no request: each worker out of its routers, drained, restarted,
verified, smoke-tested, and only then put back.

The laptop side of a router-aware restart. `steps` calls `around_restart` at the
one place it restarts a server; without a router section (or with --no-router)
that is the plain restart. The routers are spoken to from the laptop
(fleetpatch.router), or through the SSH connection to router.via's host
(fleetpatch.router_via, wired in by `router_of`: the run's `router_via.Tunnels`,
which the `Drainer` carries); the worker's own load and
the smoke request are read ON the host by the agent ops `drain` and `smoke`
(the worker's URL may be reachable only there, and the router's load figures
count tokens, not requests).

Per host, in order:
  out of every router, confirmed gone -> /v1/loads shows 0 running, 0 waiting
  (bounded by --drain-timeout; on expiry back in, unrestarted, files unchanged)
  -> the restart and verification of `steps` -> smoke request -> back into
  every router, confirmed healthy. A host failing verification or the smoke
  is left out (with --on-failure rollback: rolled back, verified, smoked, put back).

Capacity: `preflight` refuses, before any host is touched, a run that could take
more than --max-unavailable workers out of a router at once or leave a router
without a healthy worker; `Drainer.take_out` checks again against the live list
before each removal (a worker may have gone unhealthy meanwhile).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from . import protocol
from .hostcalls import HostResult, base_request, smoke_fields
from .errors import HostFailure, Status, UsageError
from .router import Router, RouterConf, RouterError, Routers, capacity_problem, check_smoke_answer, find_worker

DRAIN_CALL_S = 2.0        # one agent `drain` call waits at most this long (Ctrl-C answered within it)
REMOVE_TIMEOUT_S = 30.0
ADD_TIMEOUT_S = 60.0
SMOKE_TIMEOUT_S = 60.0
SMOKE_EXPECT_WAIT_S = 5.0
# A restart step refused with these changed nothing on the host (the agent checks before it writes).
UNTOUCHED = {Status.DRIFT, Status.CONFLICT, Status.LOCKED}


@dataclass
class Drainer:
    """The router-aware restart settings of one command, shared by its hosts."""

    drain_timeout: float = 600.0
    max_unavailable: Optional[int] = None
    tunnels: Optional[object] = None   # the run's router_via.Tunnels (router.via connections), closed at its end
    lock: threading.Lock = field(default_factory=threading.Lock)
    out: Dict[str, set] = field(default_factory=dict)     # router (Router.label) -> worker URLs out right now
    # the pre-flight found every selected worker listed: no host can reach its step left out
    # (unset for a rollback and for --break-lock, which let a left-out worker through)
    all_listed: bool = False

    def take_out(self, host, routers: Routers) -> None:
        """Mark the worker out of each router, refusing (HostFailure router-error) if that
        would leave a router no healthy worker or exceed --max-unavailable."""
        url = host.server.url
        with self.lock:
            for r in routers.routers:
                try:
                    workers = r.list_workers()
                except RouterError as e:
                    raise HostFailure(Status.ROUTER_ERROR, f"{host.name}: {e}; the host was not touched",
                                      reason=str(e)) from None
                out_now = [u for u in self.out.get(r.label, set()) if u != url]
                problem = capacity_problem(r.label, workers, out_now + [url], self.max_unavailable)
                if problem:
                    raise HostFailure(Status.ROUTER_ERROR, f"{host.name}: refused, not touched: {problem}",
                                      reason=problem)
            for r in routers.routers:
                self.out.setdefault(r.label, set()).add(url)

    def back(self, host, routers: Routers) -> None:
        with self.lock:
            for r in routers.routers:
                self.out.get(r.label, set()).discard(host.server.url)


def _via(conf: RouterConf, tunnels) -> dict:
    """How the routers are reached: through router.proxy, through router.via's host (a tunnel
    of the run's `tunnels`), or direct."""
    if conf.proxy:
        return {"proxy": conf.proxy}
    if not conf.via:
        return {}
    if conf.via_host is None:   # a RouterConf not made by the inventory
        raise RouterError(", ".join(conf.urls), f"router.via names {conf.via!r}, which is not a resolved "
                                                 "inventory host")
    if tunnels is None:
        raise RouterError(", ".join(conf.urls), f"router.via ({conf.via}) needs the run's tunnels "
                                                 "(router_via.Tunnels), and none was given")
    return {"via": conf.via, "tunnel": tunnels.tunnel_for(conf.via_host, conf.via_hosts)}


def router_of(url: str, conf: RouterConf, tunnels=None) -> Router:
    """One router of a host's router section, through its router.via host (`tunnels`: the run's) when it has one."""
    return Router(url, **_via(conf, tunnels))


def routers_of(conf: RouterConf, tunnels=None) -> Routers:
    """Every router of a host's router section, through its router.via host (`tunnels`: the run's) when it has one."""
    return Routers(conf.urls, **_via(conf, tunnels))


def enabled(job, host) -> bool:
    return getattr(job, "drain", None) is not None and host.router is not None and bool(host.server.url)


def _info() -> dict:
    return {"removed": False, "drained_s": None, "in_flight_at_removal": None, "readded": False}


def _put_back(host, routers: Routers, info: dict) -> Optional[str]:
    """Back into every router, confirmed healthy; the problem, if any."""
    try:
        routers.add(host.server.url, ADD_TIMEOUT_S)
    except RouterError as e:
        return str(e)
    info["readded"] = True
    return None


def around_restart(job, host, remote, restart: Callable[[], HostResult], *,
                   rollback: Optional[Callable[[HostResult], HostResult]] = None,
                   expect: Optional[List[str]] = None) -> HostResult:
    """`restart()` (which restarts, verifies and may roll back) wrapped in the drain.

    `rollback(failed)` undoes a host whose smoke request (or smoke_expect) failed after it
    verified; `expect` are the patch's smoke_expect lines."""
    if not enabled(job, host):
        return restart()
    d: Drainer = job.drain
    routers = routers_of(host.router, d.tunnels)
    info = _info()
    job.progress(host.name, "drain", "out of the router")
    try:
        with job.interrupt.first_contact():   # nothing is out yet: Ctrl-C drops a via connection still being made
            d.take_out(host, routers)
    except HostFailure as f:
        if job.interrupt.is_set():
            raise HostFailure(Status.INTERRUPTED, f.message, reason=f.reason) from None
        raise
    try:
        info["was_listed"] = _remove_all(host, routers)
        info["removed"] = True
        waited = _drain(job, host, remote, d, info)
        if waited is not None:   # not drained: back in, untouched
            status, why = waited
            problem = _put_back(host, routers, info)
            said = f"{why}; put back into the router{'s' if len(routers.routers) > 1 else ''} unrestarted"
            failed = f"\n  putting it back FAILED: {problem}" if problem else ""
            return _with_router(HostResult(host.name, False, status, f"{host.name}: {said}, files unchanged{failed}",
                                           reason=said + failed), info)
        try:
            result = restart()
        except HostFailure as f:
            # refused before anything was written or restarted: it can serve again as it was
            result = HostResult(host.name, False, f.status, f.message)
            if f.status in UNTOUCHED:
                problem = _put_back(host, routers, info)
                result.message += "\n  put back into the router unrestarted" + (
                    f"; putting it back FAILED: {problem}" if problem else "")
            else:
                result.message += "\n  not put back into the router: its state is unknown; check it, then " \
                                  "rerun or roll back"
            return _with_router(result, info)
        return _after_restart(job, host, remote, routers, info, result, rollback, expect or [])
    finally:
        d.back(host, routers)


def _remove_all(host, routers: Routers) -> bool:
    """Out of every router, confirmed gone from each list; all or nothing. A router that
    does not list the worker (fleetpatch left it out after a failure) is skipped: the
    worker goes into it when it is put back. Returns whether every router listed it."""
    done, everywhere = [], True
    try:
        for r in routers.routers:
            if r.remove(host.server.url, REMOVE_TIMEOUT_S) is None:
                everywhere = False
            else:
                done.append(r)
    except RouterError as e:
        for r in done:
            try:
                r.add(host.server.url, ADD_TIMEOUT_S)
            except RouterError:
                pass  # the first error is the one to report
        raise HostFailure(Status.ROUTER_ERROR, f"{host.name}: {e}; the host was not touched (it was put back "
                                               "into any router it had left)", reason=str(e)) from None
    return everywhere


def _drain(job, host, remote, d: Drainer, info: dict):
    """None once the worker has nothing in flight; else (status, why) to put it back untouched."""
    t0 = time.monotonic()
    while True:
        if job.interrupt.is_set():
            return Status.INTERRUPTED, f"interrupted ({job.interrupt.cause}) while draining"
        left = d.drain_timeout - (time.monotonic() - t0)
        req = dict(base_request(host, job), url=host.server.url, wait=max(0.0, min(DRAIN_CALL_S, left)))
        try:
            out = remote.call("drain", req, timeout=DRAIN_CALL_S + 60)
        except HostFailure as f:
            return f.status if f.status != Status.ERROR else Status.ROUTER_ERROR, \
                f"cannot tell whether the worker is drained: {f.message}"
        if info["in_flight_at_removal"] is None:
            info["in_flight_at_removal"] = int(out.get("first", 0))
        elapsed = time.monotonic() - t0
        if job.interrupt.is_set():   # arrived during the call: nothing was touched yet
            return Status.INTERRUPTED, f"interrupted ({job.interrupt.cause}) while draining"
        if out.get("drained"):
            info["drained_s"] = round(elapsed, 3)
            return None
        job.progress(host.name, "drain", f"{elapsed:4.1f}s {out.get('running')} running, "
                                         f"{out.get('waiting')} waiting")
        if elapsed >= d.drain_timeout:
            info["drained_s"] = round(elapsed, 3)
            return Status.DRAIN_TIMEOUT, (f"still {out.get('running')} running and {out.get('waiting')} waiting "
                                          f"requests after --drain-timeout {d.drain_timeout:g} s")


def serving_again(result) -> bool:
    """The server runs a verified state: the patch verified, or a verified rollback."""
    if result.ok:
        return True
    return result.status == Status.ROLLED_BACK and bool((result.details.get("rollback") or {}).get("ok"))


def smoked(result) -> bool:
    """The verdict was taken after smoke requests that were answered (steps.follow)."""
    return bool((result.details.get("smoke") or {}).get("ended"))


def _after_restart(job, host, remote, routers, info, result, rollback, expect):
    if result.status == Status.UNPROVEN:
        # healthy and on the right path, its added lines not run yet: real traffic may prove it (--bake)
        result.message += "\n  put back into the router: real traffic may still prove it (--bake, verify-logs)"
        return _readd(host, routers, info, result)
    if not serving_again(result):
        result.message += "\n  not put back into the router: it failed verification"
        return _with_router(result, info)
    # smoke_expect proves the patched branch ran for a request: only for a patched, verified server.
    # The smoke requests the verdict was taken after (steps.follow) judged it already.
    problem = None if smoked(result) else smoke(job, host, remote, expect if result.ok else [])
    if problem is not None:
        status, why = problem
        result.ok, result.status = False, status
        result.message += f"\n  {why}"
        if status == Status.NOT_EXECUTED:
            result.details["cause"] = why
        if rollback is not None:
            result = rollback(result)
            if serving_again(result) and smoke(job, host, remote, []) is None:
                return _readd(host, routers, info, result)
        result.message += "\n  not put back into the router"
        return _with_router(result, info)
    return _readd(host, routers, info, result)


def back_if_left_out(job, host, remote, result: HostResult) -> HostResult:
    """A host found verified with nothing to restart (the patch already applied) whose worker a
    router does not list: an earlier run took it out and died before it put it back (the run
    that `--break-lock` finishes). Smoke-tested, then put back; an unproven one put back as after
    a restart. Nothing where no router applies or every router lists it; no router asked where
    the pre-flight found every worker listed."""
    if not enabled(job, host) or job.drain.all_listed or not (result.ok or result.status == Status.UNPROVEN):
        return result
    routers = routers_of(host.router, job.drain.tunnels)
    try:
        left_out = [r.label for r in routers.routers if r.find(host.server.url) is None]
    except RouterError as e:
        result.ok, result.status = False, Status.ROUTER_ERROR
        result.message += f"\n  cannot tell whether the router lists it: {e}"
        return result
    if not left_out:
        return result
    info = dict(_info(), was_listed=False)
    if result.ok and not smoked(result):
        problem = smoke(job, host, remote, [])
        if problem is not None:
            status, why = problem
            result.ok, result.status = False, status
            result.message += f"\n  {why}\n  not put back into the router"
            return _with_router(result, info)
    result.message += f"\n  it was out of {', '.join(left_out)} (an earlier run left it out): put back"
    return _readd(host, routers, info, result)


def _readd(host, routers, info, result):
    problem = _put_back(host, routers, info)
    if problem:
        result.ok, result.status = False, Status.ROUTER_ERROR
        result.message += f"\n  putting it back into the router FAILED: {problem}"
    return _with_router(result, info)


def _with_router(result, info: dict):
    result.details["router"] = dict(info)
    return result


def smoke_verdict(status, body: bytes, expect: List[str], reply: dict, answer: str = "text") -> Optional[tuple]:
    """(status, why) of a failed smoke request, or None. Pure: the agent's reply judged (`answer`:
    how the engine's answer holds its text, as hostcalls.smoke_fields says)."""
    if status is None:
        return Status.SMOKE_FAILED, f"smoke request failed: no answer ({body[:200].decode('utf-8', 'replace')})"
    bad = check_smoke_answer(status, body, answer)
    if bad:
        auth = f"; {reply['auth']}" if reply.get("auth") else ""   # a 401: whether the host had the API key
        return Status.SMOKE_FAILED, f"smoke request failed: {bad}{auth}"
    missing = reply.get("missing") or []
    if expect and missing:
        return Status.NOT_EXECUTED, (f"the smoke request was answered, but the log shows no "
                                     f"{', '.join(repr(m) for m in missing)} after it (smoke_expect): the "
                                     "patched code did not run for a request")
    return None


def smoke(job, host, remote, expect: List[str]) -> Optional[tuple]:
    """Send the smoke request from the host; (status, why) if it failed, else None."""
    conf = host.server.smoke
    shaped = smoke_fields(host, conf.prompt, conf.max_new_tokens)
    job.progress(host.name, "smoke", f"POST {shaped['path']}")
    req = dict(base_request(host, job), url=host.server.url, prompt=conf.prompt,
               max_new_tokens=conf.max_new_tokens, timeout=SMOKE_TIMEOUT_S, expect=list(expect),
               expect_wait=SMOKE_EXPECT_WAIT_S, **shaped)
    try:
        reply = remote.call("smoke", req, timeout=SMOKE_TIMEOUT_S + SMOKE_EXPECT_WAIT_S + 30)
    except HostFailure as f:
        return Status.SMOKE_FAILED, f"smoke request failed: {f.message}"
    return smoke_verdict(reply.get("status"), protocol.unpack(reply["body"]), expect, reply, shaped["answer"])


# ----------------------------------------------------------------- pre-flight

def router_hosts(hosts) -> Dict[tuple, list]:
    """(router URL, via host or None) -> the selected hosts behind it (inventory order).
    One URL reached through two via hosts may be two routers (each host's private address)."""
    out: Dict[tuple, list] = {}
    for h in hosts:
        if h.router is not None:
            for u in h.router.urls:
                out.setdefault((u.rstrip("/"), h.router.via), []).append(h)
    return out


def preflight(hosts, stages: List[list], max_unavailable: Optional[int], require_listed: bool = True,
              tunnels=None) -> Dict[str, str]:
    """Before any host is touched: every router answers (through its router.via host when
    it has one), lists each of its selected workers (unless `require_listed` is off: a
    rollback may restore a worker fleetpatch left out), and no stage could take more out
    of it than allowed. Returns each router's API description; raises UsageError naming
    every problem."""
    problems: List[str] = []
    apis: Dict[str, str] = {}
    for (url, _), behind in router_hosts(hosts).items():
        try:
            r = router_of(url, behind[0].router, tunnels)
            apis[r.label] = r.api.description
            workers = r.list_workers()
        except RouterError as e:
            problems.append(str(e))
            continue
        for h in behind if require_listed else []:
            for view in h.server_views():   # each server of a host with several, each one drained on its own
                if find_worker(workers, view.server.url) is None:
                    try:
                        r.require_listed(view.server.url)   # raises, saying what the router lists instead
                    except RouterError as e:
                        problems.append(f"{h.name}{f' server {view.server_name}' if view.server_name else ''}: {e}")
        names = {h.name for h in behind}
        for i, stage in enumerate(stages):
            out = [h.server.url for h in stage if h.name in names]
            if not out:
                continue
            limit = max_unavailable if max_unavailable is not None else len(out)
            problem = capacity_problem(r.label, workers, out, limit)
            if problem:
                what = f"stage {i + 1} ({', '.join(h.name for h in stage if h.name in names)})"
                problems.append(f"{what}: {problem}")
                break
    if problems:
        raise UsageError("router pre-flight refused, no host was touched: " + "; ".join(problems))
    return apis


def default_batch(hosts, router: Optional[dict], tunnels=None) -> Optional[int]:
    """rollout's batch when --batch is not given: under a router, as many workers as every
    router can spare at once (--max-unavailable, less those already unhealthy, and never
    its last healthy worker); None without a router (all the rest). A router that cannot
    be read is left to the pre-flight, which names it."""
    if not router or router.get("no_router") or not any(h.router is not None for h in hosts):
        return None
    limit = router.get("max_unavailable")
    spare: List[int] = []
    for (url, _), behind in router_hosts(hosts).items():
        try:
            workers = router_of(url, behind[0].router, tunnels).list_workers()
        except RouterError:
            continue
        healthy = sum(1 for w in workers if w.healthy is not False)
        room = healthy - 1
        if limit is not None:
            room = min(room, limit - (len(workers) - healthy))
        spare.append(room)
    if not spare:
        return limit
    return max(1, min(spare))


def check_router(host, tunnels=None) -> tuple:
    """check-patch's router finding for one host: (details, problem or None)."""
    details: Dict[str, dict] = {}
    problem = None
    for u in host.router.urls:
        via = {"via": host.router.via} if host.router.via else {}
        try:
            r = router_of(u, host.router, tunnels)
            api = r.api
            ws = [r.require_listed(view.server.url) for view in host.server_views()]   # each of its servers
            healthy = False if any(w.healthy is False for w in ws) else ws[0].healthy
            details[u] = {"api": api.description, "listed": True, "healthy": healthy, **via}
        except RouterError as e:
            details[u] = {"error": e.reason, **via}
            problem = problem or str(e)
    return details, problem


def with_router_check(step):
    """check-patch's step, with each router in front of the host checked and named."""

    def run(job, host):
        result = step(job, host)
        if host.router is None or getattr(job, "drain", None) is None:
            return result
        with job.interrupt.first_contact():   # read-only: Ctrl-C drops a via connection still being made
            details, problem = check_router(host, job.drain.tunnels)
        result.details["routers"] = details
        lines = []
        listed = ", ".join(v.server.url for v in host.server_views())   # each server of a host with several
        for u, d in details.items():
            reached = f" (reached via {d['via']}, over its SSH connection)" if d.get("via") else ""
            said = (f"{d['api']}; lists {listed}" + (" (unhealthy)" if d.get("healthy") is False else "")
                    if "api" in d else f"PROBLEM: {d['error']}")
            lines.append(f"  router {u}{reached}: {said}")
        result.message += "\n" + "\n".join(lines)
        if problem and result.ok:
            result.ok, result.status = False, Status.ROUTER_ERROR
        return result

    run.__name__ = getattr(step, "__name__", "check_patch")
    return run
