"""Fleet-wide rollout from a laptop: canary, batches, failure budget,
unreachable hosts, Ctrl-C — on an 8-host fleet of real sshd hosts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.marks import needs_fleet
from support.operator import Operator
from support.paths import FIXTURE_PATCHES, sha256
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree
from support.standin_env import QUICK_STOP

pytestmark = needs_fleet

EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
FIX = ("--patches", str(FIXTURE_PATCHES))
# r0..r7; odd hosts run spec v2, even ones the v1 path (topk 4, no env)
NAMES = [f"r{i}" for i in range(8)]


@pytest.fixture(scope="module")
def fleet8(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet8")
    with Fleet(root, [HostSpec(n, spec_v2=(i % 2 == 1), startup_delay=0.3, env=QUICK_STOP) for i, n in enumerate(NAMES)]) as f:
        yield f


@pytest.fixture
def op8(fleet8, pristine, tmp_path):
    pristine.restore(fleet8)
    return Operator(fleet8, tmp_path)


def snapshot(fleet, names):
    return {n: (sha256(fleet.hosts[n].site_packages / EAGLE), sha256(fleet.hosts[n].site_packages / EAGLE_V2),
                fleet.server_pid(n)) for n in names}


PRISTINE = (sha256(sglang_tree("0.5.9") / EAGLE), sha256(sglang_tree("0.5.9") / EAGLE_V2))


def test_eight_host_rollout_with_a_canary_verifies_every_host(op8, fleet8):
    doc = op8.inventory()
    doc["groups"] = {"canary": ["r3"]}
    op8.write_inventory(doc)
    run = op8.run("rollout", "--patch", "dynamic-spec-disable", "--group", "all", "--batch", "4")
    assert run.code == 0, run
    assert run.report["stages"][0] == ["r3"]
    assert [len(s) for s in run.report["stages"]] == [1, 4, 3]
    for i, n in enumerate(NAMES):
        h = run.host(n)
        assert h["status"] == "verified", (n, h)
        assert h["executed_path"] == ("EAGLEWorkerV2" if i % 2 else "EAGLEWorker")
    assert "OK: rollout succeeded on all 8 hosts" in run.output
    for n in NAMES:  # counted by sshd's ForceCommand wrapper: one agent process per host
        assert len(fleet8.commands(n)) == 1, (n, [c[:60] for c in fleet8.commands(n)])


def test_a_failing_canary_stops_the_rollout_with_every_other_host_untouched(op8, fleet8):
    others = NAMES[1:]
    before = snapshot(fleet8, others)
    # r0 is a v1 host: the forced v2-only patch cannot run there
    run = op8.run("rollout", "--patch", "v2-only-beacon", *FIX, "--group", "all", "--force", "--timeout", "20")
    assert run.code == 1, run
    assert run.host("r0")["status"] == "rolled-back"
    assert sha256(fleet8.hosts["r0"].site_packages / EAGLE_V2) == PRISTINE[1]
    for n in others:
        assert run.host(n)["status"] == "skipped"
    assert snapshot(fleet8, others) == before
    for n in others:
        assert fleet8.commands(n) == [], f"{n} was contacted"
    assert "the canary failed" in run.output


def test_failure_budget_halts_the_rollout_and_rolls_the_failed_hosts_back(op8, fleet8):
    # one host at a time: r1 (v2) ok, r2 (v1) fails, r3 ok, r4 fails -> 2 > 1: stop
    run = op8.run("rollout", "--patch", "v2-only-beacon", *FIX, "--hosts", ",".join(NAMES[1:]), "--canary", "0",
                  "--parallel", "1", "--max-failures", "1", "--force", "--timeout", "20")
    assert run.code == 1, run
    assert [run.host(n)["status"] for n in ("r1", "r2", "r3", "r4")] == \
        ["verified", "rolled-back", "verified", "rolled-back"]
    for n in ("r2", "r4"):
        assert snapshot(fleet8, [n])[n][:2] == PRISTINE
        assert run.host(n)["rollback"]["ok"] is True
        assert not (fleet8.hosts[n].state_dir / "lock").exists(), "the lock held through the rollback is released"
        # deploy, failed verification and the rollback after it: one agent process, one remote command
        assert len(fleet8.commands(n)) == 1, (n, [c[:60] for c in fleet8.commands(n)])
    for n in ("r5", "r6", "r7"):
        assert run.host(n)["status"] == "skipped"
        assert snapshot(fleet8, [n])[n][:2] == PRISTINE
    assert "more than --max-failures 1" in run.output
    stopped = [line for line in run.output.splitlines() if line.startswith("stopped:")]
    assert stopped == [run.report["stopped"]]
    assert "in the end 2 failed (r2 rolled-back, r4 rolled-back)" in stopped[0], stopped
    assert "3 hosts not started (skipped, untouched)" in stopped[0], stopped
    last = run.output.splitlines()[-1]
    assert last.startswith("FAILED on 2 of 7 hosts: r2 (rolled-back), r4 (rolled-back) — 2 verified, 2 failed, "
                           "3 skipped"), last
    assert run.report["counts"] == {"verified": 2, "failed": 2, "skipped": 3}


def test_an_unreachable_host_is_reported_and_does_not_block_the_others(op8, fleet8):
    doc = op8.inventory()
    dead = dict(doc["hosts"]["r1"])
    dead["port"] = 1  # nothing listens there
    doc["hosts"]["gone"] = dead
    op8.write_inventory(doc)
    run = op8.run("rollout", "--patch", "spec-path-beacon", "--hosts", "r1,gone,r2", "--canary", "0")
    assert run.code == 1, run
    assert run.host("gone")["status"] == "unreachable"
    assert run.host("r1")["status"] == "verified"
    assert run.host("r2")["status"] == "verified"
    last = run.output.splitlines()[-1]
    assert last.startswith("FAILED on 1 of 3 hosts: gone (unreachable) — 2 verified, 1 unreachable"), last
    assert run.report["counts"] == {"verified": 2, "unreachable": 1}


def slow_starts(op8):
    """Every server takes 1.5 s to start: the run is still mid-restart when it is interrupted."""
    doc = op8.inventory()
    for n in NAMES:
        doc["hosts"][n]["server"]["restart"]["env"]["FLEETPATCH_STANDIN_STARTUP_DELAY"] = "1.5"
    op8.write_inventory(doc)


ROLLOUT_ALL = [sys.executable, "-m", "fleetpatch", "rollout", "--patch", "spec-path-beacon",
               "--group", "all", "--canary", "0", "--parallel", "2"]


@pytest.mark.parametrize("sig,said", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_starts_no_new_host_and_leaves_each_verified_rolled_back_or_untouched(op8, fleet8, sig, said):
    """A SIGTERM (a `kill`, a CI job's timeout) stops the run as a Ctrl-C does."""
    slow_starts(op8)
    before = snapshot(fleet8, NAMES)
    report = op8.workdir / "int.json"
    proc = subprocess.Popen(ROLLOUT_ALL + ["--report", str(report)],
                            cwd=op8.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if " restart" in line:
            break
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + out
    doc = json.loads(report.read_text())
    assert_stopped_safely(fleet8, doc, before, said)
    last = out.splitlines()[-1]
    assert last.startswith("INTERRUPTED: rollout on 8 hosts: "), last
    assert "skipped" in last and "failed" not in last, "hosts skipped after Ctrl-C are not failed"


def test_a_hangup_of_the_terminal_it_runs_in_stops_the_run_as_a_ctrl_c_does(op8, fleet8):
    """The operator's SSH session to the machine that runs fleetpatch drops mid-rollout: the kernel
    hangs up its terminal (SIGHUP). The run stops as at a Ctrl-C, with nobody left to read it: no
    new host, the hosts in flight finish or undo their step, the report says so, exit 130."""
    slow_starts(op8)
    before = snapshot(fleet8, NAMES)
    report = op8.workdir / "hup.json"
    code = hang_up_mid_rollout(op8, report, "SIG_DFL")
    assert code == 130, (code, report.read_text()[-3000:] if report.exists() else "no report")
    assert_stopped_safely(fleet8, json.loads(report.read_text()), before, "SIGHUP")


def test_under_nohup_a_hangup_stops_nothing_and_the_report_has_every_host(op8, fleet8):
    """SIGHUP ignored (`nohup`, a wrapper's `trap '' HUP`) and the output still on the terminal
    that hangs up: the run goes on to the end though nothing can be printed any more; the report
    has every host verified and the exit code is the run's."""
    report = op8.workdir / "nohup.json"
    code = hang_up_mid_rollout(op8, report, "SIG_IGN", hosts="r0,r1,r2,r3")
    assert code == 0, (code, report.read_text()[-3000:] if report.exists() else "no report")
    doc = json.loads(report.read_text())
    assert {n: h["status"] for n, h in doc["hosts"].items()} == dict.fromkeys(("r0", "r1", "r2", "r3"), "verified")
    assert "interrupted" not in doc


def hang_up_mid_rollout(op8, report, sighup: str, hosts: str | None = None) -> int:
    """A rollout on a terminal (a pty) of its own session, hung up once a host restarts: the
    rollout's exit code. `sighup`: its SIGHUP disposition as it starts (SIG_DFL, or SIG_IGN as
    under nohup), whatever the test runner's is (a runner under nohup passes SIG_IGN down)."""
    argv = ROLLOUT_ALL if hosts is None else [a for a in ROLLOUT_ALL if a not in ("--group", "all")] + ["--hosts", hosts]
    main, term = os.openpty()
    # a session of its own whose controlling terminal is the pty: closing `main` hangs it up
    set_disposition = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.%s); "
                       "os.execvp(sys.argv[1], sys.argv[1:])" % sighup)
    proc = subprocess.Popen([sys.executable, "-c", set_disposition, "setsid", "--wait", "--ctty"] + argv
                            + ["--report", str(report)], cwd=op8.workdir, stdin=term, stdout=term, stderr=term,
                            env=dict(os.environ, COLUMNS="100", LINES="40", TERM="xterm"))
    os.close(term)
    seen = b""
    deadline = time.monotonic() + 60
    while b"restart" not in seen and time.monotonic() < deadline:
        try:
            chunk = os.read(main, 65536)
        except OSError:   # EIO: the program ended (or never had the terminal)
            break
        if not chunk:
            break
        seen += chunk
    assert b"restart" in seen, seen[-2000:]
    os.close(main)
    return proc.wait(timeout=120)


