"""A restart signals the pidfile's pid only when that process is the server: fleetpatch's own
(its mark in the environment), or the operator's (the configured command line, begun before
the pidfile was written). Anything else (a crash, then pid reuse) is named and left alone."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from fleetpatch import steps
from fleetpatch.agent import restart as agent_restart
from fleetpatch.agent.base import AgentError
from support.localhost import job


@pytest.fixture
def sleeper():
    """A live `sleep` in a session of its own, as a stranger's process holding a reused pid."""
    proc = subprocess.Popen(["/bin/sleep", "300"], start_new_session=True)
    while (Path(f"/proc/{proc.pid}/cmdline").read_bytes() or b"").split(b"\0")[0] != b"/bin/sleep":
        time.sleep(0.01)   # still the fork, not yet the sleep
    yield proc
    proc.kill()
    proc.wait()


def alive(proc) -> bool:
    return proc.poll() is None


def settings(tmp_path, pid, **kw) -> dict:
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{pid}\n")
    return dict({"pidfile": str(pidfile), "argv": ["/bin/sleep", "300"], "stop_grace": 5,
                 "state_dir": str(tmp_path / "state"), "server": None}, **kw)


def test_a_deploy_whose_pidfile_names_an_unrelated_process_signals_nothing_and_says_why(lh, sleeper):
    """The server crashed and its pid went to another process: the restart, as root, must not TERM it."""
    lh.pidfile.write_text(f"{sleeper.pid}\n")
    host = lh.host()
    r = steps.deploy(job(lh, host=host, force=True)[0], host)   # --force: past the pre-flight, to the restart
    assert alive(sleeper), "the sleep was signalled"
    assert r.status == "restart-failed", r.message
    assert f"{lh.pidfile} names pid {sleeper.pid}, which is not the server" in r.message
    assert f"its command line `/bin/sleep 300` runs another program than server.restart.start `{lh.python}" in r.message
    assert "fleetpatch signalled nothing" in r.message and f"remove {lh.pidfile}" in r.message
    assert lh.pidfile.read_text() == f"{sleeper.pid}\n", "no server was started over it"
    assert not lh.lock.exists()


def test_a_pid_reused_by_a_process_with_the_servers_command_line_is_not_signalled(tmp_path, sleeper):
    """Begun after the pidfile was written: the pidfile's process ended, whatever runs now is another."""
    restart = settings(tmp_path, sleeper.pid)
    written = time.time() - 60
    os.utime(restart["pidfile"], (written, written))
    with pytest.raises(AgentError) as e:
        agent_restart.stop_command_server(restart)
    assert alive(sleeper)
    assert e.value.code == "restart-failed"
    assert f"names pid {sleeper.pid}, which is not the server: it started at " in e.value.message
    assert "after the pidfile was written" in e.value.message


def test_the_operators_server_by_its_command_line_is_stopped(tmp_path, sleeper):
    restart = settings(tmp_path, sleeper.pid)
    assert agent_restart.stop_command_server(restart) == {"stopped": sleeper.pid, "signal": "TERM"}
    assert not alive(sleeper)


def test_the_operators_server_is_stopped_after_start_was_given_a_new_flag(tmp_path, sleeper):
    """The operator changed `start` (a new flag) since the server was launched: the process still
    runs that program, so the restart stops it and starts the new command line."""
    restart = settings(tmp_path, sleeper.pid, argv=["/bin/sleep", "300", "--new-flag"])
    assert agent_restart.stop_command_server(restart) == {"stopped": sleeper.pid, "signal": "TERM"}
    assert not alive(sleeper)


def test_an_interpreter_running_another_module_is_not_the_server(tmp_path):
    """The same python, but another `-m` module: not the server, whatever its flags."""
    proc = subprocess.Popen(["python3", "-m", "http.server", "--bind", "127.0.0.1", "0"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while b"http.server" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            time.sleep(0.01)
        restart = settings(tmp_path, proc.pid, argv=["python3", "-m", "sglang.launch_server", "--port", "0"])
        with pytest.raises(AgentError) as e:
            agent_restart.stop_command_server(restart)
        assert proc.poll() is None
        assert "runs another program than server.restart.start `python3 -m sglang.launch_server" in e.value.message
    finally:
        proc.kill()
        proc.wait()


def test_the_server_fleetpatch_started_is_known_by_its_mark_whatever_its_command_line(tmp_path):
    restart = settings(tmp_path, 0, argv=["/bin/sleep", "299"])   # the inventory's start changed since
    env = dict(os.environ, **{agent_restart.STARTED_BY: agent_restart.started_value(restart)})
    proc = subprocess.Popen(["/bin/sleep", "300"], start_new_session=True, env=env)
    try:
        Path(restart["pidfile"]).write_text(f"{proc.pid}\n")
        written = time.time() - 60   # even a pidfile older than it: the mark says whose it is
        os.utime(restart["pidfile"], (written, written))
        assert agent_restart.stop_command_server(restart) == {"stopped": proc.pid, "signal": "TERM"}
        assert proc.wait(5) is not None
    finally:
        proc.kill()
        proc.wait()


def test_a_server_on_its_way_out_is_the_server_though_its_command_line_is_gone(tmp_path, sleeper):
    """A server that crashed a moment ago (its scheduler raised) is still in its exit when a
    rollback restarts it: the kernel shows no command line or environment for it any more, only
    its PF_EXITING flag. It began before its pidfile was written, so it is the server, and the
    stop waits it out; it is not refused as `another program`, which left the host rolled back
    but not restarted. A zombie is in the same state, for good."""
    from fleetpatch.agent import procs
    dying = subprocess.Popen(["/bin/true"])
    deadline = time.monotonic() + 10
    while procs.proc_stat(dying.pid).state != "Z":   # not reaped: its exit is done, its pid still taken
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        stat = procs.proc_stat(dying.pid)
        assert stat.exiting and procs.proc_argv(dying.pid) is None
        server_argv = ["/bin/true"]
        written = time.time()
        assert procs.stat_mismatch(stat, written, None, server_argv, dying.pid) is None
        # the same empty command line on a process that is not exiting is another program
        live = procs.proc_stat(sleeper.pid)
        assert not live.exiting
        assert "runs another program" in procs.stat_mismatch(live, written, None, server_argv, sleeper.pid)
        # and one that began after the pidfile was written took a dead server's pid, exiting or not
        assert "after the pidfile was written" in procs.stat_mismatch(stat, written - 3600, None, server_argv,
                                                                       dying.pid)
    finally:
        dying.wait()
