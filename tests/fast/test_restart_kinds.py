"""Restart kinds systemd and supervisor.

systemd: argv construction and output parsing are pure functions of the host
agent, tested here without a running systemd; the agent's systemd restart and
journal follow are also driven against stand-in `systemctl`/`journalctl`
scripts on PATH (that checks the plumbing, not systemd itself).

supervisor: its argv and output parsing here; for real, end to end, on sshd
test hosts in tests/fleet/test_supervisor.py.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fleetpatch.agent import base as agent_base, ledger as agent_ledger, logs as agent_logs
from fleetpatch.agent import restart as agent_restart
from fleetpatch.inventory import InventoryError, load_inventory

INVOCATION = "5b1c0e2a9f0d4c7e8a6b3d2f1e0c9b8a"


# ------------------------------------------------------------ systemd, pure

def test_systemd_restart_and_show_argv():
    r = {"kind": "systemd", "unit": "sglang.service"}
    assert agent_restart.systemd_restart_argv(r) == ["systemctl", "restart", "--", "sglang.service"]
    assert agent_restart.systemd_show_argv(r) == ["systemctl", "show", "--property=MainPID", "--property=InvocationID",
                                          "--", "sglang.service"]
    # a unit name is one argv word, whatever it holds: nothing reaches a shell
    odd = {"kind": "systemd", "unit": "sglang@gpu 0;rm -rf.service"}
    assert agent_restart.systemd_restart_argv(odd)[-1] == "sglang@gpu 0;rm -rf.service"


@pytest.mark.parametrize("output,pid", [
    ("MainPID=4242\nInvocationID=%s\n" % INVOCATION, 4242),
    ("InvocationID=%s\nMainPID=17\n" % INVOCATION, 17),
    ("MainPID=0\nInvocationID=\n", None),          # unit inactive: no main process
    ("4242\n", 4242),                              # `--value` output
    ("0\n", None),
    ("MainPID=\n", None),
    ("", None),
    ("Failed to connect to bus: No such file or directory\n", None),
    ("Unit sglang.service could not be found.\n", None),
    ("System has not been booted with systemd as init system (PID 1). Can't operate.\n", None),
])
def test_parse_main_pid(output, pid):
    assert agent_restart.parse_main_pid(output) == pid


@pytest.mark.parametrize("output,invocation", [
    ("MainPID=4242\nInvocationID=%s\n" % INVOCATION, INVOCATION),
    ("MainPID=4242\nInvocationID=5B1C0E2A-9F0D-4C7E-8A6B-3D2F1E0C9B8A\n", INVOCATION),
    ("MainPID=4242\n", None),                      # systemd < 232 has no invocation ids
    ("MainPID=4242\nInvocationID=\n", None),
    ("MainPID=4242\nInvocationID=not-an-id\n", None),
])
def test_parse_invocation_id(output, invocation):
    assert agent_restart.parse_invocation_id(output) == invocation


def test_journal_argv_by_invocation_follows_every_entry_of_that_run():
    argv = agent_restart.journal_argv("sglang.service", invocation=INVOCATION, since=1700000000.9)
    assert argv == ["journalctl", "--no-pager", "--quiet", "--all", "--output=cat",
                    "_SYSTEMD_INVOCATION_ID=" + INVOCATION, "--follow", "--no-tail"]


def test_journal_argv_without_invocation_uses_the_unit_since_the_restart_second():
    argv = agent_restart.journal_argv("sglang.service", since=1700000000.9)
    assert argv == ["journalctl", "--no-pager", "--quiet", "--all", "--output=cat",
                    "--unit=sglang.service", "--since=@1700000000", "--follow", "--no-tail"]
    assert agent_restart.journal_argv("u", since=5, follow=False)[-2:] == ["--unit=u", "--since=@5"]


def test_uses_journal_only_for_systemd_without_a_log_file():
    assert agent_restart.uses_journal({"kind": "systemd"}, "journal")
    assert agent_restart.uses_journal({"kind": "systemd"}, None)
    assert agent_restart.uses_journal({"kind": "systemd"}, "")
    assert not agent_restart.uses_journal({"kind": "systemd"}, "/data/logs/sglang.log")
    assert not agent_restart.uses_journal({"kind": "supervisor"}, "journal")
    assert not agent_restart.uses_journal({"kind": "command"}, None)


# --------------------------------------------------------- supervisor, pure

def test_supervisor_argv():
    r = {"kind": "supervisor", "program": "sglang", "config": "/etc/supervisor/supervisord.conf"}
    assert agent_restart.supervisor_argv(r, "stop") == ["supervisorctl", "-c", "/etc/supervisor/supervisord.conf",
                                                "stop", "sglang"]
    assert agent_restart.supervisor_argv(r, "pid", ["/py", "-m", "supervisor.supervisorctl"]) == [
        "/py", "-m", "supervisor.supervisorctl", "-c", "/etc/supervisor/supervisord.conf", "pid", "sglang"]
    assert agent_restart.supervisor_argv({"program": "sglang"}, "start") == ["supervisorctl", "start", "sglang"]
    assert agent_restart.supervisor_argv({"program": "serving:sglang"}, "start")[-1] == "serving:sglang"


@pytest.mark.parametrize("program", ["all", "two words", "", "x\ny"])
def test_supervisor_argv_refuses_what_is_not_one_program(program):
    with pytest.raises(agent_base.AgentError) as e:
        agent_restart.supervisor_argv({"program": program}, "stop")
    assert "program" in e.value.message


@pytest.mark.parametrize("output,pid", [
    ("12345\n", 12345),
    ("0\n", None),                                  # not running
    ("No such process sglang\n", None),
    ("unix:///var/run/supervisor.sock no such file\n", None),
    ("unix:///var/run/supervisor.sock refused connection\n", None),
    ("", None),
])
def test_parse_supervisor_pid(output, pid):
    assert agent_restart.parse_supervisor_pid(output) == pid


@pytest.mark.parametrize("output,state", [
    ("sglang: stopped\n", "stopped"),
    ("sglang: started\n", "started"),
    ("sglang: ERROR (not running)\n", "not running"),
    ("sglang: ERROR (already started)\n", "already started"),
    ("sglang: ERROR (spawn error)\n", "spawn error"),
    ("sglang: ERROR (abnormal termination)\n", "abnormal termination"),
    ("sglang: ERROR (no such process)\n", "no such process"),
    ("sglang-router: started\n", None),             # another program's line
    ("unix:///var/run/supervisor.sock no such file\n", None),
    ("error: <class 'PermissionError'>, [Errno 13] Permission denied: file: ...\n", None),
])
def test_parse_supervisor_result(output, state):
    assert agent_restart.parse_supervisor_result(output, "sglang") == state


def test_supervisorctl_from_path_else_this_interpreters_package(tmp_path, monkeypatch):
    tool = tmp_path / "supervisorctl"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert agent_restart.supervisorctl_command() == [str(tool)]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert agent_restart.supervisorctl_command() == [sys.executable, "-m", "supervisor.supervisorctl"]


# --------------------------------------- systemd against stand-in tools

def fake_tool(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n"
                    f'printf "%s\\n" "$*" >> "{bindir}/calls.log"\n' + body)
    path.chmod(0o755)


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_tool(bindir, "systemctl",
              'case "$1" in\n'
              '  restart) exit 0 ;;\n'
              f'  show) printf "MainPID=4242\\nInvocationID={INVOCATION}\\n" ;;\n'
              'esac\n')
    fake_tool(bindir, "journalctl",
              'echo "[2026-01-01 00:00:00] first line"\n'
              'echo "[2026-01-01 00:00:01] The server is fired up and ready to roll!"\n'
              'exec sleep 60\n')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return bindir


def systemd_req(tmp_path, log="journal"):
    return {"state_dir": str(tmp_path / "state"), "log": log,
            "restart": {"kind": "systemd", "unit": "sglang.service"}}


def calls(bindir: Path) -> list[str]:
    return (bindir / "calls.log").read_text().splitlines()


def read_until(follower, n, timeout=10.0):
    lines, first = [], None
    deadline = time.monotonic() + timeout
    while len(lines) < n and time.monotonic() < deadline:
        for _, line_no, batch in follower.read():
            first = line_no if first is None else first
            lines.extend(batch)
        time.sleep(0.02)
    return first, lines


def test_systemd_restart_records_the_journal_window_and_follow_reads_that_run(tmp_path, fake_systemd):
    req = systemd_req(tmp_path)
    ledger = agent_ledger.load_ledger(req)
    before = time.time()
    out = agent_restart.restart_server(req, ledger, "deploy x@1")
    assert calls(fake_systemd) == ["restart -- sglang.service",
                                   "show --property=MainPID --property=InvocationID -- sglang.service"]
    assert out["pid"] == 4242 and out["unit"] == "sglang.service"
    assert out["journal"]["invocation"] == INVOCATION
    assert before <= out["journal"]["since"] <= time.time()
    assert ledger["last_restart"]["journal"] == out["journal"]
    agent_ledger.save_ledger(req, ledger)
    follower = agent_logs.open_follower(req)
    try:
        first, lines = read_until(follower, 2)
    finally:
        follower.close()
    assert first == 1
    assert lines == ["[2026-01-01 00:00:00] first line",
                     "[2026-01-01 00:00:01] The server is fired up and ready to roll!"]
    assert calls(fake_systemd)[-1] == ("--no-pager --quiet --all --output=cat _SYSTEMD_INVOCATION_ID=%s "
                                       "--follow --no-tail" % INVOCATION)
    assert follower.proc.poll() is not None, "journalctl is stopped when follow ends"


def test_systemd_with_a_log_file_follows_the_file(tmp_path, fake_systemd):
    log = tmp_path / "sglang.log"
    log.write_text("old run\n")
    req = systemd_req(tmp_path, str(log))
    ledger = agent_ledger.load_ledger(req)
    out = agent_restart.restart_server(req, ledger, "deploy")
    assert "journal" not in out and "journal" not in ledger["last_restart"]
    assert out["offset"] == len("old run\n")
    follower = agent_logs.open_follower(dict(req, inode=out["inode"], offset=out["offset"]))
    assert isinstance(follower, agent_logs.LogFollower)


def test_systemd_restart_failure_is_restart_failed_with_systemctls_words(tmp_path, fake_systemd):
    fake_tool(fake_systemd, "systemctl",
              'echo "Job for sglang.service failed because the control process exited with error code."\n'
              'exit 1\n')
    with pytest.raises(agent_base.AgentError) as e:
        agent_restart.restart_server(systemd_req(tmp_path), {}, "deploy")
    assert e.value.code == "restart-failed"
    assert "Job for sglang.service failed" in e.value.message
    assert "journalctl -u sglang.service" in e.value.message


def test_journalctl_that_cannot_read_the_journal_is_an_error_not_a_wait(tmp_path, fake_systemd):
    fake_tool(fake_systemd, "journalctl",
              'echo "No journal files were opened due to insufficient permissions." >&2\nexit 1\n')
    follower = agent_logs.open_follower(systemd_req(tmp_path))
    with pytest.raises(agent_base.AgentError) as e:
        read_until(follower, 1)
    assert "insufficient permissions" in e.value.message
    assert "systemd-journal" in e.value.message


def test_follow_without_a_recorded_window_reads_the_unit_from_now(tmp_path, fake_systemd):
    follower = agent_logs.open_follower(systemd_req(tmp_path))
    try:
        read_until(follower, 2)
    finally:
        follower.close()
    argv = calls(fake_systemd)[-1].split()
    assert "--unit=sglang.service" in argv
    since = [a for a in argv if a.startswith("--since=@")]
    assert since and abs(int(since[0][len("--since=@"):]) - time.time()) < 5


# ------------------------------------------------------------- inventory

def inventory_text(log, kind_line):
    return ("hosts:\n  a:\n    address: h\n    engine: {python: /p}\n"
            f"    server:\n      log: {log}\n      restart: {kind_line}\n")


def test_inventory_accepts_journal_for_systemd_only(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(inventory_text("journal", "{kind: systemd, unit: sglang.service}"))
    assert load_inventory(path).hosts["a"].server.log == "journal"
    path.write_text(inventory_text("journal", "{kind: supervisor, program: sglang}"))
    with pytest.raises(InventoryError) as e:
        load_inventory(path)
    assert "hosts.a.server.log" in str(e.value) and "systemd" in str(e.value)
