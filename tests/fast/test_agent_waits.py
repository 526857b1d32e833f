"""The agent's waits end when the thing waited for happens, not at the next poll:
a stopped server is noticed through its pidfd, a written log wakes the follow."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from fleetpatch.agent.logs import LogWatch
from fleetpatch.agent.procs import pid_alive, wait_pid_gone
from fleetpatch.agent.state import RequestReader
from support.follows import follow_of

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd and inotify are Linux's")


def readable(fds, wait=0.0):
    return bool(fds) and bool(select.select(fds, [], [], wait)[0])


@linux_only
def test_a_written_log_makes_the_watch_readable_and_a_quiet_one_does_not(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"old line\n")
    watch = LogWatch(str(log))
    try:
        assert watch.fds(), "inotify is missing: the follow would only poll"
        assert not readable(watch.fds())
        with open(log, "ab") as f:
            f.write(b"The server is fired up and ready to roll!\n")
        assert readable(watch.fds(), 5)
        watch.drain()
        assert not readable(watch.fds())
    finally:
        watch.close()


@linux_only
def test_the_watch_follows_a_log_rotated_under_its_name(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"before rotation\n")
    watch = LogWatch(str(log))
    try:
        log.rename(tmp_path / "sglang.log.1")
        log.write_bytes(b"")
        assert readable(watch.fds(), 5)          # the new file appeared under the name
        watch.drain()
        with open(log, "ab") as f:
            f.write(b"a line in the new file\n")
        assert readable(watch.fds(), 5)          # and its lines wake the follow
    finally:
        watch.close()


@linux_only
def test_a_request_wait_ends_when_the_log_is_written(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"")
    watch = LogWatch(str(log))
    r, w = os.pipe()
    try:
        reader = RequestReader(r)
        with open(log, "ab") as f:
            f.write(b"a line\n")
        t = time.monotonic()
        assert reader.poll(30, watch) is None     # woken, no request
        assert time.monotonic() - t < 25, "the wait ran to its end: the log did not wake it"
        os.write(w, b'[{"op": "bye"}]\n')
        assert reader.poll(30, watch) == b'[{"op": "bye"}]'
    finally:
        watch.close()
        os.close(r)
        os.close(w)


def test_a_process_that_exits_is_gone_and_one_that_lingers_is_not():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # quick is not reaped here: a zombie counts as gone
        assert wait_pid_gone(quick.pid, 20) is True
        assert pid_alive(quick.pid) is False
        assert wait_pid_gone(slow.pid, 0.3) is False
        assert pid_alive(slow.pid) is True
    finally:
        slow.kill()
        slow.wait()
        quick.wait()


@linux_only
def test_a_watched_follow_waits_for_the_log_not_the_clock_and_never_spins(tmp_path):
    """With inotify the follow's timer is slow (the log wakes it); a health check that falls
    due shortens the wait, and one that is overdue but not made (the server is dead, so
    check_health skips it) still leaves a real wait: no busy loop until the laptop decides."""
    with follow_of(tmp_path / "sglang.log", health_url="http://127.0.0.1:9/health") as follow:
        assert follow.watch is not None and follow.watch.fds()
        follow.next_health = time.monotonic() + 60
        assert follow.poll_wait() == follow.WATCHED_POLL_S > follow.POLL_S
        follow.next_health = time.monotonic() + 0.1
        assert follow.POLL_S <= follow.poll_wait() <= 0.1
        follow.next_health = time.monotonic() - 5      # overdue, and check_health will not run it
        assert follow.poll_wait() >= follow.POLL_S
        follow.health_url = None
        assert follow.poll_wait() == follow.WATCHED_POLL_S
