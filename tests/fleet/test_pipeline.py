"""The operator's checklist for the core pipeline, against the real sshd fleet:
fetch, check, deploy, verify, rollback, status; every refusal leaves hosts as
they were."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from pathlib import Path

import pytest

from support.marks import needs_fleet
from support.paths import FIXTURE_PATCHES, sha256
from fleetpatch_demo.wheels import sglang_tree

pytestmark = needs_fleet

EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
SERVER_ARGS = "sglang/srt/server_args.py"


def pristine(version: str, rel: str) -> str:
    return sha256(sglang_tree(version) / rel)


def host_file(fleet, name: str, rel: str) -> Path:
    return fleet.hosts[name].site_packages / rel


def log_text(fleet, name: str) -> str:
    return fleet.hosts[name].log_path.read_text(errors="replace")


def assert_one_agent_command(fleet, name: str) -> None:
    """Counted by sshd's ForceCommand wrapper: every request of the command went to one agent process."""
    commands = fleet.commands(name)
    assert len(commands) == 1, f"{name} ran {len(commands)} remote commands: {[c[:60] for c in commands]}"
    assert shlex.split(commands[0])[:3] == [fleet.hosts[name].remote_python, "-S", "-c"], commands[0][:80]


# ------------------------------------------------------------------ fetch

def test_fetch_copies_files_byte_for_byte_with_sha256_and_version(operator, fleet):
    run = operator.run("fetch", "--dest", "src")
    assert run.code == 0, run
    for name in ("v1a", "old"):
        version = fleet.hosts[name].spec.version
        meta = json.loads((operator.workdir / "src" / name / "fetch.json").read_text())
        assert meta["version"] == version
        assert meta["engine"] == "sglang"
        assert meta["package_dir"] == fleet.hosts[name].remote_site_packages
        for rel in (SERVER_ARGS, EAGLE, EAGLE_V2):
            local = operator.workdir / "src" / name / rel
            assert local.read_bytes() == host_file(fleet, name, rel).read_bytes()
            assert meta["files"][rel] == sha256(local) == pristine(version, rel)
        assert run.host(name)["status"] == "fetched"
        assert run.host(name)["files"][EAGLE] == pristine(version, EAGLE)


# ----------------------------------------------------------------- deploy

@pytest.mark.parametrize("patch", ["spec-path-beacon", "dynamic-spec-disable"])
def test_deploy_verifies_the_marker_of_the_path_each_host_runs(operator, fleet, patch):
    run = operator.run("deploy-patch", "--patch", patch, "--hosts", "v1a,v2a", "--timeout", "60")
    assert run.code == 0, run
    v1, v2 = run.host("v1a"), run.host("v2a")
    assert v1["status"] == v2["status"] == "verified"
    assert v1["executed_path"] == "EAGLEWorker"
    assert v2["executed_path"] == "EAGLEWorkerV2"
    assert v1["patch"] == v2["patch"] == f"{patch}@1"
    # the marker the verdict cites is really in the fresh log, on the right path
    assert any("EAGLEWorker" in m["text"] and "EAGLEWorkerV2" not in m["text"] for m in v1["markers"])
    assert any("EAGLEWorkerV2" in m["text"] for m in v2["markers"])
    for name in ("v1a", "v2a"):
        for m in run.host(name)["markers"]:
            assert m["text"] in log_text(fleet, name)
        for rel in (EAGLE, EAGLE_V2):
            assert sha256(host_file(fleet, name, rel)) != pristine("0.5.9", rel)
    assert v1["round_trips"] == 3, "probe+lock, apply+restart, follow+record+unlock"
    for name in ("v1a", "v2a"):
        assert_one_agent_command(fleet, name)


