"""What a person sees of a host's lock and of the last verification, running
the program against the real sshd fleet: `status` shows the lock (holder, age,
live or dead run) and which check the last verification was, of which patch; a
lock left by a dead run (its fleetpatch process on this machine is gone, or it
stopped being renewed) is said to be so, with the one command that clears it,
and that command, run as printed, does."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

from support.marks import needs_fleet

pytestmark = needs_fleet

EAGLE = "sglang/srt/speculative/eagle_worker.py"


def status_row(run, host: str) -> str:
    rows = [l for l in run.output.splitlines() if l.startswith(f"│ {host} ")]
    assert len(rows) == 1, run.output
    return rows[0]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def plant_lock(fleet, host: str, holder: str, idle_s: float = 0.0, **fields) -> os.PathLike:
    lock = fleet.hosts[host].state_dir / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"token": "other", "holder": holder, "since": "2026-01-01T00:00:00+0000",
                                "since_epoch": time.time() - idle_s, **fields}))
    os.utime(lock, (time.time() - idle_s, time.time() - idle_s))
    return lock


def clear_line(output: str, host: str) -> str:
    """The printed command that clears the lock: one whole line of the output."""
    lines = [l.strip() for l in output.splitlines() if "--break-lock" in l and l.strip().startswith("fleetpatch ")]
    assert lines, output
    assert all(f"--hosts {host}" in l for l in lines), lines
    return lines[0]


def run_printed(operator, line: str):
    argv = shlex.split(line)
    assert argv[0] == "fleetpatch"
    return operator.run(*argv[1:])


def test_status_says_which_check_the_last_verification_was_and_of_which_patch(operator, fleet):
    assert operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1a").code == 0
    row = status_row(operator.run("status", "--hosts", "v1a"), "v1a")
    assert "verified: deploy check of spec-path-beacon@1" in row, row
    assert row.rstrip("│ ").endswith("-"), "no lock held: the lock column says -"
    assert operator.run("verify-logs", "--hosts", "v1a", "--timeout", "10").code == 0
    assert "verified: verify-logs check of spec-path-beacon@1" in status_row(operator.run("status", "--hosts", "v1a"),
                                                                             "v1a")
    assert operator.run("rollback", "--hosts", "v1a", "--timeout", "10").code == 0
    assert "verified: rollback check of spec-path-beacon@1" in status_row(operator.run("status", "--hosts", "v1a"),
                                                                          "v1a")


def test_a_lock_whose_process_on_this_machine_is_gone_is_a_dead_run_with_its_clearing_command(operator, fleet):
    pid = dead_pid()
    holder = f"bob@{socket.gethostname()} pid {pid}"
    lock = plant_lock(fleet, "v2a", holder, laptop=socket.gethostname(), pid=pid,
                      command="deploy-patch --patch spec-path-beacon")
    st = operator.run("status", "--hosts", "v2a")
    assert st.code == 1, st
    assert f"{holder}, " in status_row(st, "v2a") and "DEAD run" in status_row(st, "v2a")
    assert f"(pid {pid}) no longer runs on this machine" in st.output
    assert clear_line(st.output, "v2a") == "fleetpatch deploy-patch --patch spec-path-beacon --break-lock --hosts v2a"
    assert st.host("v2a")["status"] == "locked"
    # A plain rerun converges: the holder is provably gone (this machine, its pid no longer runs),
    # so the deploy takes the lock over and says whose it was.
    done = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v2a")
    assert done.code == 0 and done.host("v2a")["status"] == "verified", done
    assert f"took over the lock left by {holder}" in done.host("v2a")["message"], done.report
    assert not lock.exists()
    assert status_row(operator.run("status", "--hosts", "v2a"), "v2a").rstrip("│ ").endswith("-")


def test_a_lock_not_renewed_is_a_dead_run_and_a_renewed_one_is_live(operator, fleet):
    holder = "alice@elsewhere.example pid 4242"
    lock = plant_lock(fleet, "v1b", holder, idle_s=600, command="rollback")
    st = operator.run("status", "--hosts", "v1b")
    assert st.code == 1 and "DEAD run" in status_row(st, "v1b"), st
    assert "it was not renewed for 10 min (a live run renews it every 5 s)" in st.output
    assert clear_line(st.output, "v1b") == "fleetpatch rollback --break-lock --hosts v1b"
    # given another inventory than ./hosts.yaml, the line to run says which
    inv = operator.workdir / "hosts.yaml"
    st = operator.run("status", "--hosts", "v1b", "--inventory", str(inv))
    assert clear_line(st.output, "v1b") == f"fleetpatch rollback --break-lock --hosts v1b --inventory {inv}"
    # the same lock, just renewed: another laptop's live run; status is fine, a deploy waits
    os.utime(lock)
    st = operator.run("status", "--hosts", "v1b")
    assert st.code == 0, st
    assert f"{holder}, 10 min, live" in status_row(st, "v1b")
    refused = operator.run("deploy-patch", "--patch", "spec-path-beacon", "--hosts", "v1b")
    assert refused.code == 1 and "locked by a live fleetpatch run" in refused.output, refused
    assert "wait for it to end" in refused.output and lock.exists()


def test_a_run_killed_mid_deploy_leaves_a_dead_lock_that_the_printed_command_clears(operator, fleet):
    doc = operator.inventory()
    doc["hosts"]["v2b"]["server"]["restart"]["env"]["FLEETPATCH_STANDIN_STARTUP_DELAY"] = "4"
    operator.write_inventory(doc)
    proc = subprocess.Popen([sys.executable, "-m", "fleetpatch", "deploy-patch", "--patch", "spec-path-beacon",
                             "--hosts", "v2b", "--timeout", "30"], cwd=operator.workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = ""
    for line in proc.stdout:  # kill it while it waits for the markers, after the apply
        seen += line
        if "verify" in line:
            break
    time.sleep(0.5)
    st = operator.run("status", "--hosts", "v2b")
    assert st.code == 0 and "live" in status_row(st, "v2b"), (seen, st)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while True:  # the agent finishes its step, then keeps the lock with the story
        st = operator.run("status", "--hosts", "v2b")
        if "DEAD run" in status_row(st, "v2b") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st.code == 1 and "DEAD run" in status_row(st, "v2b"), st
    assert f"pid {proc.pid}" in status_row(st, "v2b")
    assert "channel ended" in st.output and "after it ran apply" in st.output
    line = clear_line(st.output, "v2b")
    assert line == "fleetpatch deploy-patch --patch spec-path-beacon --break-lock --hosts v2b"
    done = run_printed(operator, line)
    assert done.code == 0 and done.host("v2b")["status"] in ("verified", "already-applied"), done
    assert not (fleet.hosts["v2b"].state_dir / "lock").exists()
