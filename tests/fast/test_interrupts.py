"""Ctrl-C as a careful operator expects it: a host whose Ctrl-C came before its
write writes and restarts nothing; an interrupted run never says OK nor writes
ok: true; a Ctrl-C pressed again says what the run still waits for and how to
quit anyway. Hosts on the local transport (the real agent and stand-in server)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetpatch import report, rollout, steps
from fleetpatch.cli_common import Common, finish
from fleetpatch.errors import Status
from fleetpatch.hostcalls import HostResult
from support.localhost import job
from support.paths import REPO


def ctrl_c_at(j: steps.Job, phase: str) -> None:
    """The run's Ctrl-C comes while the host is in `phase` (as the rollout's loop fires it)."""
    def progress(host, ph, detail=""):
        if ph == phase:
            j.interrupt.fire()
    j.progress = progress


def test_a_ctrl_c_before_the_write_leaves_the_host_untouched_and_not_restarted(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).status == "verified"   # a server fleetpatch restarted, to compare with
    assert steps.rollback(job(lh)[0], host).status == "rolled-back"
    pid, ledger = lh.server_pid(), lh.ledger()
    j, host = job(lh)
    ctrl_c_at(j, "pre-flight")   # the probe and lock are done: the host is read, nothing written yet
    r = steps.deploy(j, host)
    assert r.status == "interrupted", r.message
    assert r.message == "h1: interrupted (Ctrl-C) before anything was written; untouched, not restarted"
    assert lh.is_pristine() and lh.server_pid() == pid
    assert lh.ledger() == ledger, "nothing recorded either"
    assert not lh.lock.exists()


def test_a_ctrl_c_before_a_rollback_s_restore_leaves_the_patch_in_place(lh):
    j, host = job(lh)
    assert steps.deploy(j, host).status == "verified"
    pid = lh.server_pid()
    j, host = job(lh)
    ctrl_c_at(j, "fetch")
    r = steps.rollback(j, host)
    assert r.status == "interrupted", r.message
    assert not lh.is_pristine() and lh.server_pid() == pid and not lh.lock.exists()


def test_an_interrupted_run_whose_hosts_all_succeeded_says_interrupted_and_ok_false(tmp_path, capsys):
    results = {"h1": HostResult("h1", True, Status.VERIFIED, "h1: verified", patch="p@1")}
    stop = rollout.Stop()
    stop.set("interrupted (Ctrl-C): no new host was started; the hosts in flight were let finish (or roll back)",
             interrupted=True)
    path = tmp_path / "r.json"
    try:
        finish(report.make_console(), "deploy-patch", results, report.now_iso(), Common(report=str(path)), stop)
        raise AssertionError("an interrupted run must end as interrupted (exit 130)")
    except KeyboardInterrupt:
        pass
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "INTERRUPTED: deploy-patch on 1 host: 1 verified", last
    doc = json.loads(path.read_text())
    assert doc["ok"] is False and doc["interrupted"] is True, doc


# A run of two hosts whose steps wait to be released: Ctrl-C once, then again, then release them.
TWICE = textwrap.dedent("""
    import os, signal, sys, threading, time
    from fleetpatch import rollout
    from fleetpatch.errors import Status
    from fleetpatch.hostcalls import HostResult

    class H:
        node_group = node_rank = None
        def __init__(self, name):
            self.name = name

    started, release, told = threading.Barrier(3), threading.Event(), []

    def step(host):
        started.wait()
        release.wait()
        return HostResult(host.name, True, Status.VERIFIED, host.name + ": verified")

    def operator():
        started.wait()
        time.sleep(0.3)   # the loop is back in its wait on both hosts, not between a submit and its record
        os.kill(os.getpid(), signal.SIGINT)
        while not stop.interrupt.is_set():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        while not told:
            time.sleep(0.01)
        release.set()

    from fleetpatch import dialer
    stop = rollout.Stop(interrupt=dialer.Interrupt(), tell=told.append)
    threading.Thread(target=operator, daemon=True).start()
    results = {}
    rollout.run_stage([H("a01"), H("a02")], rollout.each_host(step), 2, results, stop)
    print(told[0])
    print(sorted((n, str(r.status)) for n, r in results.items()), stop.interrupted)