def test_mixed_fleet_gets_the_revision_for_its_version(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a,old")
    assert run.code == 0, run
    assert run.host("v1a")["patch"] == "spec-path-beacon@1"
    assert run.host("old")["patch"] == "spec-path-beacon@2"
    assert run.host("old")["engine_version"] == "0.5.8"
    assert run.host("old")["status"] == "verified"


def test_a_host_with_no_fitting_revision_fails_naming_the_supported_versions(operator, fleet):
    before = pristine("0.5.8", EAGLE)
    run = operator.run("deploy-patch", "--patch", "dynamic-spec-disable@1", "--hosts", "v1b,old")
    assert run.code == 1, run
    assert run.host("v1b")["status"] == "verified"
    old = run.host("old")
    assert not old["ok"]
    assert "0.5.8" in old["message"] and "==0.5.9" in old["message"]
    assert sha256(host_file(fleet, "old", EAGLE)) == before
    assert "old" in run.output.splitlines()[-1]


def test_second_deploy_changes_nothing_and_does_not_restart(operator, fleet):
    first = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a")
    assert first.code == 0, first
    pid = fleet.server_pid("v1a")
    path = host_file(fleet, "v1a", EAGLE)
    stat_before = path.stat()
    again = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a")
    assert again.code == 0, again
    assert again.host("v1a")["status"] == "already-applied"
    assert fleet.server_pid("v1a") == pid
    stat_after = path.stat()
    assert (stat_after.st_ino, stat_after.st_mtime_ns) == (stat_before.st_ino, stat_before.st_mtime_ns)


def test_no_restart_leaves_restart_pending_and_the_next_deploy_finishes_it(operator, fleet):
    pid = fleet.server_pid("v2a")
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2a", "--no-restart")
    assert run.code == 0, run
    assert run.host("v2a")["status"] == "applied"
    assert fleet.server_pid("v2a") == pid
    ledger = json.loads((fleet.hosts["v2a"].state_dir / "ledger.json").read_text())
    assert ledger["restart_pending"] is True
    again = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2a")
    assert again.code == 0, again
    assert again.host("v2a")["status"] == "verified"
    assert fleet.server_pid("v2a") != pid


# ---------------------------------------------------------- drift, rollback

def test_hand_edited_file_is_refused_as_drift_untouched_and_not_restarted(operator, fleet):
    path = host_file(fleet, "v1a", EAGLE)
    # someone fixed the same spot by hand: the patch's context no longer matches
    original = path.read_text()
    text = original.replace("        # Parse arguments\n        self.server_args = server_args\n",
                            "        # Parse arguments (hand edit)\n        self.server_args = server_args\n", 1)
    assert text != original
    path.write_text(text)
    edited = sha256(path)
    v2_before = sha256(host_file(fleet, "v1a", EAGLE_V2))
    pid = fleet.server_pid("v1a")
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a")
    assert run.code == 1, run
    assert run.host("v1a")["status"] == "drift"
    assert "hunk" in run.host("v1a")["message"]
    assert sha256(path) == edited
    assert sha256(host_file(fleet, "v1a", EAGLE_V2)) == v2_before, "no host is left half-patched"
    assert fleet.server_pid("v1a") == pid


def test_rollback_restores_pristine_sha256_and_the_marker_is_gone(operator, fleet):
    assert operator.run("deploy-patch", "--patch", "dynamic-spec-disable", "--hosts", "v2b").code == 0
    assert_one_agent_command(fleet, "v2b")
    fleet.clear_commands("v2b")
    pid = fleet.server_pid("v2b")
    run = operator.run("rollback", "--hosts", "v2b")
    assert run.code == 0, run
    assert run.host("v2b")["status"] == "rolled-back"
    assert_one_agent_command(fleet, "v2b")
    assert run.host("v2b")["round_trips"] == 3, "probe+lock, rollback+restart, follow+record+unlock"
    for rel in (SERVER_ARGS, EAGLE, EAGLE_V2):
        assert sha256(host_file(fleet, "v2b", rel)) == pristine("0.5.9", rel)
        assert run.host("v2b")["files"][rel] == pristine("0.5.9", rel)
    assert fleet.server_pid("v2b") not in (None, pid)
    status = operator.run("status")
    assert status.code == 0, status
    assert status.host("v2b")["applied"] == []


def test_stale_marker_from_an_earlier_run_does_not_pass_a_failed_restart(operator, fleet):
    # An earlier run left the marker in the log (as Ansible's wait_for would find it).
    stale = ("[2026-01-05 10:11:12] fleetpatch spec-path-beacon: EAGLEWorker "
             "(sglang/srt/speculative/eagle_worker.py) topk=4 overlap=False\n")
    with open(fleet.hosts["v1b"].log_path, "a") as f:
        f.write(stale + "[2026-01-05 10:11:13] The server is fired up and ready to roll!\n")
    # This start cannot come up: spec v2 with topk 4 is a ValueError in SGLang 0.5.9.
    doc = operator.inventory()
    doc["hosts"]["v1b"]["server"]["restart"]["env"]["SGLANG_ENABLE_SPEC_V2"] = "True"
    operator.write_inventory(doc)
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1b", "--timeout", "30",
                       "--force")
    assert run.code == 1, run
    assert run.host("v1b")["status"] == "restart-failed"
    assert run.host("v1b")["markers"] == []
    assert "topk = 1" in run.host("v1b")["message"]
    assert stale in log_text(fleet, "v1b"), "the stale marker was in the log all along"


