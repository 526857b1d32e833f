"""A host with three servers on one install (`servers:`) behind the real sglang-router,
next to a plain host, under continuous traffic: the rollout drops no request, and the
host's servers leave the router one at a time (never two of them out at once), each
drained before its SIGTERM and put back before the next one leaves."""
from __future__ import annotations

import threading
import time

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from support.paths import sha256
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.loadgen import CUT, FAILED, OK, LoadGen
from fleetpatch_demo.routerproc import RouterProcess, router_command
from fleetpatch_demo.wheels import sglang_tree
from fleetpatch.router import Router, RouterError

pytestmark = [needs_fleet,
              pytest.mark.skipif(router_command() is None, reason="sglang-router is not installed (test extra)")]

MULTI, PLAIN = "m3", "p1"
SERVERS = ["s0", "s1", "s2"]
EAGLE = "sglang/srt/speculative/eagle_worker.py"
SERVER_ENV = {"FLEETPATCH_STANDIN_TOKEN_SECONDS": "0.02", "FLEETPATCH_STANDIN_SIGTERM_POLL": "0.2"}
TOKENS = (10, 60, 150)          # 0.2 s, 1.2 s, 3 s: two of three outlast the 1 s stop grace


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    specs = [HostSpec(MULTI, servers=3, startup_delay=0.3, env=SERVER_ENV),
             HostSpec(PLAIN, spec_v2=True, startup_delay=0.3, env=SERVER_ENV)]
    with Fleet(tmp_path_factory.mktemp("srvrouter"), specs) as f:
        yield f


@pytest.fixture(scope="module")
def router(fleet, tmp_path_factory):
    with RouterProcess(tmp_path_factory.mktemp("router") / "router.log") as rp:
        yield rp


@pytest.fixture
def op(fleet, router, tmp_path):
    fleet.reset_all()
    r = Router(router.url)
    listed = {w.url for w in r.list_workers()}
    for url in fleet.worker_urls().values():
        if url not in listed:
            r.add(url, timeout=20)
    op = Operator(fleet, tmp_path)
    doc = op.inventory()
    doc["defaults"]["router"] = {"urls": [router.url]}
    doc["defaults"]["server"]["restart"]["stop_grace"] = 1
    doc["hosts"][PLAIN]["server"]["url"] = fleet.hosts[PLAIN].worker_url()   # the servers carry theirs
    op.write_inventory(doc)
    return op


class Watcher:
    """The router's healthy workers, polled every 50 ms while a rollout runs."""

    def __init__(self, url: str):
        self.router = Router(url, http_timeout=2)
        self.samples: list[tuple[float, set]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic(), {w.url for w in self.router.list_workers()
                                                        if w.healthy is not False}))
            except RouterError:
                pass
            self.stop.wait(0.05)


def sigterm_remaining(text: str) -> list:
    """For each SIGTERM in a server's log: how many requests it still had."""
    out = []
    for part in text.split("SIGTERM received")[1:]:
        tail = part.split("Remaining number of requests ", 1)
        out.append(int(tail[1].split(".")[0]) if len(tail) == 2 else None)
    return out


def test_a_rollout_under_traffic_takes_the_hosts_servers_out_one_at_a_time_and_drops_nothing(op, fleet, router):
    h = fleet.hosts[MULTI]
    mine = {s: h.worker_url(s) for s in SERVERS}
    watcher = Watcher(router.url)
    watcher.thread.start()
    with LoadGen(router.url, concurrency=8, stream_share=0.5, tokens=TOKENS, max_seconds=170) as lg:
        time.sleep(1.0)
        run = op.run("rollout", "--patch", "dynamic-spec-disable", "--group", "all", "--canary", "0",
                     "--batch", "2", timeout=170)
        time.sleep(0.5)
        counts = lg.stop()
    watcher.stop.set()
    watcher.thread.join(5)

    assert run.code == 0, run
    assert run.report["stages"] == [[MULTI, PLAIN]]   # both hosts in one batch: p1 out alongside one server of m3
    host = run.host(MULTI)
    assert host["status"] == "verified", host["message"]
    assert run.host(PLAIN)["status"] == "verified"
    for s in SERVERS:
        r = host["servers"][s]["router"]
        assert host["servers"][s]["status"] == "verified", (s, host["servers"][s]["message"])
        assert r["removed"] and r["readded"] and r["drained_s"] is not None, (s, r)
    assert sha256(h.site_packages / EAGLE) != sha256(sglang_tree("0.5.9") / EAGLE)

    # not one request lost, streams included
    assert counts["in_flight"] == 0
    assert counts[FAILED] == 0 and counts[CUT] == 0, (counts, [o.detail for o in lg.bad()])
    assert counts[OK] == counts["sent"] >= 30 and counts["streams"] >= 15, counts

    # one at a time: never two of m3's servers out of the router, and each of them out once, in order
    samples = watcher.samples
    assert len(samples) > 50, len(samples)
    out = [[s for s in SERVERS if mine[s] not in listed] for _, listed in samples]
    assert max(len(o) for o in out) == 1, [o for o in out if len(o) > 1][:3]
    seen = [o[0] for o in out if o]
    assert [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s] == SERVERS, seen
    assert any(fleet.hosts[PLAIN].worker_url() not in listed for _, listed in samples), "p1 left too"
    assert len(mine) + 1 == len(samples[-1][1]) and set(mine.values()) <= samples[-1][1], "all back at the end"

    # each server drained before its SIGTERM: the drain waited for what was in flight, none was left
    assert max(host["servers"][s]["router"]["in_flight_at_removal"] for s in SERVERS) > 0
    for s in SERVERS:
        remaining = sigterm_remaining(h.log_of(s).read_text(errors="replace"))
        assert remaining and all(n == 0 for n in remaining), (s, remaining)
    print("servers-host rollout under traffic:", counts, f"{len(samples)} router samples")


def test_a_server_the_router_does_not_list_refuses_the_run_before_any_server_is_touched(op, fleet, router):
    """Every server's url must be the one the router lists, not only the first's: a second
    server written with a trailing slash would be drained under a name the router does not
    know (so never drained: its streams cut at the SIGTERM), then added as a worker of its own."""
    doc = op.inventory()
    wrong = fleet.hosts[MULTI].worker_url("s1") + "/"
    doc["hosts"][MULTI]["servers"]["s1"]["url"] = wrong
    op.write_inventory(doc)
    pids = {s: fleet.server_pid(MULTI, s) for s in SERVERS}
    before = {w.url for w in Router(router.url).list_workers()}

    check = op.run("check-patch", "--patch", "dynamic-spec-disable", "--hosts", MULTI)
    assert check.code == 1, check
    assert check.host(MULTI)["status"] == "router-error", check.host(MULTI)
    assert f"worker {wrong} is not in its list" in check.host(MULTI)["message"], check.host(MULTI)["message"]

    for cmd in (("deploy-patch", "--hosts", MULTI), ("rollout", "--group", "all", "--canary", "0", "--batch", "2")):
        run = op.run(cmd[0], "--patch", "dynamic-spec-disable", *cmd[1:])
        assert run.code == 2, run
        assert f"{MULTI} server s1: router {router.url}: worker {wrong} is not in its list" in run.output, run.output
    assert {s: fleet.server_pid(MULTI, s) for s in SERVERS} == pids
    assert sha256(fleet.hosts[MULTI].site_packages / EAGLE) == sha256(sglang_tree("0.5.9") / EAGLE)
    assert {w.url for w in Router(router.url).list_workers()} == before, "no worker added under the wrong url"
