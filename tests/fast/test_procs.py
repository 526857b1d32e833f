"""/proc/<pid>/stat is read by one helper (agent/procs.py), on real processes."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from fleetpatch import lockview
from fleetpatch.agent import procs

SRC = Path(__file__).resolve().parents[2] / "src"

# a command name that fools a split at the first ")" or on blanks: it holds ") (", blanks and
# digits where the state, the parent and the session would be
TRICKY_COMM = "w) (x 1 2 3 4)"


@pytest.fixture
def tricky_process(tmp_path):
    """A live `sleep` whose command name (comm, from the name it was run by) is TRICKY_COMM."""
    link = tmp_path / TRICKY_COMM
    link.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(link), "60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text().rstrip("\n") != TRICKY_COMM:
            assert time.monotonic() < deadline, "the sleep never ran under its tricky name"
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_proc_stat_of_a_process_whose_name_holds_parens_and_blanks(tricky_process):
    stat = procs.proc_stat(tricky_process.pid)
    assert stat is not None
    assert stat.comm == TRICKY_COMM
    assert stat.state in ("S", "R")
    assert stat.ppid == os.getpid()
    assert stat.session == tricky_process.pid == stat.pgrp   # start_new_session: its own leader
    assert stat.start >= procs.own_start() > 0
    # the agent's and the laptop's readers of it all go through the helper
    assert procs.pid_alive(tricky_process.pid)
    assert lockview.process_start(tricky_process.pid) == stat.start
    assert lockview.process_runs(tricky_process.pid, stat.start)
    assert not lockview.process_runs(tricky_process.pid, stat.start + 1), "a reused pid has another start"


def test_proc_stat_of_a_zombie_and_of_a_gone_process(tmp_path):
    proc = subprocess.Popen(["/bin/true"])
    deadline = time.monotonic() + 10
    while procs.proc_stat(proc.pid).state != "Z":
        assert time.monotonic() < deadline, "/bin/true never ended"
        time.sleep(0.01)
    assert not procs.pid_alive(proc.pid)
    proc.wait()
    assert procs.proc_stat(proc.pid) is None


def test_pid_watch_says_alive_until_the_process_ends_a_zombie_included():
    proc = subprocess.Popen(["/bin/sleep", "60"])
    watch = procs.PidWatch(proc.pid)
    try:
        assert watch.alive() and watch.alive()
        proc.kill()
        deadline = time.monotonic() + 10
        while watch.alive():
            assert time.monotonic() < deadline, "the killed sleep never ended"
            time.sleep(0.01)
        assert procs.proc_stat(proc.pid).state == "Z"   # not reaped: its pid is still taken
        assert not watch.alive() and not procs.pid_alive(proc.pid)
    finally:
        watch.close()
        proc.kill()
        proc.wait()


def test_pid_watch_of_a_process_already_gone_says_dead():
    proc = subprocess.Popen(["/bin/true"])
    proc.wait()
    watch = procs.PidWatch(proc.pid)
    assert not watch.alive()
    watch.close()


@pytest.mark.parametrize("data", [b"", b"123", b"123 (name", b"123 (name) S 1 2", b"1 (a) S x 2 3" + b" 0" * 30])
def test_parse_proc_stat_says_none_for_what_is_not_a_stat_line(data):
    assert procs.parse_proc_stat(data) is None


def test_only_the_helper_opens_proc_stat():
    """One reader: a second one is where a comm with ") (" gets misread."""
    opens = re.compile(r"""/proc/[^"' ]*/stat["']""")
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if opens.search(p.read_text()))
    assert readers == ["fleetpatch/agent/procs.py"], readers