def test_second_deploy_while_the_lock_is_held_fails_as_locked(operator, fleet):
    lock = fleet.hosts["v2a"].state_dir / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"token": "other", "holder": "alice@laptop pid 4242", "since": "now"}))
    before = sha256(host_file(fleet, "v2a", EAGLE_V2))
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2a")
    assert run.code == 1, run
    assert run.host("v2a")["status"] == "locked"
    assert "alice@laptop pid 4242" in run.host("v2a")["message"]
    assert sha256(host_file(fleet, "v2a", EAGLE_V2)) == before
    assert lock.exists(), "someone else's lock is never removed without --break-lock"
    broken = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2a", "--break-lock")
    assert broken.code == 0, broken
    assert not lock.exists()


# ------------------------------------------------------- refusals (exit 2)

@pytest.mark.parametrize("fixture,words", [
    ("v1-only-no-allow", "sibling"),
    ("no-marker", "marker"),
    ("traversal", ".."),
    ("absolute", "absolute"),
    ("binary", "binary"),
    ("malformed", "malformed"),
    ("no-such-patch", "no-such-patch"),
    ("spec-path-beacon@9", "revision"),
])
def test_patch_rules_refuse_before_any_host_is_contacted(operator, fleet, fixture, words):
    run = operator.run("deploy-patch", "--patch", fixture, "--patches", str(FIXTURE_PATCHES), "--group", "all")
    assert run.code == 2, run
    assert words.lower() in run.output.lower()
    for name in fleet.hosts:
        assert fleet.commands(name) == [], f"{name} was contacted"


def test_deploy_without_host_selection_is_a_usage_error(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon")
    assert run.code == 2, run
    assert "--hosts" in run.output and "--group" in run.output


def test_inventory_errors_name_the_file_and_key(operator, fleet):
    doc = operator.inventory()
    doc["hosts"]["v1a"]["port"] = "twenty-two"
    bad = operator.write_inventory(doc, "bad.yaml")
    run = operator.run("status", "--inventory", str(bad))
    assert run.code == 2, run
    assert "bad.yaml" in run.output and "hosts.v1a.port" in run.output


# --------------------------------------------------------------- host keys

def test_unknown_host_key_is_refused_and_nothing_is_written(operator, fleet, tmp_path):
    doc = operator.inventory()
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    doc["defaults"]["known_hosts"] = str(empty)
    inv = operator.write_inventory(doc, "unknown-keys.yaml")
    before = sha256(host_file(fleet, "v1a", EAGLE))
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a", "--inventory", str(inv))
    assert run.code == 1, run
    assert run.host("v1a")["status"] == "host-key-rejected"
    assert "--accept-new-host-keys" in run.host("v1a")["message"]
    assert sha256(host_file(fleet, "v1a", EAGLE)) == before
    assert fleet.commands("v1a") == []
    # --accept-new-host-keys records the key; the next run trusts it
    ok = operator.run("status", "--hosts", "v1a", "--inventory", str(inv), "--accept-new-host-keys")
    assert ok.code == 0, ok
    assert f"[127.0.0.1]:{fleet.hosts['v1a'].ssh_port}" in empty.read_text()
    assert operator.run("status", "--hosts", "v1a", "--inventory", str(inv)).code == 0


def test_changed_host_key_is_refused_even_with_accept_new(operator, fleet, tmp_path):
    doc = operator.inventory()
    other_key = (fleet.hosts["v2a"].host_key.with_suffix(".pub")).read_text().split()
    forged = tmp_path / "forged_known_hosts"
    forged.write_text(f"[127.0.0.1]:{fleet.hosts['v1a'].ssh_port} {other_key[0]} {other_key[1]}\n")
    doc["defaults"]["known_hosts"] = str(forged)
    inv = operator.write_inventory(doc, "forged.yaml")
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a", "--inventory", str(inv),
                       "--accept-new-host-keys")
    assert run.code == 1, run
    assert run.host("v1a")["status"] == "host-key-rejected"
    assert "CHANGED" in run.host("v1a")["message"]
    assert fleet.commands("v1a") == []