def assert_stopped_safely(fleet8, doc, before, said):
    """What an interrupted rollout leaves: no host half-done or locked, each host verified, rolled
    back, skipped (untouched) or interrupted before its write (read, locked, left as it was)."""
    assert doc["interrupted"] is True
    assert doc["stopped"].startswith(f"stopped: interrupted ({said}): no new host was started"), doc["stopped"]
    statuses = {n: doc["hosts"][n]["status"] for n in NAMES}
    assert set(statuses.values()) <= {"verified", "rolled-back", "skipped", "interrupted"}, statuses
    assert "verified" in statuses.values() and "skipped" in statuses.values()
    assert all(f"not started (interrupted ({said})); untouched" in doc["hosts"][n]["message"]
               for n, st in statuses.items() if st == "skipped"), doc["hosts"]
    assert doc["ok"] is False
    assert doc["counts"]["skipped"] == sum(1 for st in statuses.values() if st == "skipped")
    after = snapshot(fleet8, NAMES)
    for n, st in statuses.items():
        if st in ("skipped", "interrupted"):
            assert after[n] == before[n], f"{n} was touched"
            assert fleet8.commands(n) == [] or st == "interrupted"
            assert not (fleet8.hosts[n].state_dir / "lock").exists()
        elif st == "verified":
            assert after[n][:2] != PRISTINE


