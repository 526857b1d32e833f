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
