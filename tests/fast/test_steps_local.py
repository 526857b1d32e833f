"""The deploy, rollback, verify-logs and status flows on the local transport:
the real agent, the real SGLang files and the real stand-in server, in a
directory tree, no sshd. Each test takes about a second; a change to
`steps.py` or the agent (`fleetpatch/agent/`) is checked here first."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from support.localhost import EAGLE, EAGLE_V2, LocalHost, job, sha256
from fleetpatch import steps
from fleetpatch.agent import ledger as agent_ledger, lock as agent_lock, restart as agent_restart
from fleetpatch.agent.session import op_follow
from fleetpatch.agent.state import AgentState, RequestReader


@pytest.fixture
def lh2(tmp_path, template):
    h = LocalHost(tmp_path / "h2", template, name="h2", spec_v2=True)
    yield h
    h.stop()


def hand_edit(lh: LocalHost) -> str:
    """Someone fixed the spot the patch changes by hand: its context no longer matches."""
    path = lh.file(EAGLE)
    original = path.read_text()
    text = original.replace("        # Parse arguments\n        self.server_args = server_args\n",
                            "        # Parse arguments (hand edit)\n        self.server_args = server_args\n", 1)
    assert text != original
    path.write_text(text)
    return sha256(path)


# ----------------------------------------------------------------- deploy

def test_deploy_verifies_the_path_that_runs_in_three_round_trips(lh):
    j, host = job(lh)
    r = steps.deploy(j, host)
    assert (r.status, r.executed_path, r.patch) == ("verified", "EAGLEWorker", "spec-path-beacon@1"), r.message
    assert r.round_trips == 3, "probe+lock, apply+restart, follow+record+unlock"
    assert any(m["text"] in lh.log.read_text() for m in r.markers)
    assert not lh.is_pristine() and not lh.lock.exists()
    ledger = lh.ledger()
    assert ledger["patches"]["spec-path-beacon"]["verification"]["status"] == "verified"
    assert ledger["last_verification"]["status"] == "verified"
    assert ledger["restart_pending"] is False
    assert lh.server_pid() == ledger["last_restart"]["pid"]


def test_already_applied_changes_nothing_and_does_not_restart(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    pid, st = lh.server_pid(), lh.file(EAGLE).stat()
    again = steps.deploy(j, host)
    assert again.status == "already-applied", again.message
    assert "still verified" in again.message
    assert lh.server_pid() == pid
    st2 = lh.file(EAGLE).stat()
    assert (st2.st_ino, st2.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert not lh.lock.exists()


def test_drift_is_refused_untouched_not_restarted_and_the_lock_released(lh):
    j, host = job(lh)
    edited = hand_edit(lh)
    v2 = sha256(lh.file(EAGLE_V2))
    check = steps.check_patch(j, host)
    assert check.status == "conflict" and "hunk" in check.message
    r = steps.deploy(j, host)
    assert r.status == "drift" and "hunk" in r.message
    assert sha256(lh.file(EAGLE)) == edited and sha256(lh.file(EAGLE_V2)) == v2, "no host is left half-patched"
    assert lh.server_pid() is None, "not restarted"
    assert not lh.lock.exists()
    assert lh.ledger().get("patches", {}) == {}


def test_no_restart_leaves_a_pending_restart_that_the_next_deploy_finishes(lh):
    j, host = job(lh, no_restart=True)
    r = steps.deploy(j, host)
    assert r.status == "applied" and r.round_trips == 2
    assert lh.server_pid() is None and lh.ledger()["restart_pending"] is True
    assert not lh.lock.exists()
    j2, _ = job(lh)
    again = steps.deploy(j2, host)
    assert again.status == "verified", again.message
    assert again.round_trips == 3
    assert lh.ledger()["restart_pending"] is False and lh.server_pid()


def test_preflight_refuses_a_patch_whose_path_does_not_run(lh):
    j, host = job(lh, "v2-only-beacon")
    r = steps.deploy(j, host)
    assert r.status == "not-executed" and "SGLANG_ENABLE_SPEC_V2" in r.message
    assert lh.is_pristine() and not lh.lock.exists()


def test_failed_verification_with_keep_leaves_the_patch_and_releases_the_lock(lh):
    j, host = job(lh, "v2-only-beacon", force=True)
    r = steps.deploy(j, host)
    assert r.status == "not-executed" and r.markers == []
    assert sha256(lh.file(EAGLE_V2)) != lh.pristine[EAGLE_V2], "it was deployed"
    assert not lh.lock.exists(), "--on-failure keep releases the lock"
    assert lh.ledger()["patches"]["v2-only-beacon"]["verification"]["status"] == "not-executed"


def test_failed_verification_with_rollback_restores_the_originals(lh):
    j, host = job(lh, "crash-in-init", on_failure="rollback")
    r = steps.deploy(j, host)
    assert r.status == "rolled-back", r.message
    assert r.details["rollback"]["ok"] is True
    assert lh.is_pristine() and not lh.lock.exists()
    assert lh.ledger()["patches"] == {}
    assert lh.server_pid(), "the server runs again, without the patch"


def test_a_start_that_cannot_run_is_restart_failed_and_the_rollback_releases_the_lock(lh):
    host = lh.host(start="/nonexistent/python -m sglang_standin")
    j, _ = job(lh, on_failure="rollback", host=host, force=True)  # the server is down: nothing to predict from
    r = steps.deploy(j, host)
    assert r.status == "restart-failed" and "/nonexistent/python" in r.message
    assert "rollback FAILED" in r.message
    assert lh.is_pristine() and not lh.lock.exists()
    assert lh.ledger()["restart_pending"] is True


def test_stale_marker_from_an_earlier_run_does_not_pass_a_failed_restart(lh):
    stale = ("[2026-01-05 10:11:12] fleetpatch spec-path-beacon: EAGLEWorker "
             "(sglang/srt/speculative/eagle_worker.py) topk=4 overlap=False\n")
    lh.log.write_text(stale + "[2026-01-05 10:11:13] The server is fired up and ready to roll!\n")
    inv_env = lh.inventory()["hosts"]["h1"]["server"]["restart"]["env"]
    host = lh.host(env=dict(inv_env, SGLANG_ENABLE_SPEC_V2="True"))  # topk 4 with spec v2: a ValueError
    j, _ = job(lh, host=host, force=True)
    r = steps.deploy(j, host)
    assert r.status == "restart-failed" and r.markers == []
    assert "topk = 1" in r.message
    assert stale in lh.log.read_text()
    assert not lh.lock.exists()


def test_a_lock_held_by_another_run_is_left_alone(lh):
    lh.state.mkdir(exist_ok=True)
    other = json.dumps({"token": "other", "holder": "alice@laptop pid 4242", "since": "now"})
    lh.lock.write_text(other)
    j, host = job(lh)
    r = steps.deploy(j, host)
    assert r.status == "locked" and "alice@laptop pid 4242" in r.message
    assert lh.lock.read_text() == other, "someone else's lock is never removed without --break-lock"
    assert lh.is_pristine() and r.round_trips == 1
    broken = steps.deploy(job(lh, break_lock=True)[0], host)
    assert broken.status == "verified" and not lh.lock.exists()


# -------------------------------------------------------------- rollback

def test_an_inventory_that_would_restart_the_server_onto_the_other_path_is_refused_before_any_write(lh2):
    """The running server was started on spec v2, but hosts.yaml's start and env (what a command
    restart uses) would start it on v1: a v2-only patch passes by the running process, yet after
    fleetpatch's restart it would never run. Refused by the pre-flight, nothing written, not restarted."""
    j, host = job(lh2)
    assert steps.deploy(j, host).ok and steps.rollback(job(lh2, None)[0], host).ok   # the server runs v2
    pid, pristine = lh2.server_pid(), dict(lh2.pristine)
    start = host.server.restart.start.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4")
    v1 = lh2.host(start=start, env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "0"})
    for r in (steps.check_patch(job(lh2, "v2-only-beacon", host=v1)[0], v1),
              steps.deploy(job(lh2, "v2-only-beacon", host=v1)[0], v1)):
        assert r.status == "not-executed", r.message
        assert "would never execute (pre-flight)" in r.message and "the server will run EAGLEWorker " in r.message
        assert "from the inventory's start and env, which fleetpatch restarts the server with; the running " \
               "server was started otherwise and runs EAGLEWorkerV2" in r.message, r.message
    assert lh2.is_pristine() and lh2.server_pid() == pid and not lh2.lock.exists()
    assert {rel: sha256(lh2.file(rel)) for rel in pristine} == pristine
    # the same inventory with the running server's settings passes
    assert steps.check_patch(job(lh2, "v2-only-beacon")[0], host).status == "applies"


