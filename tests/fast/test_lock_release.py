"""A release removes only the lock this run holds, even against a --break-lock racing it.

Between a release's check of the token and its removal, another run may break this
run's lock (--break-lock) and take its own under the same name. The removal must
then leave that run's lock alone: it renames the lock away to a name of its own,
checks the token in what it took, and puts another run's lock back (os.link, which
never replaces a lock made there since). The check and the removal are two calls
here, with the other run's takeover made between them: the interleaving is exact,
with real files and no stand-ins. (Before, the removal was a plain unlink of the
lock's name: the same sequence removed the other run's lock.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetpatch.agent import files, lock
from fleetpatch.agent.state import AgentState


def claim(token: str, force: bool = False) -> dict:
    return {"token": token, "holder": f"root@laptop {token}", "force": force, "renew_s": 60}


def lock_of(state_dir) -> dict:
    return json.loads((state_dir / "lock").read_text())


def test_a_lock_broken_and_taken_by_another_run_between_the_check_and_the_removal_stays(tmp_path):
    state_dir = tmp_path / "state"
    req = {"state_dir": str(state_dir), "lock_token": "run-1"}
    mine, theirs = AgentState(), AgentState()
    try:
        assert lock.take_lock(mine, req, claim("run-1"))
        # the release's check: this run holds the lock
        assert lock.read_lock(req)["token"] == "run-1"
        # meanwhile another run breaks it (--break-lock) and takes its own
        assert lock.take_lock(theirs, {"state_dir": str(state_dir)}, claim("run-2", force=True))
        taken = os.stat(state_dir / "lock").st_ino
        # the release's removal, for the token it checked
        assert lock.remove_if_ours(str(state_dir / "lock"), "run-1") is False
        assert lock_of(state_dir)["token"] == "run-2", "the other run's lock is still there"
        assert os.stat(state_dir / "lock").st_ino == taken, "the same file: its holder keeps renewing it"
        assert sorted(p.name for p in state_dir.iterdir()) == ["lock"], "nothing left under a temp name"
    finally:
        mine.renewal.stop()
        theirs.renewal.stop()


def test_a_release_for_a_token_that_no_longer_holds_the_lock_leaves_it_and_its_notes(tmp_path):
    state_dir = tmp_path / "state"
    theirs = AgentState()
    try:
        assert lock.take_lock(theirs, {"state_dir": str(state_dir)}, claim("run-2"))
        (state_dir / "lock-lost").write_text(json.dumps({"token": "run-2", "how": "the channel closed"}))
        lock.release_lock(AgentState(), {"state_dir": str(state_dir), "lock_token": "run-1"})
        assert lock_of(state_dir)["token"] == "run-2" and (state_dir / "lock-lost").exists()
    finally:
        theirs.renewal.stop()


def test_a_release_removes_this_runs_lock_and_its_notes_but_not_another_runs_note(tmp_path):
    state_dir = tmp_path / "state"
    req = {"state_dir": str(state_dir), "lock_token": "run-1"}
    state = AgentState()
    assert lock.take_lock(state, req, claim("run-1")) is True
    assert state.renewal.token == "run-1"
    (state_dir / "lock-lost").write_text(json.dumps({"token": "run-1", "how": "the channel closed"}))
    (state_dir / "lock-busy").write_text(json.dumps({"token": "run-0", "pid": 1}))   # an older run's, harmless
    lock.release_lock(state, req)
    assert sorted(p.name for p in state_dir.iterdir()) == ["lock-busy"]
    assert state.renewal.token is None, "the renewal of the released lock stopped"


def test_a_release_cut_short_by_a_kill_leaves_a_temp_file_the_next_run_removes(tmp_path):
    """Killed between its rename and its removal, a release leaves the lock under a temp
    name of its pid; the next run's recovery removes it (its pid is gone)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = state_dir / f".lock-release.fleetpatch-{int(dead.stdout)}.tmp"
    left.write_text(json.dumps({"token": "run-1"}))
    out = files.recover({"state_dir": str(state_dir)})
    assert out["removed_tmp"] == [str(left)] and not left.exists()
