"""A restart puts the probe in while the old server drains: the TERM goes first, the install
runs while the old process is still exiting, and the new server starts only after both."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fleetpatch.agent import ops, probing
from fleetpatch.agent import restart as agent_restart
from fleetpatch.agent.procs import pid_alive
from fleetpatch.agent.state import AgentState

SERVER = """\
import pathlib, signal, sys, time
def drain(*_):
    pathlib.Path(sys.argv[1]).write_text("TERM")
    time.sleep(0.5)          # a drain: the process lives on a while after its TERM
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
pathlib.Path(sys.argv[2]).write_text("up")
while True:
    time.sleep(1)
"""


@pytest.fixture
def server(tmp_path):
    """A command server's settings and files: (request, the TERM note, the up note)."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    term, up = tmp_path / "term", tmp_path / "up"
    req = {"restart": {"kind": "command", "argv": [sys.executable, str(script), str(term), str(up)],
                       "pidfile": str(tmp_path / "server.pid"), "stop_grace": 10},
           "state_dir": str(tmp_path / "state"), "server_name": None, "log": str(tmp_path / "server.log")}
    yield req, term, up
    pid = agent_restart.read_pid(req["restart"]["pidfile"])
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def appears(path: Path, within: float = 20) -> bool:
    deadline = time.monotonic() + within
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_probe_goes_in_after_the_old_servers_term_and_before_the_new_one_starts(server):
    req, term, up = server
    old = agent_restart.start_command_server(agent_restart.restart_settings(req), req["log"])
    assert appears(up)
    up.unlink()
    seen = []

    def install():
        # the TERM's handler notes it: it appears now only if the TERM was sent before this call
        seen.append({"term_sent": appears(term, 5), "old_alive": pid_alive(old),
                     "pidfile": agent_restart.read_pid(req["restart"]["pidfile"]), "new_started": up.exists()})

    result = agent_restart.restart_server(req, {}, "deploy", meanwhile=install)
    assert seen == [{"term_sent": True, "old_alive": True, "pidfile": old, "new_started": False}]
    assert result["stopped"] == old and result["signal"] == "TERM"
    assert not pid_alive(old)
    assert result["pid"] != old and agent_restart.read_pid(req["restart"]["pidfile"]) == result["pid"]
    assert appears(up)   # the new server runs


def test_with_no_server_running_the_probe_still_goes_in_before_the_start(server):
    req, term, up = server
    order = []
    result = agent_restart.restart_server(req, {}, "deploy", meanwhile=lambda: order.append(up.exists()))
    assert order == [False], "the install ran once, before the server started"
    assert result["stopped"] is None and pid_alive(result["pid"])
    assert appears(up)
    assert not term.exists()


def test_a_probe_that_cannot_go_in_after_the_term_still_lets_the_restart_finish(server, tmp_path):
    """The install fails after the old server has its TERM (here: a directory where a stale probe
    .pth would be): the new server is started all the same, and the reply says why the probe is off."""
    req, term, up = server
    site = tmp_path / "site-packages"
    (site / "zzz-fleetpatch-probe-old.pth").mkdir(parents=True)
    state = Path(req["state_dir"])
    state.mkdir()
    (state / probing.INSTALLED).write_text(json.dumps({"site_dir": str(site), "token": "old"}))
    old = agent_restart.start_command_server(agent_restart.restart_settings(req), req["log"])
    assert appears(up)
    up.unlink()
    restart, probe, _ = ops.restart_with_probe(AgentState(), req, {}, "deploy")
    assert restart["stopped"] == old and not pid_alive(old)
    assert pid_alive(restart["pid"]) and appears(up), "the new server was not started"
    assert probe["installed"] is False
    assert "the probe could not go in" in probe["error"] and "zzz-fleetpatch-probe-old.pth" in probe["error"]
