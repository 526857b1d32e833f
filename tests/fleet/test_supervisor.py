"""Restart kind supervisor, for real, end to end: supervisord from PyPI on sshd
test hosts manages the stand-in server; fleetpatch deploys, verifies, rolls back
and reports status through `supervisorctl -c CONFIG`. (Its argv and output
parsing, and the systemd kind, are in tests/fast/test_restart_kinds.py.)
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree
from support.marks import needs_fleet
from support.operator import Operator
from support.paths import FIXTURE_PATCHES, sha256
from support.standin_env import QUICK_STOP

EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


# ------------------------------------------------ supervisor, end to end

SPECS = [HostSpec("sv1", restart_kind="supervisor", spec_v2=False, env=QUICK_STOP),
         HostSpec("sv2", restart_kind="supervisor", spec_v2=True, env=QUICK_STOP)]


@pytest.fixture(scope="module")
def svfleet(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root and /usr/sbin/sshd")
    with Fleet(tmp_path_factory.mktemp("svfleet"), SPECS) as f:
        yield f


@pytest.fixture
def op(svfleet, pristine, tmp_path):
    pristine.restore(svfleet)
    return Operator(svfleet, tmp_path)


def ppid(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return int(data[data.rindex(b")") + 2:].split()[1])


def pristine(rel: str) -> str:
    return sha256(sglang_tree("0.5.9") / rel)


@needs_fleet
def test_the_fleet_runs_the_stand_in_under_supervisord(op, svfleet):
    for name in ("sv1", "sv2"):
        sd, pid = svfleet.supervisord_pid(name), svfleet.server_pid(name)
        assert sd and pid and ppid(pid) == sd
        assert svfleet.healthy(name)
        assert svfleet.supervisorctl(name, "pid", "sglang").stdout.strip() == str(pid)
    restart = op.inventory()["hosts"]["sv1"]["server"]["restart"]
    assert restart == {"kind": "supervisor", "program": "sglang",
                       "config": "/srv/fleetpatch-host/etc/supervisord.conf", "workdir": None, "pidfile": None}


@needs_fleet
def test_deploy_restarts_through_supervisor_and_verifies_the_path_that_runs(op, svfleet):
    sd = {n: svfleet.supervisord_pid(n) for n in ("sv1", "sv2")}
    before = {n: svfleet.server_pid(n) for n in ("sv1", "sv2")}
    run = op.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "sv1,sv2", "--timeout", "60")
    assert run.code == 0, run
    assert run.host("sv1")["executed_path"] == "EAGLEWorker"
    assert run.host("sv2")["executed_path"] == "EAGLEWorkerV2"
    for name in ("sv1", "sv2"):
        h = run.host(name)
        assert h["status"] == "verified", run
        assert h["round_trips"] == 3
        pid = svfleet.server_pid(name)
        assert pid not in (None, before[name]), "the server was restarted"
        assert svfleet.supervisord_pid(name) == sd[name], "by supervisorctl, not by restarting supervisord"
        assert ppid(pid) == sd[name]
        ledger = json.loads((svfleet.hosts[name].state_dir / "ledger.json").read_text())
        assert ledger["last_restart"]["pid"] == pid
        log = svfleet.hosts[name].log_path.read_text()
        for m in h["markers"]:
            assert m["text"] in log


@needs_fleet
def test_rollback_restores_pristine_files_and_restarts_through_supervisor(op, svfleet):
    assert op.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "sv2").code == 0
    patched_pid = svfleet.server_pid("sv2")
    run = op.run("rollback", "--hosts", "sv2", "--timeout", "60")
    assert run.code == 0, run
    assert run.host("sv2")["status"] == "rolled-back"
    for rel in (EAGLE, EAGLE_V2):
        assert sha256(svfleet.hosts["sv2"].site_packages / rel) == pristine(rel)
        assert run.host("sv2")["files"][rel] == pristine(rel)
    pid = svfleet.server_pid("sv2")
    assert pid not in (None, patched_pid)
    assert ppid(pid) == svfleet.supervisord_pid("sv2")
    status = op.run("status", "--hosts", "sv2")
    assert status.code == 0, status
    h = status.host("sv2")
    assert h["server_up"] is True and h["server_pid"] == pid
    assert h["applied"] == []


@needs_fleet
def test_status_shows_the_supervised_server_up_then_down(op, svfleet):
    run = op.run("status")
    assert run.code == 0, run
    for name in ("sv1", "sv2"):
        assert run.host(name)["server_up"] is True
        assert run.host(name)["server_pid"] == svfleet.server_pid(name)
    assert "sglang: stopped" in svfleet.supervisorctl("sv1", "stop", "sglang").stdout
    run = op.run("status", "--hosts", "sv1")
    assert run.host("sv1")["server_up"] is False and run.host("sv1")["server_pid"] is None


@needs_fleet
def test_a_program_that_dies_while_starting_fails_at_once_with_its_log(op, svfleet):
    started = time.monotonic()
    run = op.run("deploy-patch", "--patch", "crash-in-init", "--patches", str(FIXTURE_PATCHES),
                 "--hosts", "sv2", "--timeout", "60")
    assert run.code == 1, run
    h = run.host("sv2")
    assert h["status"] == "restart-failed", run
    assert "fleetpatch test: crash in __init__" in h["message"]
    assert time.monotonic() - started < 45, "fails at once, not at the timeout"
    assert svfleet.server_pid("sv2") is None
    assert svfleet.supervisord_pid("sv2"), "supervisord itself keeps running"


@needs_fleet
def test_supervisord_down_is_a_loud_restart_failure(op, svfleet):
    h = svfleet.hosts["sv1"]
    svfleet.stop_server("sv1")
    assert svfleet.supervisord_pid("sv1") is None
    before = sha256(h.site_packages / EAGLE)
    run = op.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "sv1", "--timeout", "30", "--force")
    assert run.code == 1, run
    msg = run.host("sv1")["message"]
    assert run.host("sv1")["status"] == "restart-failed", run
    assert "supervisorctl" in msg and "supervisor.sock" in msg
    assert sha256(h.site_packages / EAGLE) != before, "--force wrote the files; the restart is what failed"