def test_a_rollback_whose_restart_would_not_start_the_server_is_refused_untouched(lh):
    """hosts.yaml now sets spec v2, which with topk 4 does not start: a rollback's command restart
    would take the running server down. Refused, nothing restored; --force goes ahead."""
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    pid, patched = lh.server_pid(), sha256(lh.file(EAGLE))
    env = dict(host.server.restart.env, SGLANG_ENABLE_SPEC_V2="True")
    broken = lh.host(env=env)
    r = steps.rollback(job(lh, None, host=broken)[0], broken)
    assert r.status == "error" and "rollback refused: the inventory's start and env would not start" in r.message, \
        r.message
    assert "Spec v2 currently only supports topk = 1" in r.message and "nothing was restored" in r.message
    assert sha256(lh.file(EAGLE)) == patched and lh.server_pid() == pid and not lh.lock.exists()
    assert "spec-path-beacon" in lh.ledger()["patches"]
    forced = steps.rollback(job(lh, None, host=broken, force=True)[0], broken)
    assert forced.status == "restart-failed", forced.message   # what the refusal spared the server
    assert lh.is_pristine()


def test_rollback_restores_pristine_bytes_and_restarts_without_the_marker(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    pid = lh.server_pid()
    r = steps.rollback(job(lh, None)[0], host)
    assert r.status == "rolled-back", r.message
    assert r.files == lh.pristine and lh.is_pristine()
    assert lh.server_pid() not in (None, pid)
    assert not lh.lock.exists() and r.round_trips == 3
    assert lh.ledger()["patches"] == {}


def test_rollback_of_stacked_patches_goes_newest_first_under_one_lock(lh2):
    lh = lh2
    assert steps.deploy(job(lh, "dynamic-spec-disable")[0], lh.host()).ok
    assert steps.deploy(job(lh, "v2-only-beacon")[0], lh.host()).ok
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.status == "rolled-back", r.message
    assert lh.is_pristine() and not lh.lock.exists()
    assert lh.ledger()["patches"] == {}


def test_rollback_of_stacked_patches_restarts_the_server_once_and_names_every_patch_undone(lh2):
    """Each restart of a GPU server is a model load: the patches are restored newest first, and the
    server restarted once, after the last; the result names both and checks both patches' markers."""
    lh = lh2
    assert steps.deploy(job(lh, "dynamic-spec-disable")[0], lh.host()).ok
    assert steps.deploy(job(lh, "v2-only-beacon")[0], lh.host()).ok
    starts = lh.log.read_text().count("server_args=")
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.status == "rolled-back", r.message
    assert lh.log.read_text().count("server_args=") == starts + 1, "one restart for the host's rollback"
    head = r.message.splitlines()[0]
    assert "v2-only-beacon@1" in head and "dynamic-spec-disable@" in head, r.message
    assert head.index("v2-only-beacon") < head.index("dynamic-spec-disable"), "newest first"
    assert lh.is_pristine() and not lh.lock.exists() and lh.ledger()["patches"] == {}
    assert not lh.ledger()["restart_pending"]
    assert r.round_trips == 4, r.round_trips   # probe+lock, the first restore, the last with its restart, follow


def test_rollback_with_nothing_recorded_says_so(lh):
    r = steps.rollback(job(lh, None)[0], lh.host())
    assert r.ok and "nothing to roll back" in r.message
    assert not lh.lock.exists() and r.round_trips == 2


# ------------------------------------------------------ verify-logs, status

def test_verify_logs_rereads_the_last_restart_window_without_a_lock(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    before = lh.ledger()["last_verification"]["at"]
    time.sleep(1.1)
    r = steps.verify_logs(job(lh, None)[0], host)
    assert r.status == "verified" and r.executed_path == "EAGLEWorker", r.message
    assert r.round_trips == 2 and not lh.lock.exists()
    assert lh.ledger()["last_verification"]["at"] != before, "the verdict is recorded"


def test_verify_logs_writes_the_ledger_only_under_the_hosts_lock_and_says_locked_while_another_run_holds_it(lh):
    """verify-logs holds no lock while it reads; its verdict's read-modify-write of the ledger is done
    under the host's lock, so it can neither lose nor bring back an entry of a deploy or rollback
    that holds it: then nothing is written, and the host is `locked`."""
    from fleetpatch.steps.context import connect, new_run
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    before = (lh.state / "ledger.json").read_bytes()
    other = new_run(job(lh)[0], host)   # another run (its own token), holding the lock
    connect(other)
    try:
        with steps.HostLock(other.remote, host, other.job, "deploy-patch --patch spec-path-beacon") as held:
            held.probe([], content=False)
            r = steps.verify_logs(job(lh, None)[0], host)
            assert not r.ok and r.status == "locked", r.message
            assert "locked by a live fleetpatch run" in r.message and "was not recorded" in r.message, r.message
            assert "judged (verified)" in r.message, r.message
            assert (lh.state / "ledger.json").read_bytes() == before, "nothing written without the lock"
            assert json.loads(lh.lock.read_text())["token"] == other.job.token, "the other run's lock is kept"
    finally:
        other.remote.close()
    assert not lh.lock.exists()
    r = steps.verify_logs(job(lh, None)[0], host)
    assert r.ok and r.status == "verified" and r.round_trips == 2, r.message
    assert (lh.state / "ledger.json").read_bytes() != before and not lh.lock.exists(), "recorded, lock released"


def test_verify_logs_on_a_host_never_restarted_says_deploy_first(lh):
    r = steps.verify_logs(job(lh, None)[0], lh.host())
    assert r.status == "error" and "deploy first" in r.message


def test_status_shows_what_is_applied_and_drift(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).ok
    st = steps.status(job(lh, None)[0], host)
    assert st.ok and st.details["applied"] == ["spec-path-beacon@1"] and st.details["server_up"]
    lh.file(EAGLE).write_text(lh.file(EAGLE).read_text() + "\n# drift\n")
    st = steps.status(job(lh, None)[0], host)
    assert st.status == "drift" and st.details["drift"] == [EAGLE]


def test_a_pending_restart_that_moves_the_server_to_another_path_says_so(lh2):
    """--no-restart left the patch written and its restart pending; the next deploy makes that
    restart with hosts.yaml's start and env, which now lead to spec v1: the result says the restart
    moved the server from EAGLEWorkerV2 to EAGLEWorker, as a deploy that writes does."""
    host = lh2.host()
    assert steps.deploy(job(lh2)[0], host).ok and steps.rollback(job(lh2, None)[0], host).ok   # v2 runs
    assert steps.deploy(job(lh2, no_restart=True)[0], host).status == "applied"
    v1 = lh2.host(start=host.server.restart.start.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4"),
                  env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "0"})
    moved = steps.deploy(job(lh2, host=v1)[0], v1)
    assert (moved.status, moved.executed_path) == ("verified", "EAGLEWorker"), moved.message
    (note,) = moved.details["notes"]
    assert note.startswith("the restart moved the server from EAGLEWorkerV2 to EAGLEWorker: "), note


def test_the_session_environment_that_a_restart_inherits_counts_in_what_it_will_run(lh2, monkeypatch):
    """A command restart inherits the SSH session's environment (a host's /etc/environment through
    PAM, sshd's SetEnv), with hosts.yaml's env over it. Here the session sets SGLANG_ENABLE_SPEC_V2
    and hosts.yaml does not: the server runs spec v2 however fleetpatch restarts it. The pre-flight
    must not refuse a v2-only patch as "would never execute", nor status or check-patch warn of a
    move to EAGLEWorker that no restart makes."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "True")   # the agent's, so the restart's, environment
    host = lh2.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "0"})
    assert "SGLANG_ENABLE_SPEC_V2" not in host.server.restart.env
    first = steps.deploy(job(lh2, "v2-only-beacon", host=host)[0], host)   # no server yet: the launch is predicted
    assert (first.status, first.executed_path) == ("verified", "EAGLEWorkerV2"), first.message
    assert "notes" not in first.details, first.details["notes"]
    assert "notes" not in steps.status(job(lh2, None, host=host)[0], host).details
    again = steps.check_patch(job(lh2, "dynamic-spec-disable", host=host)[0], host)   # the server runs now
    assert again.status == "applies" and "note:" not in again.message, again.message
    assert steps.rollback(job(lh2, None, host=host)[0], host).ok


def test_status_warns_when_the_inventory_would_restart_the_server_onto_another_path_or_not_at_all(lh2):
    """The story's trap, one restart away: the running server (spec v2) runs the verified patch, but
    hosts.yaml's start and env, which fleetpatch restarts it with, would start EAGLEWorker, or no
    server at all. status says so for the host (a note; the host is still ok now), and says nothing
    where the inventory agrees with the running server. check-patch of the patch (it changes both
    paths, so it passes) says it too: deploy-patch's restart would switch the path that runs."""
    j, host = job(lh2)
    assert steps.deploy(j, host).ok
    agreed = steps.status(job(lh2, None)[0], host)
    assert agreed.ok and "notes" not in agreed.details, agreed.details.get("notes")
    v1 = lh2.host(start=host.server.restart.start.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4"),
                  env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "0"})
    st = steps.status(job(lh2, None, host=v1)[0], v1)
    assert st.ok and st.status == "ok", st.message
    (note,) = st.details["notes"]
    note_cause = note.split("which fleetpatch restarts it with, ", 1)[1].split("; bring hosts.yaml", 1)[0]
    assert note.startswith("a restart would run EAGLEWorker, not EAGLEWorkerV2 as now: in the inventory's start "
                           "and env, which fleetpatch restarts it with, ") and \
        "bring hosts.yaml and the running server in line" in note, note
    # check-patch of the patch for both paths passes, and says the same before deploy-patch's restart
    both = steps.check_patch(job(lh2, host=v1)[0], v1)
    assert both.status == "already-applied" and f"note: {note}" in both.message, both.message
    assert "note:" not in steps.check_patch(job(lh2)[0], host).message
    down = lh2.host(start=host.server.restart.start.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4"))
    (note,) = steps.status(job(lh2, None, host=down)[0], down).details["notes"]
    assert note.startswith("a restart would not start the server, which now runs EAGLEWorkerV2: with the "
                           "inventory's start and env, which fleetpatch restarts it with, it would stop with \"Spec "
                           "v2 currently only supports topk = 1"), note
    # deploy-patch goes ahead (the patch changes both paths) and says that its restart moved the path
    assert steps.rollback(job(lh2, None)[0], host).ok
    moved = steps.deploy(job(lh2, host=v1)[0], v1)
    assert (moved.status, moved.executed_path) == ("verified", "EAGLEWorker"), moved.message
    assert moved.details["notes"] == [
        "the restart moved the server from EAGLEWorkerV2 to EAGLEWorker: in the inventory's start and env, "
        "which fleetpatch restarted it with, " + note_cause + "; the server had been started otherwise"], moved.details
    in_line = steps.deploy(job(lh2, "dynamic-spec-disable", host=v1)[0], v1)
    assert in_line.ok and "notes" not in in_line.details, (in_line.message, in_line.details.get("notes"))


# ------------------------------------------ locks left by runs that exited normally

def test_a_probe_that_fails_after_taking_the_lock_releases_it(lh):
    """engine.python without sglang: the probe takes the lock, then cannot find the package."""
    host = lh.host()
    host = dataclasses.replace(host, engine=dataclasses.replace(host.engine, python=sys.executable))
    j, _ = job(lh, host=host)
    r = steps.deploy(j, host)
    assert r.status == "error" and "cannot import sglang" in r.message
    assert not lh.lock.exists(), "the next run must not need --break-lock"


def test_a_host_whose_pth_file_prints_without_a_newline_still_answers(lh):
    (lh.site / "zz-noisy.pth").write_text("import sys; sys.stdout.write('hello from a .pth file')\n")
    j, host = job(lh)
    r = steps.deploy(j, host)
    assert r.status == "verified", r.message
    assert not lh.lock.exists()


# ------------------------------------------------------ monotonic deadlines

def test_a_clock_step_does_not_cut_the_stop_grace(tmp_path, monkeypatch):
    """The wall clock jumps an hour ahead while the server is stopping: it still
    gets its TERM grace (a wall-clock deadline would SIGKILL it at once)."""
    script = tmp_path / "slow_stop.py"
    script.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.3), sys.exit(0)))\n"
                      "print('up', flush=True)\n"
                      "while True: time.sleep(1)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{proc.pid}\n")
    real, calls = time.time, itertools.count()
    monkeypatch.setattr(time, "time", lambda: real() + (3600 if next(calls) else 0))  # steps after 1 read
    try:
        out = agent_restart.stop_command_server({"pidfile": str(pidfile), "stop_grace": 5,
                                                 "argv": [sys.executable, str(script)]})
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert out == {"stopped": proc.pid, "signal": "TERM"}
    assert proc.returncode == 0


