"""Diffs that create and delete files (issue 8, "Missing file operations"), on the
local transport: the real agent, the real SGLang 0.5.9 wheel files, the real
stand-in server. The fixture patch helper-module creates
sglang/srt/speculative/fleetpatch_helper.py (imported by both EAGLE workers, which
call it first in __init__) and deletes cpp_ngram/ngram_cache.py (the NGRAM worker's
only; the EAGLE paths never import it)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.localhost import EAGLE, EAGLE_V2, FIXTURE_PATCHES, LocalHost, job, sha256, speculative_tree
from support.marks import needs_root
from fleetpatch import steps

HELPER = "sglang/srt/speculative/fleetpatch_helper.py"
NGRAM = "sglang/srt/speculative/cpp_ngram/ngram_cache.py"
PATCH = "helper-module"
ROOT = os.geteuid() == 0


def job_creating_in_a_missing_folder(lh: LocalHost, tmp_path: Path):
    """The helper-module patch with its created file moved into a folder no host has."""
    from fleetpatch.engines import sglang
    from fleetpatch.patchset import load_patch

    patches = tmp_path / "patches"
    (patches / PATCH).mkdir(parents=True)
    src = FIXTURE_PATCHES / PATCH
    (patches / PATCH / "patch.yaml").write_text((src / "patch.yaml").read_text())
    (patches / PATCH / "sglang-0.5.9.r1.diff").write_text(
        (src / "sglang-0.5.9.r1.diff").read_text().replace("speculative/fleetpatch_helper.py",
                                                          "speculative/helpers/fleetpatch_helper.py"))
    j, host = job(lh, PATCH)
    j.patch = load_patch(PATCH, [patches], sglang.PROFILE)[0]
    return j, host


def tree(lh: LocalHost) -> dict:
    return speculative_tree(lh.file("sglang/srt/speculative"))


def bytecode(lh: LocalHost, rel: str) -> list:
    path = lh.file(rel)
    stem = path.stem
    return sorted(p.name for p in (path.parent / "__pycache__").glob(stem + ".*.pyc"))


def compile_(lh: LocalHost, rel: str) -> None:
    subprocess.run([str(lh.python), "-m", "py_compile", str(lh.file(rel))], check=True)


def distinctive_owners(lh: LocalHost) -> None:
    """The package's files get a mode and owner no default would give, so a created
    file that takes them, and a deleted file put back with them, show it."""
    spec = lh.file("sglang/srt/speculative")
    for p in spec.rglob("*"):
        if p.is_file():
            p.chmod(0o640)
            if ROOT:
                os.chown(p, 1234, 2345)
    lh.file(NGRAM).chmod(0o604)   # its own mode, unlike its siblings': rollback must give it back
    if ROOT:
        os.chown(lh.file(NGRAM), 4321, 5432)


def strays(lh: LocalHost) -> list:
    return sorted(str(p) for p in lh.root.rglob("*") if ".fleetpatch-" in p.name or p.name == "writing.json")


# ---------------------------------------------------------------- check-patch

def test_check_patch_says_what_it_will_create_and_delete_and_changes_nothing(lh):
    before = tree(lh)
    r = steps.check_patch(job(lh, PATCH)[0], lh.host())
    assert r.status == "applies", r.message
    helper_bytes = r.details["files_state"][HELPER]
    assert helper_bytes["state"] == "creates" and r.details["files_state"][NGRAM]["state"] == "deletes"
    assert f"{HELPER}: will create {HELPER} (" in r.message and " bytes)" in r.message, r.message
    assert f"{NGRAM}: will delete {NGRAM}" in r.message
    assert f"{EAGLE}: applies" in r.message and f"{EAGLE_V2}: applies" in r.message
    assert tree(lh) == before and not lh.file(HELPER).exists() and not lh.lock.exists()


def test_check_patch_when_the_created_file_exists_or_the_deleted_one_differs_is_a_conflict(lh):
    lh.file(HELPER).write_text("# someone else's helper\n")
    lh.file(NGRAM).write_text(lh.file(NGRAM).read_text() + "# local change\n")
    r = steps.check_patch(job(lh, PATCH)[0], lh.host())
    assert r.status == "conflict", r.message
    assert f"the diff creates {HELPER}, but it already exists with other content" in r.message, r.message
    assert f"the diff deletes {NGRAM}, but the file differs" in r.message
    d = steps.deploy(job(lh, PATCH)[0], lh.host())
    assert d.status == "drift" and lh.file(HELPER).read_text() == "# someone else's helper\n", d.message
    assert lh.ledger().get("patches", {}) == {} and not lh.lock.exists()


def test_a_created_file_whose_folder_is_missing_is_a_conflict_before_any_write(lh, tmp_path):
    spec = lh.file("sglang/srt/speculative")
    # the helper's folder is the workers' folder: move the workers' file checks aside by
    # creating the patch against a folder that is missing on this host
    before = tree(lh)
    j, host = job_creating_in_a_missing_folder(lh, tmp_path)
    r = steps.check_patch(j, host)
    assert r.status == "conflict" and "its folder sglang/srt/speculative/helpers does not exist" in r.message, \
        r.message
    assert tree(lh) == before and not (spec / "helpers").exists()


# --------------------------------------------------------- deploy and rollback

def test_deploy_creates_and_deletes_then_rollback_ends_pristine_with_modes_and_owners(lh):
    distinctive_owners(lh)
    compile_(lh, NGRAM)
    assert bytecode(lh, NGRAM), "the deleted module had bytecode"
    pristine = tree(lh)
    r = steps.deploy(job(lh, PATCH)[0], lh.host())
    assert (r.status, r.executed_path) == ("verified", "EAGLEWorker"), r.message
    assert "fleetpatch fixture helper-module: EAGLEWorker via" in lh.log.read_text()
    # created: the mode and owner of the modules beside it
    st = lh.file(HELPER).stat()
    assert st.st_mode & 0o7777 == 0o640
    if ROOT:
        assert (st.st_uid, st.st_gid) == (1234, 2345)
    # deleted, with its bytecode
    assert not lh.file(NGRAM).exists() and bytecode(lh, NGRAM) == []
    led = lh.ledger()["patches"][PATCH]["files"]
    assert {p: rec["op"] for p, rec in led.items()} == {HELPER: "create", NGRAM: "delete", EAGLE: "modify",
                                                        EAGLE_V2: "modify"}
    assert led[HELPER]["before"] is None and led[HELPER]["after"] == sha256(lh.file(HELPER))
    assert led[NGRAM]["after"] is None and led[NGRAM]["mode"] == 0o604
    assert sha256(lh.state / led[NGRAM]["backup"]) == pristine["cpp_ngram/ngram_cache.py"][0]
    st = steps.status(job(lh, None)[0], lh.host())
    assert st.ok and st.details["drift"] == [], st.message
    compile_(lh, HELPER)
    assert bytecode(lh, HELPER), "the created module has bytecode to remove"
    rb = steps.rollback(job(lh, None)[0], lh.host())
    assert rb.status == "rolled-back", rb.message
    assert tree(lh) == pristine, "every file's bytes, mode and owner as before; the created file gone"
    assert bytecode(lh, HELPER) == [] and lh.ledger()["patches"] == {}
    assert not strays(lh) and not lh.lock.exists()


def test_status_sees_a_created_file_removed_and_a_deleted_file_back(lh):
    assert steps.deploy(job(lh, PATCH)[0], lh.host()).ok
    helper = lh.file(HELPER).read_bytes()
    lh.file(HELPER).unlink()
    st = steps.status(job(lh, None)[0], lh.host())
    assert st.status == "drift" and st.details["drift"] == [HELPER], st.message
    lh.file(HELPER).write_bytes(helper)
    lh.file(NGRAM).write_text("# back\n")
    st = steps.status(job(lh, None)[0], lh.host())
    assert st.status == "drift" and st.details["drift"] == [NGRAM], st.message


def test_rollback_refuses_a_created_file_changed_since_and_force_removes_it(lh):
    pristine = tree(lh)
    assert steps.deploy(job(lh, PATCH)[0], lh.host()).ok
    lh.file(HELPER).write_text(lh.file(HELPER).read_text() + "# edited on the host\n")
    edited = sha256(lh.file(HELPER))
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.status == "drift" and f"{HELPER}, which {PATCH}@1 created, changed since" in r.message, r.message
    assert sha256(lh.file(HELPER)) == edited and not lh.file(NGRAM).exists(), "nothing restored"
    assert PATCH in lh.ledger()["patches"] and not lh.lock.exists()
    r = steps.rollback(job(lh, None, force=True)[0], lh.host())
    assert r.status == "rolled-back", r.message
    assert tree(lh) == pristine


def test_rollback_refuses_a_deleted_file_made_again_with_other_bytes(lh):
    pristine = tree(lh)
    assert steps.deploy(job(lh, PATCH)[0], lh.host()).ok
    lh.file(NGRAM).write_text("# a new ngram cache\n")
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.status == "drift" and f"{NGRAM}, which {PATCH}@1 deleted, exists again" in r.message, r.message
    assert lh.file(NGRAM).read_text() == "# a new ngram cache\n"
    r = steps.rollback(job(lh, None, force=True)[0], lh.host())
    assert r.status == "rolled-back", r.message
    assert tree(lh) == pristine, "the original is put back over it, with its own mode"


# ------------------------------------------------------------ all or nothing

def chattr(flag: str, path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


@needs_root
def test_a_write_that_fails_after_the_create_and_the_delete_leaves_the_host_byte_identical(lh):
    """The diff's order is create, delete, modify, modify: an immutable eagle_worker_v2.py
    fails the last write, and the created file, the deleted file and the modified file
    are all undone."""
    distinctive_owners(lh)
    before = tree(lh)
    chattr("+i", lh.file(EAGLE_V2))
    try:
        r = steps.deploy(job(lh, PATCH)[0], lh.host())
    finally:
        chattr("-i", lh.file(EAGLE_V2))
    assert r.status == "error" and "put back" in r.message and EAGLE_V2 in r.message, r.message
    assert tree(lh) == before, "byte-identical, modes and owners included"
    assert not lh.file(HELPER).exists() and bytecode(lh, HELPER) == []
    assert lh.ledger().get("patches", {}) == {} and not lh.ledger().get("restart_pending")
    assert not strays(lh) and not lh.lock.exists() and lh.server_pid() is None


def test_the_journal_undoes_a_create_and_a_delete_of_an_agent_killed_before_the_modify(lh):
    """kill -9 of the agent after it created the helper and deleted ngram_cache.py,
    before it renamed the first modified worker: the next run finds the journal, removes
    the created file, puts the deleted one back (mode included) and deploys afresh."""
    distinctive_owners(lh)
    before = tree(lh)
    j, host = job(lh, PATCH)
    reply = steps.probe(steps.Remote(host, transport=j.transport(host)), host, j, steps.revision_files(j), True)
    plan, revision = steps.make_plan(j, host, reply)
    req = dict(steps.base_request(host, j), op="apply", package_dir=reply["package_dir"], name=PATCH,
               rev=revision.rev, label=plan.label, diff_sha256=revision.diff_sha256,
               files=steps.apply_files(reply, plan), lock_token=None)
    harness = f"""