# ---------------------------------------------------------------- misc

def test_engine_path_with_a_space_works(operator, fleet):
    python = operator.inventory()["defaults"]["engine"]["python"]
    assert " " in python
    run = operator.run("check-patch", "--patch", "spec-path-beacon", "--hosts", "v2a")
    assert run.code == 0, run
    assert run.host("v2a")["status"] == "applies"


def test_check_patch_reports_offsets_and_changes_nothing(operator, fleet):
    path = host_file(fleet, "v2b", EAGLE_V2)
    path.write_text("# a local comment line\n" + path.read_text())
    v1 = host_file(fleet, "v2b", EAGLE)
    before = {p: sha256(p) for p in (path, v1)}
    run = operator.run("check-patch", "--patch", "spec-path-beacon", "--hosts", "v2b")
    assert run.code == 0, run
    states = run.host("v2b")["files_state"]
    assert states[EAGLE_V2]["state"] == "applies" and states[EAGLE_V2]["offsets"] == [1]
    assert states[EAGLE]["state"] == "applies" and states[EAGLE]["offsets"] == [0]
    assert {p: sha256(p) for p in (path, v1)} == before
    assert "+1" in run.output


def test_status_shows_applied_patches_and_drift(operator, fleet):
    assert operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a").code == 0
    host_file(fleet, "v1a", EAGLE).write_text(host_file(fleet, "v1a", EAGLE).read_text() + "\n# drift\n")
    run = operator.run("status")
    assert run.code == 1, run
    assert run.host("v1a")["applied"] == ["spec-path-beacon@1"]
    assert run.host("v1a")["drift"] == [EAGLE]
    assert run.host("v2a")["applied"] == [] and run.host("v2a")["ok"]
    assert "eagle_worker.py" in run.output


def test_stacked_patches_on_one_file_are_not_drift(operator, fleet):
    assert operator.run("deploy-patch", "--patch", "dynamic-spec-disable", "--hosts", "v2b").code == 0
    run = operator.run("deploy-patch", "--patch", "v2-only-beacon", "--patches", str(FIXTURE_PATCHES),
                       "--hosts", "v2b")
    assert run.code == 0, run
    status = operator.run("status", "--hosts", "v2b")
    assert status.code == 0, status
    assert status.host("v2b")["drift"] == []
    assert status.host("v2b")["applied"] == ["dynamic-spec-disable@1", "v2-only-beacon@1"]


def test_stale_bytecode_of_changed_modules_is_removed(operator, fleet):
    cache = host_file(fleet, "v1b", EAGLE).parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    stale = cache / "eagle_worker.cpython-311.pyc"
    stale.write_bytes(b"old bytecode")
    untouched = cache / "spec_info.cpython-311.pyc"
    untouched.write_bytes(b"unrelated")
    run = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1b", "--no-restart")
    assert run.code == 0, run
    assert not stale.exists()
    assert untouched.read_bytes() == b"unrelated"