def test_a_clock_step_does_not_end_follow_early(tmp_path, monkeypatch, capsys):
    log = tmp_path / "server.log"
    log.write_text("")
    r, w = os.pipe()
    state = AgentState()
    state.requests = RequestReader(r)   # the channel the laptop's decision comes on
    started = time.time()
    monkeypatch.setattr(time, "time", lambda: started + 3600 * (time.monotonic() > t0 + 0.2))
    t0 = time.monotonic()
    req = {"log": str(log), "state_dir": str(tmp_path / "state"), "timeout": 5, "restart": {"kind": "command"}}

    def answer():
        time.sleep(1.0)
        os.write(w, b"[]\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        out = op_follow(state, req)
    finally:
        os.close(w)
        os.close(r)
    assert out["ended"] == "finished", out
    assert time.monotonic() - t0 >= 1.0
    assert '"t": "deadline"' not in capsys.readouterr().out


def test_a_supervisor_program_name_with_a_space_fails_the_probe_and_releases_the_lock(lh):
    host = lh.host(kind="supervisor", program="sglang server", config=str(lh.root / "supervisord.conf"),
                   start=None, pidfile=None, workdir=None, env={})
    r = steps.deploy(job(lh, host=host)[0], host)
    assert r.status == "error" and "'sglang server' is not one supervisor program name" in r.message
    assert not lh.lock.exists() and lh.is_pristine()


def test_at_its_deadline_follow_still_runs_the_decision_so_the_lock_is_released(tmp_path, capsys):
    """The agent's own deadline passes first: it says so, and the laptop's answer to
    that event (record the timeout, release the lock) still runs."""
    state = tmp_path / "state"
    req = {"log": str(tmp_path / "server.log"), "state_dir": str(state), "timeout": -5,
           "restart": {"kind": "command"}, "lock_token": "t1"}
    agent = AgentState()
    agent_lock.take_lock(agent, req, {"token": "t1", "holder": "me", "force": False})
    r, w = os.pipe()
    agent.requests = RequestReader(r)
    update = {"last_verification": {"at": "now", "status": "timeout", "labels": ["x@1"]}}
    decision = [dict(req, op="record", ledger_update=update), dict(req, op="unlock")]
    threading.Timer(0.3, lambda: os.write(w, json.dumps(decision).encode() + b"\n")).start()
    try:
        out = op_follow(agent, req)
    finally:
        os.close(w)
        os.close(r)
    assert '"t": "deadline"' in capsys.readouterr().out
    assert out.pop("timings")["agent_cpu_s"] > 0   # the process's CPU by then (here: the test's)
    assert out == {"ended": "deadline", "then": [{"recorded": True}, {"unlocked": True}]}
    assert not (state / "lock").exists()
    assert agent_ledger.load_ledger(req)["last_verification"]["status"] == "timeout"


def test_a_server_that_never_gets_ready_times_out_and_the_lock_is_released(lh):
    host = lh.host(env={"FLEETPATCH_STANDIN_STARTUP_DELAY": "60"})
    r = steps.deploy(job(lh, host=host, timeout=2)[0], host)
    assert r.status == "timeout", r.message
    assert not lh.lock.exists()
    assert lh.ledger()["last_verification"]["status"] == "timeout"
