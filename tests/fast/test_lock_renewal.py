"""The renewal that keeps a live run from ever looking dead: the agent holding a
lock touches it from a thread, through restarts, follows and idle waits for the
laptop; when that agent is gone, the lock stops moving and reads as a dead run.
Local transport (the real agent, the real stand-in), with a short renewal period
so that the stale threshold (5 periods) passes within the test."""
from __future__ import annotations

import os
import signal
import threading
import time


from support.localhost import job
from fleetpatch import lockview, protocol, remote, steps
from support.agent_session import Agent, requests

RENEW = 0.2
STALE = protocol.LOCK_STALE_PERIODS * RENEW


def lock_state(lh):
    r = steps.status(job(lh, None)[0], lh.host())
    return r, r.details.get("lock_state")


def test_a_deploy_longer_than_the_stale_threshold_always_reads_live(lh):
    slow = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": str(4 * STALE)})
    j, host = job(lh, host=slow, lock_renew_s=RENEW)
    result = {}
    t = threading.Thread(target=lambda: result.update(r=steps.deploy(j, host)))
    t.start()
    seen = []
    while t.is_alive():
        r, state = lock_state(lh)
        if state:
            seen.append((state["alive"], r.details["lock"]["idle_s"], state["why"]))
        time.sleep(RENEW / 2)
    t.join()
    assert result["r"].status == "verified", result["r"].message
    assert result["r"].duration_s > 3 * STALE, "the run outlasted the stale threshold"
    assert len(seen) >= 10 and all(alive for alive, _, _ in seen), seen
    assert max(idle for _, idle, _ in seen) < STALE, seen
    assert not lh.lock.exists()


def test_an_idle_holder_keeps_renewing_and_a_killed_one_stops(lh):
    base, probe, apply, follow = requests(lh)
    probe["lock"].update(renew_s=RENEW, command="deploy-patch --patch spec-path-beacon")
    a = Agent(lh)
    a.request(probe)
    assert a.result()["locked"]
    time.sleep(2 * STALE)  # the laptop says nothing: the agent waits, and renews
    r, state = lock_state(lh)
    assert state["alive"] and r.ok, state
    assert r.details["lock"]["idle_s"] < STALE
    os.killpg(a.proc.pid, signal.SIGKILL)  # the agent dies without a word (OOM killer, host reboot)
    a.proc.wait()
    time.sleep(STALE + 2 * RENEW)
    r, state = lock_state(lh)
    assert not state["alive"] and r.status == "locked", state
    assert "not renewed" in state["why"]
    assert state["clear"] == "fleetpatch deploy-patch --patch spec-path-beacon --break-lock --hosts h1"
    refused = steps.deploy(job(lh)[0], lh.host())
    assert refused.status == "locked" and "dead fleetpatch run" in refused.message
    assert refused.message.splitlines()[-1].strip() == \
        "fleetpatch deploy-patch --patch spec-path-beacon --break-lock --hosts h1"
    assert lh.lock.exists(), "a dead run's lock is still only cleared by --break-lock"


def test_a_broken_and_retaken_lock_is_not_renewed_by_the_old_holder(lh):
    """--break-lock makes a new lock file; the old holder's thread touches only its own."""
    base, probe, apply, follow = requests(lh)
    probe["lock"].update(renew_s=RENEW)
    a = Agent(lh)
    a.request(probe)
    assert a.result()["locked"]
    b_job, host = job(lh, break_lock=True, lock_renew_s=60)
    with remote.Remote(host, transport=b_job.transport(host)) as rb:
        lock = steps.HostLock(rb, host, b_job, "deploy-patch --patch spec-path-beacon")
        lock.probe([], content=False)
        os.utime(lh.lock, (time.time() - 30, time.time() - 30))
        time.sleep(4 * RENEW)
        assert time.time() - lh.lock.stat().st_mtime > 25, "the old holder did not touch the new lock"
        view = lockview.assess(dict(rb.call("probe", steps.base_request(host, b_job))["lock"]))
        assert view.alive and view.holder == b_job.holder
        lock.__exit__(None, None, None)
    assert not lh.lock.exists()
    a.vanish()