""")


def test_a_second_ctrl_c_says_what_the_run_still_waits_for_and_how_to_quit_anyway():
    p = subprocess.run([sys.executable, "-c", TWICE], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    said, outcome = p.stdout.splitlines()
    pid = said.rsplit("kill -9 ", 1)[1].split()[0]
    assert said == (f"fleetpatch: interrupted; still waiting for 2 hosts in flight (a01, a02) to finish (or roll "
                    "back) the step each is in, so that none is left half-done and locked; to quit now anyway: "
                    f"kill -9 {pid} (then `fleetpatch status` shows what each host was left in)")
    assert outcome == "[('a01', 'verified'), ('a02', 'verified')] True"



# The console script's start, with the terminal's Ctrl-C arriving while the CLI's modules load
# (as it does in the first half second on a slow laptop): sent when Invoke starts to import.
LOADING = textwrap.dedent("""
    import os, signal, sys

    class CtrlC:
        def find_spec(self, name, path=None, target=None):
            if name == "invoke":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, CtrlC())
    sys.argv = ["fleetpatch", "status", "--inventory", sys.argv[1]]
    from fleetpatch.__main__ import entry
    entry()
""")


def test_a_ctrl_c_while_the_program_still_loads_is_one_line_and_exit_130():
    p = subprocess.run([sys.executable, "-c", LOADING, str(REPO / "hosts.yaml")], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert (p.returncode, p.stdout, p.stderr) == (130, "", "fleetpatch: interrupted while starting; nothing was done\n")


@pytest.mark.parametrize("signame,said", [("SIGINT", "fleetpatch: interrupted\n"),
                                          ("SIGTERM", "fleetpatch: interrupted (SIGTERM)\n")], ids=["ctrl-c", "sigterm"])
def test_a_ctrl_c_while_the_command_reads_its_inputs_is_one_line_and_exit_130(tmp_path, signame, said):
    """Before any host is at work (here: the inventory is a pipe nobody writes, so the command
    waits in its read), Ctrl-C ends it with one line, not silently; a SIGTERM too."""
    import os
    import signal
    import time
    os.mkfifo(tmp_path / "hosts.yaml")
    p = subprocess.Popen([sys.executable, "-m", "fleetpatch", "rollout", "--patch", "spec-path-beacon",
                          "--inventory", str(tmp_path / "hosts.yaml"), "--group", "all"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    try:
        wchan = Path(f"/proc/{p.pid}/wchan")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and wchan.read_text() != "wait_for_partner":   # in the pipe's open
            time.sleep(0.05)
        p.send_signal(getattr(signal, signame))
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert (p.returncode, out, err) == (130, "", said)


def test_a_ctrl_c_after_every_host_finished_still_prints_the_whole_outcome_and_writes_the_report(
        tmp_path, capsys, monkeypatch):
    """The hosts are done; the Ctrl-C comes while the summary is printed. It cut the summary off
    ("fleetpatch: interrupted", exit 130) and no report was written: the run's outcome was lost."""
    import os
    import signal
    results = {"h1": HostResult("h1", True, Status.VERIFIED, "h1: verified", patch="p@1")}
    printing = report.print_outcome

    def ctrl_c_then_print(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)   # delivered to this (the main) thread before the next line
        return printing(*args, **kw)
    monkeypatch.setattr(report, "print_outcome", ctrl_c_then_print)
    path = tmp_path / "r.json"
    finish(report.make_console(), "deploy-patch", results, report.now_iso(), Common(report=str(path)), rollout.Stop())
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "OK: deploy-patch succeeded on its one host: 1 verified", last
    assert json.loads(path.read_text())["ok"] is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Ctrl-C works again once it is printed"


def test_a_ctrl_c_while_status_prints_its_table_still_prints_every_host_and_the_last_line(
        lh, tmp_path, capsys, monkeypatch):
    """status has every host's answer; the Ctrl-C comes as the table starts printing. It cut the
    table and the hosts' messages off: the report had them, the operator's screen did not."""
    import os
    import signal
    import yaml
    from fleetpatch import cli_hosts
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump(lh.inventory()))
    results = {"h1": HostResult("h1", True, Status.OK, "h1: ok", details={
        "reachable": True, "applied": ["p@1"], "drift": [], "server_up": True,
        "notes": ["a restart would run EAGLEWorker, not EAGLEWorkerV2 as now"]})}
    monkeypatch.setattr(rollout, "run_all", lambda *args, **kw: (results, rollout.Stop()))
    table = report.status_table

    def ctrl_c_then_table(res):
        os.kill(os.getpid(), signal.SIGINT)   # delivered to this (the main) thread before the next line
        return table(res)
    monkeypatch.setattr(report, "status_table", ctrl_c_then_table)
    path = tmp_path / "r.json"
    cli_hosts.status.body(None, inventory=str(inventory), report=str(path))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("h1: note: a restart would run EAGLEWorker") for line in lines), lines
    assert lines[-1].startswith("OK: status"), lines[-1]
    assert json.loads(path.read_text())["ok"] is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Ctrl-C works again once it is printed"
