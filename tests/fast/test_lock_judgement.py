"""The judgement of a lock record, pure: which evidence makes a run dead, and
that a same-named laptop (another boot) or a fresh renewal keeps it live."""
from __future__ import annotations

import os
import subprocess
import sys

from fleetpatch import lockview

HERE, BOOT = "box", "boot-1"


def record(**kw):
    base = {"token": "t", "holder": "bob@box pid 1", "since": "2026-12-01T00:00:00+0000", "idle_s": 1.0,
            "age_s": 90.0, "renew_s": 5.0, "command": "rollback"}
    return {**base, **kw}


def judge(rec, runs=lambda pid, start: True):
    return lockview.assess(rec, here=HERE, runs=runs, boot=BOOT)


def test_fresh_renewal_on_another_laptop_is_live():
    v = judge(record(holder="alice@far pid 7", laptop="far"))
    assert v.alive and v.why == "renewed 1 s ago" and v.cell() == "alice@far pid 7, 90 s, live"


def test_stale_after_five_periods_not_before():
    assert judge(record(idle_s=24.9, laptop="far")).alive
    v = judge(record(idle_s=25.1, laptop="far"))
    assert not v.alive and "not renewed for 25 s" in v.why


def test_gone_process_here_is_dead_at_once_but_not_on_a_same_named_laptop_of_another_boot():
    gone = lambda pid, start: False
    assert not judge(record(laptop=HERE, pid=1, boot_id=BOOT), runs=gone).alive
    assert not judge(record(), runs=gone).alive, "an old lock: host and pid from the holder text"
    assert judge(record(laptop=HERE, pid=1, boot_id="boot-2"), runs=gone).alive


def test_a_reused_pid_is_not_the_holder():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = lockview.process_start(p.pid)
        assert lockview.process_runs(p.pid, start)
        assert not lockview.process_runs(p.pid, start + 1), "same pid, another process"
    finally:
        p.kill()
        p.wait()
    assert not lockview.process_runs(p.pid, start)
    assert lockview.process_runs(os.getpid(), None)


def test_channel_lost_is_dead_and_the_clear_command_is_one_line():
    v = judge(record(orphaned={"at": "T", "how": "the laptop closed the channel", "after": ["apply"]}))
    assert not v.alive and v.why.startswith("its channel ended at T")
    msg = lockview.refusal("a01", record(orphaned={"at": "T", "after": ["apply"]}), "deploy-patch --patch x@2")
    assert msg.splitlines()[-1] == "  fleetpatch deploy-patch --patch x@2 --break-lock --hosts a01"


def test_the_clear_command_names_the_inventory_the_run_was_given():
    msg = lockview.refusal("a01", record(orphaned={"at": "T", "after": ["apply"]}), "rollback",
                           "/srv/my fleet/hosts.yaml")
    assert msg.splitlines()[-1] == "  fleetpatch rollback --break-lock --hosts a01 --inventory '/srv/my fleet/hosts.yaml'"
