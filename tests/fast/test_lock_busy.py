"""The lock is not freed under an agent that still changes the host.

A run whose channel stalled or was cut during apply, restart or rollback reconnects
to release its lock, and the next run from the same machine takes over a lock whose
holder's process is gone; meanwhile the first channel's agent may still be stopping
or starting the server. The agent of such a request notes itself beside the lock
(`lock-busy`); a release or a takeover for that run is refused while that process runs.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fleetpatch.agent import lock
from fleetpatch.agent.base import AgentError
from fleetpatch.agent.state import AgentState


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def worker():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def held(tmp_path, worker, start_offset=0):
    state = tmp_path / "state"
    state.mkdir()
    (state / "lock").write_text(json.dumps({"token": "run-1", "holder": "root@laptop pid 1"}))
    (state / "lock-busy").write_text(json.dumps({"token": "run-1", "pid": worker.pid, "op": "apply",
                                                 "start": start_ticks(worker.pid) + start_offset}))
    return state, {"state_dir": str(state), "lock_token": "run-1"}


def test_a_release_waits_for_the_agent_still_at_work_then_clears_everything(tmp_path, worker):
    state, req = held(tmp_path, worker)
    with pytest.raises(AgentError) as e:
        lock.release_lock(AgentState(), req)
    assert e.value.code == "locked"
    assert f"the host agent (pid {worker.pid})" in e.value.message and "still running its apply" in e.value.message
    assert f"kill {worker.pid}" in e.value.message
    assert (state / "lock").exists()
    worker.kill()
    worker.wait()
    lock.release_lock(AgentState(), req)
    assert sorted(p.name for p in state.iterdir()) == [], "the lock and its busy note are gone"


def test_a_takeover_waits_for_the_agent_still_at_work(tmp_path, worker):
    state, _ = held(tmp_path, worker)
    claim = {"token": "run-2", "holder": "root@laptop pid 2", "force": True}
    with pytest.raises(AgentError) as e:
        lock.take_lock(AgentState(), {"state_dir": str(state)}, claim)
    assert e.value.code == "locked" and "taking the lock over" in e.value.message
    assert json.loads((state / "lock").read_text())["token"] == "run-1"


def test_a_reused_pid_is_not_taken_for_the_agent(tmp_path, worker):
    state, req = held(tmp_path, worker, start_offset=1)   # the pid now names another process
    lock.release_lock(AgentState(), req)
    assert not (state / "lock").exists() and not (state / "lock-busy").exists()
