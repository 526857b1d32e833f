"""Host-side faults on the local transport (issue 8): failed writes, retried
restarts, rotated logs, stacked rollback with --force, symlinks, a killed agent,
a chatty server. The real agent, the real SGLang files, the real stand-in."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.waits import wait_for
from support.localhost import EAGLE, EAGLE_V2, LocalHost, job, sha256
from support.marks import needs_root
from fleetpatch import steps


def chattr(flag: str, path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


def strays(lh: LocalHost) -> list:
    """Temp files of fleetpatch's left anywhere in the host's tree."""
    return sorted(str(p) for p in lh.root.rglob("*fleetpatch-*.tmp"))


# ------------------------------------------------- 8: a failed write is not recorded

@needs_root
def test_a_write_that_fails_and_is_put_back_is_not_recorded(lh):
    chattr("+i", lh.file(EAGLE_V2))
    try:
        r = steps.deploy(job(lh)[0], lh.host())
    finally:
        chattr("-i", lh.file(EAGLE_V2))
    assert r.status == "error" and "put back" in r.message, r.message
    assert lh.is_pristine() and not strays(lh) and not lh.lock.exists()
    ledger = lh.ledger()
    assert ledger.get("patches", {}) == {}, "the ledger must not record a patch that was put back"
    assert not ledger.get("restart_pending"), "nothing changed: no restart is pending"
    assert lh.server_pid() is None, "not restarted"
    rb = steps.rollback(job(lh, None)[0], lh.host())
    assert rb.ok and "nothing to roll back" in rb.message and lh.server_pid() is None


# ---------------------------------------------- 5: a failed restart can be retried

def test_after_restart_failed_fixing_the_start_and_deploying_again_restarts_and_verifies(lh):
    bad = lh.host(start="/nonexistent/python -m sglang_standin")
    r = steps.deploy(job(lh, host=bad, force=True)[0], bad)
    assert r.status == "restart-failed", r.message
    assert lh.ledger()["restart_pending"] is True
    again = steps.deploy(job(lh)[0], lh.host())
    assert again.status == "verified", again.message
    assert lh.server_pid() and lh.ledger()["restart_pending"] is False
    assert lh.ledger()["patches"]["spec-path-beacon"]["verification"]["status"] == "verified"
    logs = steps.verify_logs(job(lh, None)[0], lh.host())
    assert logs.status == "verified", logs.message


def test_after_a_server_that_crashed_at_start_verify_logs_and_deploy_restart_and_verify(lh):
    """The server started but died (restart-failed from the log); after the fix a
    rerun deploys nothing new, restarts and verifies instead of re-judging the old window."""
    inv_env = lh.inventory()["hosts"]["h1"]["server"]["restart"]["env"]
    bad = lh.host(env=dict(inv_env, SGLANG_ENABLE_SPEC_V2="True"))  # topk 4 with spec v2: a ValueError
    r = steps.deploy(job(lh, host=bad, force=True)[0], bad)
    assert r.status == "restart-failed", r.message
    again = steps.deploy(job(lh)[0], lh.host())
    assert again.status == "verified", again.message
    assert lh.server_pid()


# ------------------------------------------- 4: a log rotated by rename while verifying

def test_a_log_renamed_away_during_verification_is_still_followed(lh):
    """logrotate (create, no copytruncate) renames the log while the server starts: the
    server, started by `command`, keeps writing the renamed file, and that is the one to read."""
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "1.5"})
    lh.log.write_text("an older run's line\n")
    rotated = lh.log.with_name(lh.log.name + ".1")

    def rotate():
        if wait_for(lambda: lh.log.exists() and "Uvicorn running" in lh.log.read_text()):
            os.rename(lh.log, rotated)
            lh.log.write_text("")

    import threading
    t = threading.Thread(target=rotate, daemon=True)
    t.start()
    r = steps.deploy(job(lh, host=host)[0], host)
    t.join()
    assert rotated.exists(), "the log was rotated during the run"
    assert r.status == "verified", r.message
    assert "ready to roll" in rotated.read_text() and lh.log.read_text() == ""
    assert not lh.lock.exists()


def test_the_follower_moves_to_the_new_file_once_the_writer_does(tmp_path):
    from fleetpatch.agent.logs import LogFollower
    log = tmp_path / "server.log"
    log.write_text("old 1\n")
    st = log.stat()
    f = LogFollower(str(log), st.st_ino, st.st_size)
    with open(log, "a") as w:
        w.write("old 2\n")
        w.flush()
        os.rename(log, tmp_path / "server.log.1")
        log.write_text("")
        assert [l for _, _, ls in f.read() for l in ls] == ["old 2"]
        w.write("old 3\n")   # the writer has not reopened yet
        w.flush()
    assert [l for _, _, ls in f.read() for l in ls] == ["old 3"]
    log.write_text("new 1\n")  # it has: lines under the log's name again
    got = f.read()
    assert [(str(p), n, ls) for p, n, ls in got] == [(str(log), 1, ["new 1"])]
    f.close()


# -------------------------------------------------------- 9: a chatty server

SERVER_ARGS = "sglang/srt/server_args.py"


@pytest.fixture
def lh2(tmp_path, template):
    h = LocalHost(tmp_path / "h2", template, name="h2", spec_v2=True)
    yield h
    h.stop()


def test_force_never_forgets_a_patch_whose_lines_are_still_in_the_files(lh2):
    lh = lh2
    pristine = dict(lh.pristine, **{SERVER_ARGS: sha256(lh.file(SERVER_ARGS))})
    assert steps.deploy(job(lh, "dynamic-spec-disable")[0], lh.host()).ok
    assert steps.deploy(job(lh, "v2-only-beacon")[0], lh.host()).ok
    stacked = {rel: sha256(lh.file(rel)) for rel in pristine}
    ledger = lh.ledger()
    for force in (False, True):
        r = steps.rollback(job(lh, "dynamic-spec-disable", force=force)[0], lh.host())
        assert r.status == "error" and "roll back v2-only-beacon first" in r.message, r.message
        assert {rel: sha256(lh.file(rel)) for rel in pristine} == stacked, "nothing restored"
        assert lh.ledger()["patches"] == ledger["patches"] and not lh.lock.exists()
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.status == "rolled-back", r.message
    assert {rel: sha256(lh.file(rel)) for rel in pristine} == pristine, "stacked rollback ends pristine"
    assert lh.ledger()["patches"] == {} and not lh.lock.exists()


# ------------------------------------------- 11: the agent killed with -9 mid-operation

def kill_agent_at(lh: LocalHost, host, j, when: str) -> subprocess.CompletedProcess:
    """Run one apply as the agent runs it (the real agent, under the host's python), but
    SIGKILL it at `when`: "second-rename" (between the renames of a revision's files)
    or "pidfile" (the server started, its pidfile being written)."""
    probe = steps.probe(steps.Remote(host, transport=j.transport(host)), host, j, steps.revision_files(j), True)
    plan, revision = steps.make_plan(j, host, probe)
    files = [dict(path=r.path, before=sha256(lh.file(r.path)), after=steps.sha256(r.new),
                  content=steps.protocol.pack(r.new)) for r in plan.changes]
    req = dict(steps.base_request(host, j), op="apply", package_dir=probe["package_dir"], name=j.patch.name,
               rev=revision.rev, label=plan.label, diff_sha256=revision.diff_sha256, files=files, lock_token=None)
    harness = f"""
import json, os, signal, sys
sys.path.insert(0, {str(steps.__file__.rsplit('/', 3)[0])!r})
from fleetpatch.agent import session
when, package = {when!r}, {probe["package_dir"]!r}
real_rename, renames = os.rename, []
def rename(src, dst):
    if when == "second-rename" and dst.startswith(package + os.sep):
        renames.append(dst)
        if len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    if when == "pidfile" and dst.endswith(".pid"):
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(src, dst)
os.rename = rename
session.main(json.loads(sys.stdin.readline()))
"""
    return subprocess.run([str(lh.python), "-c", harness], input=json.dumps(req) + "\n", text=True,
                          capture_output=True, timeout=60)


def test_an_agent_killed_between_the_renames_leaves_no_half_patched_host(lh):
    j, host = job(lh)
    dead = kill_agent_at(lh, host, j, "second-rename")
    assert dead.returncode == -9, dead.stderr
    assert not lh.is_pristine() and strays(lh), "killed half-way: one file renamed, a temp file left"
    r = steps.deploy(job(lh)[0], host)
    assert r.status == "verified", r.message
    assert not strays(lh) and not lh.lock.exists()
    assert not (lh.state / "writing.json").exists()
    led = lh.ledger()["patches"]["spec-path-beacon"]
    assert all(sha256(lh.file(p)) == rec["after"] for p, rec in led["files"].items()), "the ledger matches the files"


def test_the_next_run_after_a_killed_apply_can_roll_back_to_pristine(lh):
    j, host = job(lh)
    kill_agent_at(lh, host, j, "second-rename")
    r = steps.rollback(job(lh, None)[0], host)
    assert r.ok, r.message
    assert lh.is_pristine() and not strays(lh) and not lh.lock.exists()
    assert lh.ledger().get("patches", {}) == {}


def test_an_agent_killed_while_writing_the_pidfile_leaves_no_orphan_server(lh):
    j, host = job(lh)
    dead = kill_agent_at(lh, host, j, "pidfile")
    try:
        assert dead.returncode == -9, dead.stderr
        assert wait_for(lambda: "ready to roll" in lh.log.read_text()), "the orphan server runs"
        r = steps.deploy(job(lh)[0], host)
    finally:
        for pid in [p for p in os.listdir("/proc") if p.isdigit() and _started_here(p, lh)]:
            if int(pid) != lh.server_pid():
                os.kill(int(pid), 9)   # an orphan the code under test failed to find
    assert r.status == "verified", r.message
    assert "address already in use" not in lh.log.read_text().lower()
    assert not strays(lh)
    servers = [p for p in os.listdir("/proc") if p.isdigit() and _started_here(p, lh)]
    assert servers == [str(lh.server_pid())], "one server, the one the pidfile names"


def _started_here(pid: str, lh: LocalHost) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in "ZX" or fields[3] != pid:
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"sglang_standin" in f.read() and str(lh.port).encode() in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


# ------------------------------------------------------------- 13: symlinks

def tree_sha(root) -> dict:
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_engine_file_that_is_a_symlink_is_refused_and_left_a_link(lh, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    real = outside / "eagle_worker_v2.py"
    real.write_bytes(lh.file(EAGLE_V2).read_bytes())
    lh.file(EAGLE_V2).unlink()
    lh.file(EAGLE_V2).symlink_to(real)
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "error" and "is a symlink" in r.message and EAGLE_V2 in r.message, r.message
    assert lh.file(EAGLE_V2).is_symlink() and os.readlink(lh.file(EAGLE_V2)) == str(real)
    assert lh.is_pristine() and sha256(real) == lh.pristine[EAGLE_V2], "nothing written, in or outside"
    assert not lh.lock.exists() and lh.ledger().get("patches", {}) == {} and not strays(lh)


def test_a_package_subdirectory_that_is_a_symlink_is_never_written_through(lh, tmp_path):
    spec = lh.file(EAGLE).parent
    outside = tmp_path / "elsewhere-speculative"
    spec.rename(outside)
    spec.symlink_to(outside)
    before = tree_sha(outside)
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "error" and "is a symlink" in r.message and str(spec) in r.message, r.message
    assert tree_sha(outside) == before and spec.is_symlink()
    assert not lh.lock.exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_a_state_dir_that_is_a_symlink_is_refused_clearly(lh, tmp_path, dangling):
    target = tmp_path / "elsewhere-state"
    if not dangling:
        target.mkdir()
    lh.state.rmdir()
    lh.state.symlink_to(target)
    r = steps.deploy(job(lh)[0], lh.host())
    assert r.status == "error" and "engine.state_dir" in r.message and "is a symlink" in r.message, r.message
    assert "Traceback" not in r.message and "FileExistsError" not in r.message
    assert lh.is_pristine() and lh.server_pid() is None
    assert (not target.exists()) if dangling else list(target.iterdir()) == [], "nothing written through the link"


# ------------------------------------------- a lock whose holder is provably gone

def test_a_lock_of_a_dead_run_on_this_machine_is_taken_over_and_a_live_ones_is_not(lh):
    import getpass
    import socket
    lh.state.mkdir(exist_ok=True)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        me = f"{getpass.getuser()}@{socket.gethostname()}"
        live_lock = json.dumps({"token": "other", "holder": f"{me} pid {alive.pid}", "since": "now"})
        lh.lock.write_text(live_lock)
        r = steps.deploy(job(lh)[0], lh.host())
        assert r.status == "locked" and lh.lock.read_text() == live_lock, "a live holder keeps its lock"
        lh.lock.write_text(json.dumps({"token": "other", "holder": f"{me} pid {dead.pid}", "since": "now"}))
        r = steps.deploy(job(lh)[0], lh.host())
        assert r.status == "verified", r.message
        assert not lh.lock.exists()
    finally:
        alive.kill()
        alive.wait()
