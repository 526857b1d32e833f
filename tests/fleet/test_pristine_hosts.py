"""The fixtures reset only the hosts a test changed (tests/support/pristine.py): a host left as
its last reset left it keeps running untouched, and any change to its files, its commands log,
its server's log or the processes in its namespace makes the next restore reset it to the
release's pristine files with a fresh server."""
from __future__ import annotations

import os
import subprocess
import urllib.request

from fleetpatch_demo.wheels import sglang_tree
from support.marks import needs_fleet
from support.paths import sha256

pytestmark = needs_fleet

EAGLE = "sglang/srt/speculative/eagle_worker.py"


def test_restore_resets_exactly_the_hosts_that_changed_and_keeps_the_others_running(fleet, pristine):
    pristine.restore(fleet)
    assert pristine.changed(fleet) == []
    pids = {n: fleet.server_pid(n) for n in fleet.hosts}
    hosts = fleet.hosts

    # v1a: one SSH command that changes nothing but the commands log
    fleet.ssh("v1a", "true", check=True)
    # v2a: one engine file rewritten with as many bytes, its mtime put back as it was
    f = hosts["v2a"].site_packages / EAGLE
    before, data = f.stat(), f.read_bytes()
    assert b"import" in data
    f.write_bytes(data.replace(b"import", b"IMPORT", 1))
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    # v1b: one more process in its namespace
    argv, fds = fleet.nsenter_argv("v1b", "sleep", "300")
    extra = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert any(pid != pids["v1b"] for pid in fleet.processes("v1b"))
        # old: one request to its server (an access-log line)
        with urllib.request.urlopen(hosts["old"].health_url, timeout=10) as r:
            assert r.status == 200

        assert pristine.changed(fleet) == ["v1a", "v2a", "v1b", "old"]
        assert pristine.restore(fleet) == ["v1a", "v2a", "v1b", "old"]
        assert extra.wait(timeout=30) is not None, "the reset ended the extra process"
    finally:
        if extra.poll() is None:
            extra.kill()
            extra.wait()

    assert fleet.server_pid("v2b") == pids["v2b"], "v2b was left as it was, its server running"
    for name in ("v1a", "v2a", "v1b", "old"):
        assert fleet.server_pid(name) not in (None, pids[name]), f"{name}: a fresh server"
        assert fleet.commands(name) == []
    assert sha256(f) == sha256(sglang_tree("0.5.9") / EAGLE)
    assert pristine.changed(fleet) == []