def test_a_reader_that_goes_away_mid_rollout_leaves_every_host_done_and_reported(op8, fleet8):
    """`fleetpatch rollout … | head -3`: the pipe breaks while the hosts' threads still print
    their progress. Their steps go on as if nothing happened; the report has every host."""
    report = op8.workdir / "piped.json"
    reader = subprocess.Popen(["head", "-3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    four = [a for a in ROLLOUT_ALL if a not in ("--group", "all")] + ["--hosts", "r0,r1,r2,r3"]
    proc = subprocess.Popen(four + ["--report", str(report)], cwd=op8.workdir, stdout=reader.stdin,
                            stderr=subprocess.PIPE)
    reader.stdin.close()   # only the rollout holds the pipe's write end now
    shown = reader.stdout.read()
    reader.wait(timeout=60)
    _, err = proc.communicate(timeout=120)
    assert len(shown.splitlines()) == 3
    doc = json.loads(report.read_text())
    assert {n: doc["hosts"][n]["status"] for n in ("r0", "r1", "r2", "r3")} == dict.fromkeys(
        ("r0", "r1", "r2", "r3"), "verified"), doc["hosts"]
    assert b"Traceback" not in err, err.decode(errors="replace")
    assert proc.returncode == 0, err   # the run's own code: a summary nobody can read changes nothing
