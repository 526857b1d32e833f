"""A host with four SGLang servers on one install (`servers:` in the inventory), on a real
sshd host driven through the CLI: the install is patched and rolled back once, each server
is restarted and judged on its own (its own pid, its own log, its own row in status), and
one server that does not come back fails the host by name while the other three serve on
the patch."""
from __future__ import annotations

import json

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from support.paths import sha256
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree
from support.standin_env import QUICK_STOP

pytestmark = needs_fleet

HOST = "m4"
SERVERS = ["s0", "s1", "s2", "s3"]
FILES = ["sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"]
MARKER = "fleetpatch spec-path-beacon: EAGLEWorker ("   # the v1 path: topk 4, no SGLANG_ENABLE_SPEC_V2
PRISTINE = {f: sha256(sglang_tree("0.5.9") / f) for f in FILES}


@pytest.fixture(scope="module")
def mfleet(tmp_path_factory):
    with Fleet(tmp_path_factory.mktemp("servers"), [HostSpec(HOST, servers=4, env=QUICK_STOP), HostSpec("p1", env=QUICK_STOP)]) as f:
        yield f


@pytest.fixture
def mop(mfleet, pristine, tmp_path):
    pristine.restore(mfleet)
    return Operator(mfleet, tmp_path)


def pids(fleet):
    return {s: fleet.server_pid(HOST, s) for s in SERVERS}


def installed(fleet):
    return {f: sha256(fleet.hosts[HOST].site_packages / f) for f in FILES}


def since_last_start(fleet, server: str) -> str:
    """What the server's current process wrote to its log (from its server_args line on)."""
    log = fleet.hosts[HOST].log_of(server).read_text(errors="replace")
    mine = log[log.rindex("server_args=ServerArgs("):]
    assert f"Started server process [{fleet.server_pid(HOST, server)}]" in mine, (server, mine[-2000:])
    return mine


def test_four_servers_share_one_patched_install_each_restarted_verified_and_listed_then_rolled_back(mop, mfleet):
    h = mfleet.hosts[HOST]
    before = pids(mfleet)
    assert all(before.values()) and len(set(before.values())) == 4

    run = mop.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", HOST)
    assert run.code == 0, run
    host = run.host(HOST)
    assert host["status"] == "verified", host["message"]
    assert sorted(host["servers"]) == SERVERS
    for s in SERVERS:
        assert host["servers"][s]["status"] == "verified", (s, host["servers"][s]["message"])
        assert host["servers"][s]["executed_path"] == "EAGLEWorker"
        assert host["servers"][s]["markers"][0]["text"].startswith(MARKER)
    assert "4 servers, each verified" in host["message"]
    restarts = [line.split(" restart [", 1)[1][:2] for line in run.output.splitlines() if " restart [" in line]
    assert restarts == SERVERS, run.output   # one after the other, each named in the progress

    # the install patched once: its files are the ledger's one recorded change, the marker written once
    patched = installed(mfleet)
    ledger = json.loads((h.state_dir / "ledger.json").read_text())
    entry = ledger["patches"]["spec-path-beacon"]
    assert {f: (r["before"], r["after"]) for f, r in entry["files"].items()} == \
        {f: (PRISTINE[f], patched[f]) for f in FILES}
    assert all(patched[f] != PRISTINE[f] for f in FILES)
    assert (h.site_packages / FILES[0]).read_text().count('f"fleetpatch spec-path-beacon: EAGLEWorker (') == 1
    assert len(mfleet.commands(HOST)) == 1, "one agent process on the host did the write and all four restarts"

    # each server restarted: a new process of its own, its marker in its own log, once
    after = pids(mfleet)
    assert all(after.values()) and len(set(after.values())) == 4 and not set(after.values()) & set(before.values())
    for s in SERVERS:
        assert ledger["servers"][s]["last_restart"]["pid"] == after[s]
        mine = since_last_start(mfleet, s)
        assert f"port={h.port_of(s)}," in mine, s   # its own port, in its own log
        assert mine.count(MARKER) == 1, s
        assert h.log_of(s).read_text(errors="replace").count(MARKER) == 1, s
        assert mfleet.healthy(HOST, server=s)
    assert mfleet.healthy("p1") and installed_p1_pristine(mfleet)

    # status: one row per server, each with its own process and its last verification
    st = mop.run("status")
    assert st.code == 0, st
    rows = [line for line in st.output.splitlines() if f"{HOST} [" in line]
    assert [r.split("[")[1][:2] for r in rows] == SERVERS, st.output
    assert all("verified: deploy check of spec-path-beacon@1" in r for r in rows), st.output
    assert {s: v["server_pid"] for s, v in st.host(HOST)["servers"].items()} == after
    assert all(v["server_up"] for v in st.host(HOST)["servers"].values())

    # rollback: the originals back byte for byte, every server restarted without the marker
    rb = mop.run("rollback", "--hosts", HOST)
    assert rb.code == 0, rb
    host = rb.host(HOST)
    assert host["status"] == "rolled-back", host["message"]
    assert {s: v["status"] for s, v in host["servers"].items()} == {s: "rolled-back" for s in SERVERS}
    assert installed(mfleet) == PRISTINE
    back = pids(mfleet)
    assert all(back.values()) and not set(back.values()) & set(after.values())
    for s in SERVERS:
        assert MARKER not in since_last_start(mfleet, s), s
        assert mfleet.healthy(HOST, server=s)
    assert "spec-path-beacon" not in json.loads((h.state_dir / "ledger.json").read_text())["patches"]


