"""Host-side faults on the local transport (issue 8): failed writes, retried
restarts, rotated logs, stacked rollback with --force, symlinks, a killed agent,
a chatty server. The real agent, the real SGLang files, the real stand-in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from localhost import EAGLE, EAGLE_V2, LocalHost, job, sha256, template_env
from fleetpatch import steps


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    return template_env(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def lh(tmp_path, template):
    h = LocalHost(tmp_path / "h1", template)
    yield h
    h.stop()


def chattr(flag: str, path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


def strays(lh: LocalHost) -> list:
    """Temp files of fleetpatch's left anywhere in the host's tree."""
    return sorted(str(p) for p in lh.root.rglob("*fleetpatch-*.tmp"))


# ------------------------------------------------- 8: a failed write is not recorded

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

def wait_for(predicate, timeout: float = 20.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


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
    from fleetpatch.hostagent import LogFollower
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