import json, os, signal, sys
sys.path.insert(0, {str(steps.__file__.rsplit('/', 3)[0])!r})
from fleetpatch.agent import session as agent_session
real_rename = os.rename
def rename(src, dst):
    if dst == {os.path.join(reply["package_dir"], EAGLE)!r}:   # the first modify, not its backup
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(src, dst)
os.rename = rename
agent_session.main(json.loads(sys.stdin.readline()))
"""
    dead = subprocess.run([str(lh.python), "-c", harness], input=json.dumps(req) + "\n", text=True,
                          capture_output=True, timeout=60)
    assert dead.returncode == -9, dead.stderr
    assert lh.file(HELPER).exists() and not lh.file(NGRAM).exists(), "killed between the create and the modify"
    assert (lh.state / "writing.json").exists()
    # the next run that takes the lock finishes the journal first: a locking probe is enough
    recovered = locked_probe(lh, host, j).get("recovered") or {}
    assert sorted(recovered.get("finished_write") or []) == sorted([HELPER, NGRAM]), recovered
    assert tree(lh) == before, "undone byte for byte, with the deleted file's mode and owner"
    assert lh.ledger().get("patches", {}) == {} and not strays(lh)
    r = steps.deploy(job(lh, PATCH)[0], host)
    assert r.status == "verified", r.message
    assert not lh.file(NGRAM).exists() and lh.file(HELPER).exists() and not strays(lh)


def locked_probe(lh: LocalHost, host, j) -> dict:
    """Take the lock (which runs the recovery), release it, as a run's first and last request."""
    remote = steps.Remote(host, transport=j.transport(host))
    remote.open()
    try:
        reply = steps.probe(remote, host, j, [], False, lock=True)
        remote.call("unlock", steps.base_request(host, j))
    finally:
        remote.close()
    assert not lh.lock.exists()
    return reply


