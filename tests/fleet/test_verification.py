"""Did the patched path execute? The motivating failure and every way a
restart can go wrong, end to end on the real sshd fleet and the stand-in."""
from __future__ import annotations

import json

import pytest

from support.marks import needs_fleet
from support.paths import FIXTURE_PATCHES, sha256
from fleetpatch_demo.wheels import sglang_tree

pytestmark = needs_fleet

EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
FIX = ("--patches", str(FIXTURE_PATCHES))


def host_file(fleet, name, rel):
    return fleet.hosts[name].site_packages / rel


def set_env(operator, host, **env):
    doc = operator.inventory()
    doc["hosts"][host]["server"]["restart"]["env"].update(env)
    operator.write_inventory(doc)


def test_motivating_failure_is_stopped_before_anything_is_written(operator, fleet):
    """A v2-only patch on a server without SGLANG_ENABLE_SPEC_V2 and with topk 4."""
    before = sha256(host_file(fleet, "v1a", EAGLE_V2))
    pid = fleet.server_pid("v1a")
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "v1a")
    assert run.code == 1, run
    h = run.host("v1a")
    assert h["status"] == "not-executed"
    assert h["executed_path"] == "EAGLEWorker"
    assert "SGLANG_ENABLE_SPEC_V2" in h["message"]
    assert "eagle_worker.py" in h["message"]
    assert "--force" in h["message"]
    assert sha256(host_file(fleet, "v1a", EAGLE_V2)) == before
    assert fleet.server_pid("v1a") == pid
    check = operator.run("check-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "v1a")
    assert check.code == 1 and check.host("v1a")["status"] == "not-executed", check


def test_motivating_failure_forced_fails_verification_loudly(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "v1a", "--force",
                       "--timeout", "30")
    assert run.code == 1, run
    h = run.host("v1a")
    assert h["status"] == "not-executed"
    assert h["executed_path"] == "EAGLEWorker"
    assert h["markers"] == []
    assert sha256(host_file(fleet, "v1a", EAGLE_V2)) != sha256(sglang_tree("0.5.9") / EAGLE_V2), "it was deployed"
    assert not (fleet.hosts["v1a"].state_dir / "lock").exists(), "--on-failure keep releases the lock"
    out = run.output
    assert "FAIL v1a" in out and "never executed" in out
    assert "the server runs EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in out
    assert "Overlap scheduler is disabled when spec v2 is off" in out
    assert "SGLANG_ENABLE_SPEC_V2 is not set" in out
    assert "marker for EAGLEWorkerV2" in out or "EAGLEWorkerV2" in out
    assert "FAILED on 1 of 1 host: v1a (not-executed)" in out.splitlines()[-1]
    # verify-logs reaches the same verdict from the log since fleetpatch's restart
    again = operator.run("verify-logs", "--hosts", "v1a", *FIX, "--timeout", "10")
    assert again.code == 1, again
    assert again.host("v1a")["status"] == "not-executed"
    assert again.host("v1a")["executed_path"] == "EAGLEWorker"


def test_the_same_one_path_patch_verifies_where_its_path_runs(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "v2a")
    assert run.code == 0, run
    assert run.host("v2a")["status"] == "verified"
    assert run.host("v2a")["executed_path"] == "EAGLEWorkerV2"


def test_spec_v2_with_topk_4_fails_fast_as_restart_failed(operator, fleet):
    set_env(operator, "v1b", SGLANG_ENABLE_SPEC_V2="True")
    before, pid = sha256(host_file(fleet, "v1b", EAGLE)), fleet.server_pid("v1b")
    # the running server was started without spec v2, but the restart uses the inventory's env,
    # with which it would not start: refused before anything is written
    pre = operator.run("check-patch", "--patch", "spec-path-beacon", "--hosts", "v1b")
    assert pre.code == 1, pre
    assert pre.host("v1b")["status"] == "not-executed"
    assert "the server would not start" in pre.host("v1b")["message"]
    assert "Spec v2 currently only supports topk = 1" in pre.host("v1b")["message"]
    assert "the running server was started otherwise and runs EAGLEWorker" in pre.host("v1b")["message"]
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1b", "--timeout", "120")
    assert run.code == 1 and run.host("v1b")["status"] == "not-executed", run
    assert sha256(host_file(fleet, "v1b", EAGLE)) == before and fleet.server_pid("v1b") == pid, "untouched"
    # forced past it, the restart fails at once, not at the timeout
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1b", "--timeout", "120", "--force")
    assert run.code == 1, run
    h = run.host("v1b")
    assert h["status"] == "restart-failed"
    assert "Spec v2 currently only supports topk = 1" in h["message"]
    assert h["duration_s"] < 60, "fails at once, not at the timeout"


def test_crash_after_the_marker_fails(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "crash-in-init", *FIX, "--hosts", "v2b", "--timeout", "60")
    assert run.code == 1, run
    h = run.host("v2b")
    assert h["status"] == "restart-failed"
    assert "fleetpatch test: crash in __init__" in h["message"]


def test_server_that_never_becomes_ready_times_out(operator, fleet):
    set_env(operator, "v2b", FLEETPATCH_STANDIN_NEVER_READY="1")
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2b", "--timeout", "4")
    assert run.code == 1, run
    h = run.host("v2b")
    assert h["status"] == "timeout"
    assert h["duration_s"] >= 4


def test_log_rotated_during_startup_still_verifies(operator, fleet):
    remote_log = fleet.hosts["v1a"].remote_log
    set_env(operator, "v1a", FLEETPATCH_STANDIN_ROTATE_LOG=remote_log)
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a", "--timeout", "60")
    assert run.code == 0, run
    assert run.host("v1a")["status"] == "verified"
    rotated = fleet.hosts["v1a"].log_path.with_name(fleet.hosts["v1a"].log_path.name + ".1")
    assert rotated.exists()
    assert "spec-path-beacon: EAGLEWorker (" not in rotated.read_text()
    assert "spec-path-beacon: EAGLEWorker (" in fleet.hosts["v1a"].log_path.read_text()


def test_running_process_launch_config_wins_over_a_stale_inventory(operator, fleet):
    # The inventory claims v1b runs spec v2; the server that runs was started without it.
    doc = operator.inventory()
    restart = doc["hosts"]["v1b"]["server"]["restart"]
    restart["env"]["SGLANG_ENABLE_SPEC_V2"] = "True"
    restart["start"] = restart["start"].replace("--speculative-eagle-topk 4", "--speculative-eagle-topk 1")
    operator.write_inventory(doc)
    run = operator.run("check-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "v1b")
    assert run.code == 1, run
    h = run.host("v1b")
    assert h["status"] == "not-executed"
    assert h["executed_path"] == "EAGLEWorker"
    assert "SGLANG_ENABLE_SPEC_V2 is not set" in h["message"]
    assert "read from the running server" in h["message"]
    assert "the inventory's start and env would run EAGLEWorkerV2" in h["message"]


def test_verify_logs_without_patch_checks_every_recorded_patch(operator, fleet):
    assert operator.run("deploy-patch", "--patch", "dynamic-spec-disable", "--hosts", "v2a").code == 0
    run = operator.run("verify-logs", "--hosts", "v2a", "--timeout", "10")
    assert run.code == 0, run
    h = run.host("v2a")
    assert h["status"] == "verified" and h["patch"] == "dynamic-spec-disable@1"
    ledger = json.loads((fleet.hosts["v2a"].state_dir / "ledger.json").read_text())
    assert ledger["patches"]["dynamic-spec-disable"]["verification"]["status"] == "verified"


def test_verify_logs_on_a_host_fleetpatch_never_restarted_says_so(operator, fleet):
    run = operator.run("verify-logs", "--hosts", "v1b")
    assert run.code == 1, run
    assert "deploy first" in run.host("v1b")["message"]


def test_a_start_that_cannot_run_is_restart_failed_and_rolled_back_on_request(operator, fleet):
    doc = operator.inventory()
    restart = doc["hosts"]["v2b"]["server"]["restart"]
    # the same flags (the pre-flight predicts the same path from them), an interpreter that is not there
    restart["start"] = "/nonexistent/python " + restart["start"].split(None, 1)[1]
    operator.write_inventory(doc)
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2b", "--on-failure", "rollback",
                       "--timeout", "20")
    assert run.code == 1, run
    h = run.host("v2b")
    assert h["status"] == "restart-failed"
    assert "/nonexistent/python" in h["message"]
    for rel in (EAGLE, EAGLE_V2):
        assert sha256(host_file(fleet, "v2b", rel)) == sha256(sglang_tree("0.5.9") / rel), "originals restored"
    ledger = json.loads((fleet.hosts["v2b"].state_dir / "ledger.json").read_text())
    assert "spec-path-beacon" not in ledger["patches"]
    assert ledger["restart_pending"] is True, "the server is still to be started"
    assert "rollback FAILED" in h["message"]
    assert not (fleet.hosts["v2b"].state_dir / "lock").exists()


def test_a_host_whose_ssh_session_sets_spec_v2_is_judged_by_what_its_restart_really_runs(tmp_path_factory, tmp_path):
    """sshd's SetEnv (as a host's /etc/environment does through PAM) gives every SSH session, and so
    every server that fleetpatch's command restart starts, SGLANG_ENABLE_SPEC_V2=True; hosts.yaml
    does not set it. The pre-flight reads the session's environment under hosts.yaml's: a v2-only
    patch is not refused on a host that runs EAGLEWorkerV2 however it is restarted (it was, as
    "would never execute"), and the deploy proves it there, the variable coming from the session."""
    from fleetpatch_demo.fleet import Fleet, HostSpec
    from support.operator import Operator
    spec = HostSpec("sv2", spec_v2=True, startup_delay=0.0, session_env={"SGLANG_ENABLE_SPEC_V2": "True"})
    with Fleet(tmp_path_factory.mktemp("session-env"), [spec]) as f:
        op = Operator(f, tmp_path)
        doc = op.inventory()
        del doc["hosts"]["sv2"]["server"]["restart"]["env"]["SGLANG_ENABLE_SPEC_V2"]
        op.write_inventory(doc)
        check = op.run("check-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "sv2")
        assert check.code == 0 and check.host("sv2")["status"] == "applies", check
        run = op.run("deploy-patch", "--patch", "v2-only-beacon", *FIX, "--hosts", "sv2", "--timeout", "60")
        assert run.code == 0, run
        assert (run.host("sv2")["status"], run.host("sv2")["executed_path"]) == ("verified", "EAGLEWorkerV2"), run
        assert not run.host("sv2").get("notes"), run.host("sv2")["notes"]
        with open(f"/proc/{f.server_pid('sv2')}/environ", "rb") as environ:
            assert b"SGLANG_ENABLE_SPEC_V2=True" in environ.read().split(b"\0"), "from sshd's SetEnv"
        status = op.run("status", "--hosts", "sv2")
        assert status.code == 0 and "note:" not in status.output, status