def installed_p1_pristine(fleet) -> bool:
    return {f: sha256(fleet.hosts["p1"].site_packages / f) for f in FILES} == PRISTINE


def test_one_server_of_four_that_does_not_come_back_fails_the_host_naming_it_and_the_others_serve(mop, mfleet):
    doc = mop.inventory()
    doc["hosts"][HOST]["servers"]["s2"]["restart"]["env"] = {"FLEETPATCH_STANDIN_CRASH_AFTER_INIT": "1"}
    mop.write_inventory(doc)
    before = pids(mfleet)

    run = mop.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", HOST, "--timeout", "20")
    assert run.code == 1, run
    host = run.host(HOST)
    assert host["ok"] is False
    assert f"{HOST}: 1 of 4 servers failed: s2 (" in host["message"], host["message"]
    assert run.output.splitlines()[-1].startswith(f"FAILED on 1 of 1 host: {HOST} (restart-failed)"), run.output
    bad = host["servers"]["s2"]
    assert bad["ok"] is False and host["status"] == bad["status"] == "restart-failed", host["message"]
    assert "RuntimeError: CUDA error" in bad["message"], bad["message"]   # its own log's tail, not another's

    # the other three, before and after it, restarted on the patch and verified
    after = pids(mfleet)
    for s in ("s0", "s1", "s3"):
        assert host["servers"][s]["status"] == "verified", (s, host["servers"][s]["message"])
        assert after[s] and after[s] != before[s]
        assert since_last_start(mfleet, s).count(MARKER) == 1, s
        assert mfleet.healthy(HOST, server=s)
    assert after["s2"] is None and not mfleet.healthy(HOST, server="s2")
    assert installed(mfleet) != PRISTINE, "--on-failure keep (deploy-patch's default): the install stays patched"

    # status names the server that is down, and fails the host for it
    st = mop.run("status", "--hosts", HOST)
    assert st.code == 1, st
    servers = st.host(HOST)["servers"]
    assert not servers["s2"]["server_up"] and all(servers[s]["server_up"] for s in ("s0", "s1", "s3"))
    assert "s2" in st.host(HOST)["message"], st.host(HOST)["message"]

    # the way back: the cause fixed, the same deploy again restarts only s2; the others keep running
    del doc["hosts"][HOST]["servers"]["s2"]["restart"]["env"]
    mop.write_inventory(doc)
    again = mop.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", HOST)
    assert again.code == 0, again
    statuses = {s: v["status"] for s, v in again.host(HOST)["servers"].items()}
    assert statuses == {"s0": "already-applied", "s1": "already-applied", "s2": "verified", "s3": "already-applied"}
    now = pids(mfleet)
    assert now["s2"] and {s: now[s] for s in ("s0", "s1", "s3")} == {s: after[s] for s in ("s0", "s1", "s3")}
    assert since_last_start(mfleet, "s2").count(MARKER) == 1 and mfleet.healthy(HOST)


def test_the_bake_watches_every_server_and_one_that_dies_during_it_fails_the_host_naming_it(mop, mfleet):
    """--bake watches each server of the host at once, not only the first: s3 dies 3 s after
    it is ready, inside the 6 s bake that follows its verification."""
    doc = mop.inventory()
    doc["hosts"][HOST]["servers"]["s3"]["restart"]["env"] = {"FLEETPATCH_STANDIN_EXIT_AFTER_READY": "3"}
    mop.write_inventory(doc)
    run = mop.run("rollout", "--patch", "spec-path-beacon", "--hosts", HOST, "--canary", "0", "--bake", "6",
                  "--on-failure", "keep")
    assert run.code == 1, run
    host = run.host(HOST)
    assert host["bake"]["ok"] is False, host
    assert "failed during the bake (--bake 6)" in host["message"] and "server s3" in host["message"], host["message"]
    assert {s: v["status"] for s, v in host["servers"].items()} == {s: "verified" for s in SERVERS}, \
        "each server verified before the bake"
    assert mfleet.server_pid(HOST, "s3") is None and all(mfleet.server_pid(HOST, s) for s in ("s0", "s1", "s2"))

