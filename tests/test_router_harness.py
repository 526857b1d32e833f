"""The building blocks of a drained rollout, proven with the real router under load.

Three stand-in workers behind the real sglang-router (round_robin); a load
generator sends a steady mix of streaming and plain requests, many longer
than the 1 s stop grace. Each worker in turn is restarted:

* naively, as fleetpatch restarts today: SIGTERM, SIGKILL after stop_grace,
  start. The router keeps routing to it (it health-checks every 60 s), and
  0.5.9's SIGTERM keeps accepting new requests, so the worker never drains:
  in-flight streams are cut.
* drained: out of the router (confirmed gone from its list), wait until the
  worker's own /v1/loads shows no running and no waiting request, SIGTERM,
  start, back into the router (confirmed healthy). 0 failed, 0 cut.
"""
from __future__ import annotations

import re
import time

import pytest

from fleetpatch_demo.loadgen import CUT, FAILED, OK, LoadGen
from fleetpatch_demo.routerproc import LocalWorker, RouterProcess, router_command, standin_site
from fleetpatch.router import Router, worker_loads

pytestmark = pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")

STOP_GRACE = 1.0
TOKEN_SECONDS = 0.02
TOKENS = (10, 60, 150)   # 0.2 s, 1.2 s, 3 s: two of three outlast the stop grace


def _drain(worker: LocalWorker, timeout: float = 20.0) -> float:
    t0 = time.monotonic()
    while worker_loads(worker.url) != (0, 0):
        if time.monotonic() - t0 > timeout:
            raise AssertionError("worker %s did not drain in %g s" % (worker.url, timeout))
        time.sleep(0.05)
    return time.monotonic() - t0


def _restart_naive(worker: LocalWorker) -> None:
    # today's restart hits whatever the worker is serving: wait (bounded) until it serves
    # a few requests, so that the restart has something to cut and the test cannot pass by luck
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if worker_loads(worker.url)[0] >= 3:
                break
        except Exception:
            pass
        time.sleep(0.05)
    worker.stop(grace=STOP_GRACE)
    worker.start()


def _restart_drained(router: Router, worker: LocalWorker) -> dict:
    assert router.remove(worker.url, timeout=10) is not None
    assert router.find(worker.url) is None
    drained = _drain(worker)
    mark = len(worker.text_since_start())
    rc = worker.stop(grace=30)
    stopped = worker.text_since_start()[mark:]
    worker.start()
    back = router.add(worker.url, timeout=20)
    return {"drained_s": drained, "rc": rc, "stop_log": stopped, "readded": back.healthy}


def test_naive_restart_cuts_streams_and_the_drained_restart_loses_nothing(tmp_path):
    site = standin_site(tmp_path / "site")
    env = {"FLEETPATCH_STANDIN_TOKEN_SECONDS": str(TOKEN_SECONDS), "FLEETPATCH_STANDIN_SIGTERM_POLL": "0.2"}
    workers = [LocalWorker(site, tmp_path / ("w%d.log" % i), env=env) for i in range(3)]
    try:
        for w in workers:
            w.start()
        with RouterProcess(tmp_path / "router.log") as rp:
            router = Router(rp.url)
            for w in workers:
                router.add(w.url, timeout=20)

            # naive: today's restart, one worker after the other
            with LoadGen(rp.url, concurrency=9, stream_share=0.5, tokens=TOKENS, max_seconds=120) as lg:
                time.sleep(1.5)
                for w in workers:
                    _restart_naive(w)
                    time.sleep(1.0)
                naive = lg.stop()
            assert naive["in_flight"] == 0
            assert naive[CUT] + naive[FAILED] > 0, naive
            assert naive[CUT] > 0, (naive, [o.detail for o in lg.bad()])
            assert all(o.stream for o in lg.bad() if o.result == CUT)
            assert sorted(w.url for w in router.list_workers()) == sorted(w.url for w in workers)

            # drained: out of the router, wait for /v1/loads to show zero, SIGTERM, start, back in
            with LoadGen(rp.url, concurrency=9, stream_share=0.5, tokens=TOKENS, max_seconds=120) as lg:
                time.sleep(1.5)
                steps = []
                for w in workers:
                    steps.append(_restart_drained(router, w))
                    time.sleep(1.0)
                drained = lg.stop()
            assert drained["in_flight"] == 0
            assert drained[FAILED] == 0 and drained[CUT] == 0, (drained, [o.detail for o in lg.bad()])
            assert drained[OK] == drained["sent"] >= 30 and drained["streams"] >= 15, drained
            for w, step in zip(workers, steps):
                assert step["rc"] == 0 and step["readded"] is True, step
                # no worker got SIGTERM while it still had a request in flight
                first = re.search(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)", step["stop_log"])
                assert first and first.group(1) == "0", step["stop_log"][-1500:]
                # back in rotation: the restarted worker served requests after it was put back
                assert '"POST /generate HTTP/1.1" 200' in w.text_since_start().split(
                    "The server is fired up and ready to roll!", 1)[1]
            assert sorted(w.url for w in router.list_workers()) == sorted(w.url for w in workers)
            assert all(w.healthy for w in router.list_workers())
            print("naive:", naive, "drained:", drained,
                  "drain seconds:", [round(s["drained_s"], 2) for s in steps])
    finally:
        for w in workers:
            w.stop(grace=5)
