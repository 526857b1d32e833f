"""A 2-node server (`nodes:`) behind the real sglang-router, next to a plain host, under
continuous traffic: rank 0 (the only one that serves HTTP) is drained out of the router
before any rank stops and put back once every rank has passed, rank 1 is never in the
router, and not one request is dropped."""
from __future__ import annotations

import time

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.loadgen import CUT, FAILED, OK, LoadGen
from fleetpatch_demo.routerproc import RouterProcess, router_command
from fleetpatch.router import Router

pytestmark = [needs_fleet,
              pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")]

SERVER_ENV = {"FLEETPATCH_STANDIN_TOKEN_SECONDS": "0.02", "FLEETPATCH_STANDIN_SIGTERM_POLL": "0.2"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    specs = [HostSpec("b0", node_group="g2", startup_delay=0.3, env=SERVER_ENV),
             HostSpec("b1", node_group="g2", startup_delay=0.3, env=SERVER_ENV),
             HostSpec("p1", startup_delay=0.3, env=SERVER_ENV)]
    with Fleet(tmp_path_factory.mktemp("nodesrouter"), specs) as f:
        yield f


def test_a_rollout_under_traffic_drains_rank_0_and_drops_nothing(fleet, tmp_path_factory, tmp_path):
    with RouterProcess(tmp_path_factory.mktemp("router") / "router.log") as router:
        r = Router(router.url)
        for name in ("b0", "p1"):
            r.add(fleet.hosts[name].worker_url(), timeout=20)
        op = Operator(fleet, tmp_path)
        doc = op.inventory()
        doc["defaults"]["router"] = {"urls": [router.url]}
        doc["defaults"]["server"]["restart"]["stop_grace"] = 1
        for name in ("b0", "b1", "p1"):
            doc["hosts"][name]["server"]["url"] = fleet.hosts[name].worker_url()
        op.write_inventory(doc)
        with LoadGen(router.url, concurrency=6, stream_share=0.5, tokens=(10, 60), max_seconds=120) as lg:
            time.sleep(1.0)
            run = op.run("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "0",
                         "--batch", "1", timeout=120)
            time.sleep(0.5)
            counts = lg.stop()
        listed = {w.url for w in r.list_workers()}

    assert run.code == 0, run
    assert run.report["stages"] == [["b0", "b1"], ["p1"]]
    assert {n: run.host(n)["status"] for n in ("b0", "b1", "p1")} == dict.fromkeys(("b0", "b1", "p1"), "verified")
    b0 = run.host("b0")["router"]
    assert b0["removed"] and b0["readded"] and b0["drained_s"] is not None, b0
    assert "router" not in run.host("b1"), "rank 1 serves no HTTP: no router lists it"
    assert listed == {fleet.hosts["b0"].worker_url(), fleet.hosts["p1"].worker_url()}
    assert counts["in_flight"] == 0
    assert counts[FAILED] == 0 and counts[CUT] == 0, (counts, [o.detail for o in lg.bad()])
    assert counts[OK] == counts["sent"] >= 20, counts
    print("node-group rollout under traffic:", counts)
    log = fleet.hosts["b0"].log_path.read_text(errors="replace")
    assert "Remaining number of requests 0" in log.split("SIGTERM received")[-1], "rank 0 drained before its stop"
