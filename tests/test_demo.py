"""`fleetpatch demo` end to end, as a user runs it (a subprocess, no TTY), and
`fleetpatch demo --down` leaving nothing behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo import run as demo_run
from fleetpatch_demo.fleet import Fleet

REPO = Path(__file__).resolve().parents[1]

needs_fleet = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")


def fleetpatch(*args, cwd, timeout=300):
    env = {**os.environ, "COLUMNS": "200", demo_run.STARTUP_DELAY_ENV: "0.2"}
    env.pop("FLEETPATCH_INVENTORY", None)
    proc = subprocess.run([sys.executable, "-m", "fleetpatch", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def section(out: str, start: str, end: str | None) -> str:
    i = out.index(start)
    return out[i:out.index(end, i)] if end else out[i:]


def test_the_demo_patch_is_the_fixture():
    fixture = REPO / "tests" / "fixtures" / "patches" / "v2-only-beacon"
    shipped = demo_run.DEMO_PATCHES / "v2-only-beacon"
    assert (shipped / "sglang-0.5.9.r1.diff").read_bytes() == (fixture / "sglang-0.5.9.r1.diff").read_bytes()
    assert "allow_single_path" in (shipped / "patch.yaml").read_text()


def test_up_says_what_is_missing_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fleetmod, "SSHD", str(tmp_path / "no-sshd"))
    monkeypatch.setattr(demo_run.os, "geteuid", lambda: 1000)
    real_which = shutil.which
    monkeypatch.setattr(demo_run.shutil, "which", lambda t, *a, **k: None if t in ("sshd", "nsenter") else real_which(t))
    root = tmp_path / "demo"
    assert demo_run.up(root) == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns here
    assert "apt-get install -y openssh-server" in out
    assert "needs root" in out and "mount namespace" in out
    assert "nsenter is missing" in out
    assert not root.exists()


def test_down_without_a_fleet_is_a_no_op(tmp_path):
    code, out = fleetpatch("demo", "--down", "--root", str(tmp_path / "none"), cwd=tmp_path)
    assert code == 0, out
    assert "nothing to stop" in out


@needs_fleet
def test_demo_up_then_down(tmp_path):
    root = tmp_path / "demo"
    try:
        code, out = fleetpatch("demo", "--root", str(root), cwd=tmp_path)
        assert code == 0, out
        state = json.loads((root / "fleet.json").read_text())
        assert sorted(state["hosts"]) == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
        assert state["running"]

        # 2. rollout: canary first, then the rest, each verified on the path it runs
        rollout = section(out, "2. rollout", "3. check-patch")
        assert "OK: rollout succeeded on all 4 hosts" in rollout, out
        for host, path in [("gpu-a01", "EAGLEWorkerV2"), ("gpu-a02", "EAGLEWorkerV2"),
                           ("gpu-a03", "EAGLEWorker"), ("gpu-a04", "EAGLEWorker")]:
            assert any(host in line and "verified" in line and f" {path} " in line
                       for line in rollout.splitlines()), (host, rollout)
        assert rollout.index("gpu-a01      queued canary") < rollout.index("queued batch 1")
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        assert {h["status"] for h in doc["hosts"].values()} == {"verified"}

        # 3. check-patch: refused by the pre-flight check, nothing written
        check = section(out, "3. check-patch", "4. deploy-patch")
        for host in ("gpu-a03", "gpu-a04"):
            assert f"FAIL {host}  v2-only-beacon@1 would never execute (pre-flight)" in check, check
        assert "the server will run EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in check
        assert "cause: SGLANG_ENABLE_SPEC_V2 is not set" in check
        assert "nothing was written" in check
        assert "gpu-a01" not in check and "gpu-a02" not in check

        # 4. forced deploy: fails loudly, the server runs EAGLEWorker
        deploy = section(out, "4. deploy-patch --force", "demo summary")
        for host in ("gpu-a03", "gpu-a04"):
            assert f"FAIL {host}  v2-only-beacon@1 never executed" in deploy, deploy
        assert "the server runs EAGLEWorker (sglang/srt/speculative/eagle_worker.py)" in deploy
        assert 'evidence: log line' in deploy and "Overlap scheduler is disabled when spec v2 is off" in deploy
        assert "cause: SGLANG_ENABLE_SPEC_V2 is not set (and --speculative-eagle-topk 4 needs the v1 path)" in deploy
        assert "no marker for EAGLEWorker" in deploy or "marker for EAGLEWorker not seen" in deploy
        assert "FAILED on 2 of 2 hosts: gpu-a03 (not-executed), gpu-a04 (not-executed)" in deploy

        summary = section(out, "demo summary", None)
        assert "The demo behaved as expected" in summary
        assert "The demo fleet stays up" in summary
        export = f"  export FLEETPATCH_INVENTORY={root / 'hosts.yaml'}"
        assert export in summary.splitlines(), summary
        assert "fleetpatch demo --down --root" in summary

        # it keeps running after the command, and the printed line points everyday commands at it
        fleet = Fleet.attach(root)
        assert fleet.is_running()
        ports = [p for h in fleet.hosts.values() for p in (h.ssh_port, h.http_port)]
        assert set(ports) <= set(fleetmod._listening_ports())
        assert all(fleet._ns_members().values())
        env = {**os.environ, "FLEETPATCH_INVENTORY": str(root / "hosts.yaml"), "COLUMNS": "200"}
        proc = subprocess.run([sys.executable, "-m", "fleetpatch", "status"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr  # gpu-a03/a04 keep the forced patch, no drift
        assert "gpu-a04" in proc.stdout and "v2-only-beacon@1" in proc.stdout

        assert_down_removes_everything(tmp_path, root, fleet, state, ports)
    finally:
        if (root / "fleet.json").exists():
            Fleet.attach(root).stop()


def assert_down_removes_everything(cwd, root, fleet, state, ports):
    mount_point = fleet.mount_point
    code, out = fleetpatch("demo", "--down", "--root", str(root), cwd=cwd)
    assert code == 0, out
    assert "Stopped the demo fleet" in out
    assert not any(fleetmod._alive(h["sshd_pid"]) and fleetmod._ns_ino(h["sshd_pid"]) == h["ns_ino"]
                   for h in state["hosts"].values()), "no sshd of the fleet is left"
    assert not set(ports) & set(fleetmod._listening_ports()), "every port is closed"
    assert not root.exists(), f"{root} is left: {sorted(p.name for p in root.iterdir())}"
    if demo_run._mounted_in_some_namespace(mount_point):  # another fleet (e.g. the suite's) uses it
        assert f"Kept the mount point {mount_point}: another fleet" in out
    else:
        assert not os.path.exists(mount_point), out
        assert f"Removed the empty mount point {mount_point}" in out
    code, out = fleetpatch("demo", "--down", "--root", str(root), cwd=cwd)
    assert code == 0, out
    assert "nothing to stop" in out


@needs_fleet
def test_ctrl_c_in_the_demo_lets_the_step_finish_its_hosts_and_says_where_the_fleet_is(tmp_path):
    root = tmp_path / "demo"
    env = {**os.environ, "COLUMNS": "200", demo_run.STARTUP_DELAY_ENV: "1.5"}
    env.pop("FLEETPATCH_INVENTORY", None)
    proc = subprocess.Popen([sys.executable, "-m", "fleetpatch", "demo", "--root", str(root)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    seen = []
    try:
        in_rollout = False
        for line in proc.stdout:
            seen.append(line)
            in_rollout = in_rollout or "2. rollout" in line
            if in_rollout and line.rstrip().endswith(" restart"):
                break
        else:
            raise AssertionError("the rollout never restarted a host:\n" + "".join(seen))
        proc.send_signal(signal.SIGINT)  # as the terminal does: to the demo, not to its child
        rest, _ = proc.communicate(timeout=180)
        out = "".join(seen) + rest
        assert proc.returncode == 130, out
        assert "interrupted during step 'rollout'" in out
        assert "No host is left locked (checked)." in out
        assert f"  export FLEETPATCH_INVENTORY={root / 'hosts.yaml'}" in out.splitlines()
        assert "fleetpatch demo --down --root" in out and "takes it down" in out
        assert "3. check-patch" not in out, "no later step runs after Ctrl-C"
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        assert doc["interrupted"] is True
        fleet = Fleet.attach(root)
        statuses = {n: h["status"] for n, h in doc["hosts"].items()}
        for n, st in statuses.items():
            assert st in ("verified", "rolled-back", "skipped"), statuses
            assert f"  {n}: {st}" in out
            assert not (fleet.hosts[n].state_dir / "lock").exists(), f"{n} is left locked"
        assert "verified" in statuses.values(), statuses  # the canary was in flight and finished
        state = json.loads((root / "fleet.json").read_text())
        ports = [p for h in fleet.hosts.values() for p in (h.ssh_port, h.http_port)]
        assert_down_removes_everything(tmp_path, root, fleet, state, ports)
    finally:
        if proc.poll() is None:
            proc.kill()
        if (root / "fleet.json").exists():
            Fleet.attach(root).stop()
