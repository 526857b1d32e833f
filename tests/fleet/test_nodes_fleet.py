"""One SGLang server on two hosts (`nodes:` in the inventory, --nnodes 2), on real sshd hosts
driven through the CLI: every rank is checked before any is written, every rank is stopped
before any is started, every rank is judged on its own log and probe records, and a failure
on any rank fails (and with --on-failure rollback undoes) the whole group."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from support.paths import FIXTURE_PATCHES, sha256
from support.standin_env import QUICK_STOP
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree

pytestmark = needs_fleet

GROUP, RANKS = "kimi-2n", ["b0", "b1"]
FILES = ["sglang/srt/speculative/eagle_worker.py", "sglang/srt/speculative/eagle_worker_v2.py"]
MARKER = "fleetpatch spec-path-beacon: EAGLEWorker ("
PRISTINE = {f: sha256(sglang_tree("0.5.9") / f) for f in FILES}


@pytest.fixture(scope="module")
def nfleet(tmp_path_factory):
    specs = [HostSpec("b0", node_group=GROUP, env=QUICK_STOP), HostSpec("b1", node_group=GROUP, env=QUICK_STOP),
             HostSpec("p1", env=QUICK_STOP)]
    with Fleet(tmp_path_factory.mktemp("nodes"), specs) as f:
        yield f


@pytest.fixture
def nop(nfleet, pristine, tmp_path):
    pristine.restore(nfleet)
    return Operator(nfleet, tmp_path)


def installed(fleet, name):
    return {f: sha256(fleet.hosts[name].site_packages / f) for f in FILES}


def since_last_start(fleet, name: str) -> str:
    log = fleet.hosts[name].log_path.read_text(errors="replace")
    return log[log.rindex("server_args=ServerArgs("):]


def pids(fleet):
    return {n: fleet.server_pid(n) for n in RANKS}


def test_a_node_group_is_deployed_verified_on_every_rank_and_rolled_back(nop, nfleet):
    before = pids(nfleet)
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP)
    assert run.code == 0, run
    after = pids(nfleet)
    for rank, name in enumerate(RANKS):
        host = run.host(name)
        assert host["status"] == "verified", host["message"]
        assert (host["node_group"], host["node_rank"]) == (GROUP, rank)
        assert host["executed_path"] == "EAGLEWorker"
        # each rank proven by its own process: the probe's records of the worker it built
        ex = host["execution"]
        assert ex["pids"] == [after[name]] and ex["ran"]["sglang/srt/speculative/eagle_worker.py"], ex
        assert installed(nfleet, name) != PRISTINE and installed(nfleet, name) == installed(nfleet, "b0")
        mine = since_last_start(nfleet, name)
        assert mine.count(MARKER) == 1 and f" TP{rank}] " in mine.split(MARKER)[0].rsplit("\n", 1)[-1], name
        assert len(nfleet.commands(name)) == 1, "one agent process per rank"
    assert not set(after.values()) & set(before.values())
    assert "Dummy health check server started" in since_last_start(nfleet, "b1")
    assert installed(nfleet, "p1") == PRISTINE and "p1" not in run.report["hosts"]

    # verify-logs judges every rank again, rank 1 by its own up line
    vl = nop.run("verify-logs", "--group", GROUP)
    assert vl.code == 0, vl
    assert {n: vl.host(n)["status"] for n in RANKS} == {n: "verified" for n in RANKS}

    rb = nop.run("rollback", "--group", GROUP)
    assert rb.code == 0, rb
    assert {n: rb.host(n)["status"] for n in RANKS} == {n: "rolled-back" for n in RANKS}
    for name in RANKS:
        assert installed(nfleet, name) == PRISTINE
        assert MARKER not in since_last_start(nfleet, name)
    back = pids(nfleet)
    assert all(back.values()) and not set(back.values()) & set(after.values())
    assert nfleet.healthy("b0")


def test_a_command_that_changes_hosts_takes_every_rank_or_none(nop, nfleet):
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "b1")
    assert run.code == 2, run
    assert "node group kimi-2n (b0, b1) without b0 (rank 0)" in run.output and "--group kimi-2n" in run.output
    assert all(installed(nfleet, n) == PRISTINE for n in RANKS)
    assert nfleet.commands("b0") == nfleet.commands("b1") == [], "no host contacted"
    st = nop.run("status", "--hosts", "b1")   # reading one rank is fine
    assert st.code == 0 and st.host("b1")["node_rank"] == 1, st


def test_a_rank_unreachable_at_the_start_leaves_the_group_untouched(nop, nfleet):
    doc = nop.inventory()
    doc["hosts"]["b1"]["port"] = 1   # nothing listens there
    nop.write_inventory(doc)
    before = pids(nfleet)
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP)
    assert run.code == 1, run
    assert run.host("b1")["status"] == "unreachable"
    b0 = run.host("b0")
    assert b0["status"] == "skipped" and "because rank 1 (b1) is unreachable" in b0["message"], b0["message"]
    assert installed(nfleet, "b0") == PRISTINE and pids(nfleet) == before
    assert not (nfleet.hosts["b0"].state_dir / "ledger.json").exists() or \
        "spec-path-beacon" not in (nfleet.hosts["b0"].state_dir / "ledger.json").read_text()


def test_ranks_that_run_different_sglang_versions_are_refused_before_any_is_changed(nop, nfleet):
    meta = nfleet.hosts["b1"].site_packages / "sglang-0.5.9.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.5.9\n", "Version: 0.5.10\n", 1))
    before = pids(nfleet)
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP)
    assert run.code == 1, run
    b0 = run.host("b0")
    assert "node group kimi-2n's hosts run different engine versions (rank 0 (b0) 0.5.9, rank 1 (b1) 0.5.10)" \
        in b0["message"], b0["message"]
    assert run.host("b1")["status"] == "skipped" and "because rank 0 (b0) is error" in run.host("b1")["message"]
    assert all(installed(nfleet, n) == PRISTINE for n in RANKS) and pids(nfleet) == before


def test_a_rank_that_dies_after_the_restart_fails_the_group_naming_it_and_every_rank_is_rolled_back(nop, nfleet):
    doc = nop.inventory()
    doc["hosts"]["b1"]["server"]["restart"]["env"]["FLEETPATCH_STANDIN_FAIL_RANK"] = "1"
    nop.write_inventory(doc)
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP, "--on-failure", "rollback",
                  "--timeout", "30")
    assert run.code == 1, run
    b0, b1 = run.host("b0"), run.host("b1")
    assert "node group kimi-2n failed: rank 1 (b1)" in b0["message"], b0["message"]
    assert "rank 1 (b1)" in b1["message"] and b1["node_group_failed"].startswith("rank 1 (b1)"), b1["message"]
    assert b0["status"] == "rolled-back" and b0["rollback"]["ok"], b0["message"]
    # rank 1 dies again after the rollback's restart (the fault is in its environment), and says so
    assert b1["status"] == "restart-failed" and b1["rollback"]["ok"] is False, b1["message"]
    assert "Scheduler hit an exception" in b1["message"]
    for name in RANKS:
        assert installed(nfleet, name) == PRISTINE, name
        assert "spec-path-beacon" not in json.loads((nfleet.hosts[name].state_dir / "ledger.json").read_text())[
            "patches"]
    assert nfleet.healthy("b0"), "rank 0 serves on, without the patch"


def _deploy_until(nop, line: str, sig: int, command=("deploy-patch", "--patch", "spec-path-beacon")
                  ) -> subprocess.CompletedProcess:
    """deploy-patch (or `command`) of the group, sent `sig` once its progress shows `line`."""
    argv = [sys.executable, "-m", "fleetpatch", *command, "--group", GROUP]
    proc = subprocess.Popen(argv, cwd=nop.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**__import__("os").environ, "COLUMNS": "200"})
    seen = []
    for out in proc.stdout:
        seen.append(out)
        if line in out:
            proc.send_signal(sig)
            break
    rest, _ = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(seen) + rest)


def test_a_run_killed_between_the_ranks_restarts_is_finished_by_the_next_deploy(nop, nfleet):
    cut = _deploy_until(nop, "restart stop rank 0", signal.SIGKILL)
    assert cut.returncode == -signal.SIGKILL, cut.stdout
    time.sleep(1)   # the agents see their sessions end
    # nothing half-patched: both ranks hold the same written install, rank 1 stopped with its restart pending
    assert installed(nfleet, "b0") == installed(nfleet, "b1") != PRISTINE
    ledger = json.loads((nfleet.hosts["b1"].state_dir / "ledger.json").read_text())
    assert ledger["restart_pending"] is True and nfleet.server_pid("b1") is None

    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP)
    assert run.code == 0, run
    assert {n: run.host(n)["status"] for n in RANKS} == {n: "verified" for n in RANKS}
    assert "restart pending from an earlier run" in run.output
    assert all(pids(nfleet).values())


def test_a_rollback_killed_between_the_ranks_restarts_is_finished_by_the_next_rollback(nop, nfleet):
    assert nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP).code == 0
    cut = _deploy_until(nop, "restart stop rank 0", signal.SIGKILL, command=("rollback",))
    assert cut.returncode == -signal.SIGKILL, cut.stdout
    time.sleep(1)
    assert installed(nfleet, "b0") == installed(nfleet, "b1") == PRISTINE   # both restored before any stop
    assert nfleet.server_pid("b1") is None

    run = nop.run("rollback", "--group", GROUP)
    assert run.code == 0, run
    assert {n: run.host(n)["status"] for n in RANKS} == {n: "rolled-back" for n in RANKS}, run.output
    assert all(pids(nfleet).values())
    for name in RANKS:
        assert MARKER not in since_last_start(nfleet, name), name


def test_ctrl_c_between_the_ranks_restarts_lets_the_group_finish(nop, nfleet):
    cut = _deploy_until(nop, "restart stop rank 0", signal.SIGINT)
    assert cut.returncode == 130, cut.stdout
    assert "interrupted (Ctrl-C)" in cut.stdout
    # the group in flight was let finish: both ranks restarted on the patch and verified
    assert installed(nfleet, "b0") == installed(nfleet, "b1") != PRISTINE
    assert all(pids(nfleet).values())
    for name in RANKS:
        assert MARKER in since_last_start(nfleet, name), name
    again = nop.run("rollback", "--group", GROUP)
    assert again.code == 0, again
    assert all(installed(nfleet, n) == PRISTINE for n in RANKS)


def test_a_rollout_counts_a_node_group_as_one_unit(nop, nfleet):
    run = nop.run("rollout", "--patch", "spec-path-beacon", "--group", "all", "--canary", "1", "--batch", "1")
    assert run.code == 0, run
    assert run.report["stages"] == [["b0", "b1"], ["p1"]]   # the group is the canary, then p1
    assert {n: run.host(n)["status"] for n in ["b0", "b1", "p1"]} == {n: "verified" for n in ["b0", "b1", "p1"]}


def ledger_of(fleet, name):
    return json.loads((fleet.hosts[name].state_dir / "ledger.json").read_text())


def test_a_rank_whose_write_fails_under_on_failure_rollback_leaves_no_rank_said_restarted_or_pending(nop, nfleet):
    """rank 1's file is immutable: its write fails after rank 0's. Rank 0 is restored before any
    restart: it never ran the patch, so it is not said to be restarted, nor left restart-pending."""
    before = pids(nfleet)
    target = nfleet.hosts["b1"].site_packages / FILES[1]
    subprocess.run(["chattr", "+i", str(target)], check=True)
    try:
        run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP, "--on-failure", "rollback")
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    assert run.code == 1, run
    b0, b1 = run.host("b0"), run.host("b1")
    assert b0["status"] == "rolled-back" and "written, then restored to its originals" in b0["message"], b0["message"]
    for host in (b0, b1):
        assert "restarted without the patch" not in host["message"], host["message"]
    assert b1["status"] != "rolled-back" and "rank 1 (b1)" in b0["message"], b1["message"]
    assert pids(nfleet) == before, "no rank was restarted"
    for name in RANKS:
        assert installed(nfleet, name) == PRISTINE, name
        ledger = ledger_of(nfleet, name)
        assert "spec-path-beacon" not in ledger["patches"] and not ledger["restart_pending"], (name, ledger)


def test_a_rank_that_cannot_start_leaves_the_ranks_started_before_it_said_started(nop, nfleet):
    """rank 1's start command cannot run: rank 0 was started (on the patch) before it, and its result
    says so, not that the group was not restarted; the same in the rollback that follows."""
    doc = nop.inventory()
    restart = doc["hosts"]["b1"]["server"]["restart"]
    restart["start"] = "/nonexistent/python3 " + restart["start"].split(" ", 1)[1]
    nop.write_inventory(doc)
    run = nop.run("deploy-patch", "--patch", "spec-path-beacon", "--group", GROUP, "--timeout", "20",
                  "--on-failure", "rollback")
    assert run.code == 1, run
    b0, b1 = run.host("b0"), run.host("b1")
    assert b1["status"] == "restart-failed" and "/nonexistent/python3" in b1["message"], b1["message"]
    assert "was not restarted" not in b0["message"], b0["message"]
    assert "started on spec-path-beacon@1, but node group kimi-2n is not whole: the start of rank 1 (b1) failed" \
        in b0["message"], b0["message"]
    assert "started without spec-path-beacon@1" in b0["rollback"]["message"], b0["rollback"]
    assert "the files are restored on every rank" in b0["rollback"]["message"], b0["rollback"]
    assert all(installed(nfleet, name) == PRISTINE for name in RANKS)


def test_a_line_that_runs_per_request_is_proven_on_every_rank_by_rank_0s_smoke_request(nop, nfleet):
    """forward-quiet (lines only in forward_batch_generation, no markers) with both ranks started
    with --skip-server-warmup: no line runs before rank 0's smoke request, which every rank's worker
    serves (rank 0 sends each scheduler step to rank 1). Rank 0 takes 4 s more to get ready than
    rank 1 takes to log its up line, so rank 1 is judged only because it keeps watching until
    rank 0's smoke request was answered: it ran the line for that request, proved by `smoke`."""
    doc = nop.inventory()
    for name in RANKS:
        doc["hosts"][name]["server"]["restart"]["start"] += " --skip-server-warmup"
    doc["hosts"]["b0"]["server"]["restart"]["env"]["FLEETPATCH_STANDIN_STARTUP_DELAY"] = "4"
    nop.write_inventory(doc)
    run = nop.run("deploy-patch", "--patch", "forward-quiet", "--patches", str(FIXTURE_PATCHES), "--group", GROUP)
    assert run.code == 0, run
    for name in RANKS:
        host = run.host(name)
        assert host["status"] == "verified", host["message"]
        ex = host["execution"]
        assert ex["ran"].get("sglang/srt/speculative/eagle_worker.py"), ex
        assert ex["proved_by"] == "smoke", (name, ex)
    assert run.host("b0")["smoke"]["statuses"] == [200], run.host("b0")
    rb = nop.run("rollback", "--group", GROUP)
    assert rb.code == 0, rb
    assert rb.host("b0")["smoke"]["statuses"] == [200], rb.host("b0")   # after the rollback's restart too
    assert all(installed(nfleet, n) == PRISTINE for n in RANKS)