def test_deploy_where_a_created_files_folder_is_missing_is_a_conflict_and_writes_nothing(lh, tmp_path):
    before = tree(lh)
    j, host = job_creating_in_a_missing_folder(lh, tmp_path)
    r = steps.deploy(j, host)
    assert r.status == "conflict" and "does not fit this host's package" in r.message, r.message
    assert "its folder sglang/srt/speculative/helpers does not exist" in r.message
    assert tree(lh) == before and lh.server_pid() is None and not lh.lock.exists()
    assert lh.ledger().get("patches", {}) == {}


def test_the_agent_refuses_a_create_over_a_file_that_appeared_since_the_probe(lh):
    """Between the probe and the apply someone creates the file: the agent refuses
    (conflict) before anything is written, the delete and the modifies included."""
    from fleetpatch.agent import base as agent_base, ops as agent_ops, state as agent_state
    j, host = job(lh, PATCH)
    reply = steps.probe(steps.Remote(host, transport=j.transport(host)), host, j, steps.revision_files(j), True)
    plan, revision = steps.make_plan(j, host, reply)
    req = dict(steps.base_request(host, j), op="apply", package_dir=reply["package_dir"], name=PATCH,
               rev=revision.rev, label=plan.label, diff_sha256=revision.diff_sha256,
               files=steps.apply_files(reply, plan), lock_token=None, restart=None)
    lh.file(HELPER).write_text("# made meanwhile\n")
    before = tree(lh)
    with pytest.raises(agent_base.AgentError) as e:
        agent_ops.op_apply(agent_state.AgentState(), req)
    assert e.value.code == "conflict" and f"the patch creates {HELPER}, but it exists now" in e.value.message
    assert tree(lh) == before and lh.ledger().get("patches", {}) == {} and not strays(lh)
