"""The agent's waits end when the thing waited for happens, not at the next poll:
a stopped server is noticed through its pidfd, a written log wakes the follow."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from fleetpatch import hostagent

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd and inotify are Linux's")


def readable(fds, wait=0.0):
    return bool(fds) and bool(select.select(fds, [], [], wait)[0])


@linux_only
def test_a_written_log_makes_the_watch_readable_and_a_quiet_one_does_not(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"old line\n")
    watch = hostagent.LogWatch(str(log))
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
    watch = hostagent.LogWatch(str(log))
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
    watch = hostagent.LogWatch(str(log))
    r, w = os.pipe()
    try:
        reader = hostagent.RequestReader(r)
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
        assert hostagent.wait_pid_gone(quick.pid, 20) is True
        assert hostagent.pid_alive(quick.pid) is False
        assert hostagent.wait_pid_gone(slow.pid, 0.3) is False
        assert hostagent.pid_alive(slow.pid) is True
    finally:
        slow.kill()
        slow.wait()
        quick.wait()
