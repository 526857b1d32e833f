"""The probe over the real sshd fleet: patches without markers proven by the lines
they ran, on each path; the motivating mistake caught with the contract's lines;
a spawned scheduler's lines counted; another install caught; the probe out once
the verdict is in, and the interpreter's site dir as before after a rollback.

The fleet's hosts run this machine's Python 3.11: functions mode."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from fleetpatch_demo import fleet as fleetmod

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD),
                                reason="needs root and /usr/sbin/sshd")

from support.paths import FIXTURE_PATCHES as FIXTURES  # noqa: E402
FIX = ("--patches", str(FIXTURES))
EAGLE = "sglang/srt/speculative/eagle_worker.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def added_line(fleet, name: str, rel: str, text: str) -> int:
    """The line number of `text` in the host's patched file."""
    lines = (fleet.hosts[name].site_packages / rel).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def probe_pths(fleet, name: str) -> list[str]:
    return sorted(p.name for p in fleet.hosts[name].site_packages.iterdir() if p.name.startswith("zzz-fleetpatch-probe-"))


def snapshot(folder: Path) -> dict:
    """Names, bytes and modes below `folder` (Python's own bytecode caches left out)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in dirs + files:
            p = Path(root) / n
            st = p.lstat()
            out[str(p.relative_to(folder))] = (stat.S_IMODE(st.st_mode), p.read_bytes() if p.is_file() else None)
    return out


def with_host_env(operator, name: str, **env) -> None:
    doc = operator.inventory()
    restart = doc["hosts"][name]["server"]["restart"]
    restart["env"] = {**restart.get("env", {}), **env}
    operator.write_inventory(doc)


def test_a_patch_without_markers_is_verified_on_each_path_by_the_lines_it_ran(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v1a,v2a", "--timeout", "60")
    assert run.code == 0, run
    for name, path, rel, other in (("v1a", "EAGLEWorker", EAGLE, EAGLE_V2), ("v2a", "EAGLEWorkerV2", EAGLE_V2, EAGLE)):
        host = run.host(name)
        assert host["status"] == "verified" and host["executed_path"] == path, run
        ex = host["execution"]
        assert ex["mode"] == "functions"
        line = added_line(fleet, name, rel, "self.fleetpatch_quiet")
        assert ex["ran"] == {rel: [line]}, "ran holds only the added line of the file on the path"
        assert ex["not_run"] == {other: "imported, but none of its added lines ran"} or \
            ex["not_run"] == {other: "never imported"}
        assert ex["imported"]["sglang.srt.speculative." + rel.rsplit("/", 1)[1][:-3]].endswith(rel)
        assert fleet.server_pid(name) in ex["pids"]
        assert probe_pths(fleet, name) == [], "the probe is out once the verdict is in"
    assert "executed (functions mode)" in run.host("v1a")["message"], run.host("v1a")["message"]
    # the records stay: verify-logs judges by them later, with the probe out
    again = operator.run("verify-logs", "--patch", "both-quiet", *FIX, "--hosts", "v1a")
    assert again.code == 0, again
    assert again.host("v1a")["execution"]["ran"] == {EAGLE: [added_line(fleet, "v1a", EAGLE, "self.fleetpatch_quiet")]}


def test_the_single_path_patch_on_the_other_path_fails_with_the_contracts_lines(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "v2-only-quiet", *FIX, "--hosts", "v1a", "--force",
                       "--timeout", "60")
    assert run.code != 0, run
    host = run.host("v1a")
    assert host["status"] == "not-executed", run
    msg = host["message"]
    assert "FAIL v1a  v2-only-quiet@1 never executed" in msg
    assert "no line this patch adds ran in the server (pid " in msg and " s of its restart" in msg
    assert f"    {EAGLE_V2}: never imported" in msg
    assert f"    {EAGLE}: imported, but the patch does not change it" in msg
    assert f"  the server runs EAGLEWorker ({EAGLE})" in msg
    assert "    cause: SGLANG_ENABLE_SPEC_V2 is not set" in msg
    # functions mode counts the sibling's namesake of the function the patch changes
    assert "  EAGLEWorker.__init__ (eagle_worker.py) ran once; this patch changes only eagle_worker_v2.py" in msg, msg
    assert host["execution"]["ran"] == {}
    assert probe_pths(fleet, "v1a") == []


def test_a_spawned_schedulers_lines_are_counted(operator, fleet):
    """The worker is built only in a scheduler process started with multiprocessing spawn."""
    with_host_env(operator, "v2a", FLEETPATCH_STANDIN_SPAWN_SCHEDULER="1")
    run = operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v2a", "--timeout", "60")
    assert run.code == 0, run.host("v2a")["message"]
    ex = run.host("v2a")["execution"]
    server = fleet.server_pid("v2a")
    assert ex["ran"] == {EAGLE_V2: [added_line(fleet, "v2a", EAGLE_V2, "self.fleetpatch_quiet")]}
    assert server in ex["pids"] and len(ex["pids"]) >= 2, ex
    children = [p for p in ex["pids"] if p != server]
    state = fleet.hosts["v2a"].host_dir / "state" / "probe" / "records"
    ran_in = {d.name.split("-")[0] for d in state.iterdir() if any(f.name.startswith("F-") for f in d.iterdir())}
    assert ran_in and ran_in <= {str(p) for p in children}, "the added line ran in the spawned scheduler only"


def test_a_server_running_another_install_is_caught(operator, fleet, tmp_path):
    """A copy of sglang earlier on sys.path (PYTHONPATH in the restart env): the patched file
    is not the one the server runs, and the verdict names both."""
    h = fleet.hosts["v1b"]
    import shutil
    shutil.copytree(h.site_packages / "sglang", h.host_dir / "other" / "sglang")
    with_host_env(operator, "v1b", PYTHONPATH=f"{fleet.mount_point}/other")
    run = operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v1b", "--timeout", "60")
    assert run.code != 0, run
    host = run.host("v1b")
    assert host["status"] == "not-executed"
    other = f"{fleet.mount_point}/other/{EAGLE}"
    patched = f"{fleet.mount_point}/sglang env/lib/python3.11/site-packages/{EAGLE}"
    assert f"loaded from another file ({other} instead of {patched})" in host["message"], host["message"]
    assert host["execution"]["not_run"][EAGLE].startswith("loaded from another file")


def test_rollback_leaves_the_site_dir_as_before_the_deploy(operator, fleet):
    site = fleet.hosts["v2b"].site_packages
    before = snapshot(site)
    assert operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v2b").code == 0
    run = operator.run("rollback", "--hosts", "v2b", *FIX)
    assert run.code == 0, run
    assert run.host("v2b")["status"] == "rolled-back"
    # the probe of the rollback's restart saw the restored modules loaded from the restored files
    assert "imported the restored modules from the restored files: sglang.srt.speculative." in \
        run.host("v2b")["message"], run.host("v2b")["message"]
    assert snapshot(site) == before
    assert probe_pths(fleet, "v2b") == []


def test_no_probe_without_markers_is_refused_naming_what_is_missing(operator, fleet):
    run = operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v1a", "--no-probe")
    assert run.code == 2, run
    assert "--no-probe judges by markers alone" in run.output
    assert "no marker for EAGLEWorker" in run.output and "both-quiet" in run.output
    assert fleet.commands("v1a") == [], "refused before any host is contacted"


def test_rollout_no_probe_refuses_a_patch_without_markers_and_judges_one_with_markers_by_them(operator, fleet):
    refused = operator.run("rollout", "--patch", "both-quiet", *FIX, "--hosts", "v1a,v2a", "--canary", "0",
                           "--no-probe")
    assert refused.code == 2 and "--no-probe judges by markers alone" in refused.output, refused
    assert fleet.commands("v1a") == [] and fleet.commands("v2a") == [], "refused before any host is contacted"
    run = operator.run("rollout", "--patch", "dynamic-spec-disable", "--hosts", "v1a,v2a", "--canary", "0",
                       "--no-probe", "--timeout", "60")
    assert run.code == 0, run
    for name in ("v1a", "v2a"):
        assert run.host(name)["status"] == "verified" and run.host(name)["markers"], run.host(name)
        assert "execution" not in run.host(name), "no probe: no execution block"
        assert probe_pths(fleet, name) == []


def test_engine_probe_false_turns_it_off(operator, fleet):
    doc = operator.inventory()
    doc["hosts"]["v1a"].setdefault("engine", {})["probe"] = False
    operator.write_inventory(doc)
    refused = operator.run("deploy-patch", "--patch", "both-quiet", *FIX, "--hosts", "v1a")
    assert refused.code == 2 and "engine.probe: false (host v1a)" in refused.output, refused
    run = operator.run("deploy-patch", "--patch", "dynamic-spec-disable", "--hosts", "v1a", "--timeout", "60")
    assert run.code == 0, run
    assert run.host("v1a")["status"] == "verified"
    assert "execution" not in run.host("v1a")
    assert not (fleet.hosts["v1a"].host_dir / "state" / "probe").exists()
    doc["hosts"]["v1a"]["engine"]["probe"] = "no"
    operator.write_inventory(doc)
    bad = operator.run("status", "--hosts", "v1a")
    assert bad.code == 2 and "engine.probe" in bad.output and "expected true or false" in bad.output, bad


def test_a_killed_laptop_leaves_no_probe_and_the_next_run_removes_a_stale_one(operator, fleet):
    """Ctrl-C / a killed laptop: the agent finishes its step, and takes its probe out when its
    channel ends. A probe left by an agent killed outright goes at the next run's lock."""
    import signal
    import subprocess
    import sys
    import time
    with_host_env(operator, "v1b", FLEETPATCH_STANDIN_NEVER_READY="1")
    laptop = subprocess.Popen([sys.executable, "-m", "fleetpatch", "deploy-patch", "--patch", "both-quiet", *FIX,
                               "--hosts", "v1b", "--timeout", "120"], cwd=operator.workdir,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):   # until the probe is in and the server restarted under it
            if probe_pths(fleet, "v1b") and (fleet.hosts["v1b"].host_dir / "state" / "probe" / "records").is_dir():
                break
            time.sleep(0.1)
        assert probe_pths(fleet, "v1b"), "the probe went in before the restart"
    finally:
        laptop.send_signal(signal.SIGKILL)
        laptop.wait()
    for _ in range(600):
        if not probe_pths(fleet, "v1b"):
            break
        time.sleep(0.1)
    assert probe_pths(fleet, "v1b") == [], "the agent took its probe out when the channel ended"
    # an agent killed outright leaves its .pth: the next run's lock takes it out
    site = fleet.hosts["v1b"].site_packages
    (site / "zzz-fleetpatch-probe-deadrun.pth").write_text("import sys\n")
    doc = operator.inventory()
    doc["hosts"]["v1b"]["server"]["restart"]["env"].pop("FLEETPATCH_STANDIN_NEVER_READY")
    operator.write_inventory(doc)
    run = operator.run("rollback", "--hosts", "v1b", *FIX, "--break-lock")
    assert probe_pths(fleet, "v1b") == [], run
