"""`fleetpatch demo --engine vllm` end to end, as a user runs it (a subprocess, no TTY), then
`fleetpatch demo --down`: four vLLM 0.33.0 hosts, two on Model Runner V2 (0.33's default:
EagleSpeculator) and two on Model Runner V1 (VLLM_USE_V2_MODEL_RUNNER=0: EagleProposer); the
shipped eagle-drafter-line (both EAGLE paths) verified on each host on the path it runs; the
one-path vllm-v1-only-beacon (only v1/spec_decode/eagle.py) refused by check-patch's pre-flight
on the V2 hosts, and, forced, not-executed with the speculator file that ran named."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from fleetpatch_demo import run_vllm, vllm_hosts
from fleetpatch_demo.fleet import Fleet
from support.demo_cli import fleetpatch, section
from support.marks import needs_fleet


def test_an_unknown_engine_is_a_usage_error(tmp_path):
    code, out = fleetpatch("demo", "--engine", "trtllm", "--root", str(tmp_path / "demo"), cwd=tmp_path)
    assert code == 2, out
    assert "--engine must be one of sglang, vllm, not 'trtllm'" in " ".join(out.split())
    assert not (tmp_path / "demo").exists()


def test_the_demo_patches_apply_to_the_release_files(tmp_path):
    """Both demo diffs apply with `patch` to vLLM 0.33.0's real files, the one-path one on top of
    the shipped one too (the demo deploys it on hosts that carry eagle-drafter-line)."""
    tree = tmp_path / "site"
    import shutil
    shutil.copytree(vllm_hosts.vllm_tree(run_vllm.VLLM_VERSION), tree)
    shipped = run_vllm.DEMO_PATCHES / run_vllm.SHIPPED_PATCH / "vllm-0.33.0.r1.diff"
    one_path = run_vllm.DEMO_PATCHES / run_vllm.ONE_PATH_PATCH / "vllm-0.33.0.r1.diff"
    for diff in (shipped, one_path):
        proc = subprocess.run(["patch", "-p1", "--forward", "-i", str(diff)], cwd=tree, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "eagle-drafter-line: EagleProposer" in (tree / run_vllm.DRAFTER_FILE).read_text()
    assert "fleetpatch demo v1-only-beacon: EagleProposer" in (tree / run_vllm.DRAFTER_FILE).read_text()
    assert "eagle-drafter-line: EagleSpeculator" in (tree / run_vllm.SPECULATOR_FILE).read_text()
    one = one_path.read_text()
    assert run_vllm.SPECULATOR_FILE not in one and run_vllm.DRAFTER_FILE in one


@needs_fleet
@pytest.mark.skipif(not vllm_hosts.standin_available(), reason="the vLLM stand-in is not there yet")
def test_vllm_demo_up_then_down(tmp_path):
    xdg = {"XDG_STATE_HOME": str(tmp_path / "state")}
    root = tmp_path / "state" / "fleetpatch" / "demo"
    here = tmp_path / "here"
    here.mkdir()
    try:
        code, out = fleetpatch("demo", "--engine", "vllm", cwd=here, **xdg)
        assert code == 0, out
        assert not any(here.iterdir()), "the demo writes nothing in the folder it was started from"
        state = json.loads((root / "fleet.json").read_text())
        assert sorted(state["hosts"]) == ["gpu-b01", "gpu-b02", "gpu-b03", "gpu-b04"]
        inv = yaml.safe_load((root / "hosts.yaml").read_text())
        assert {h["engine"]["kind"] for h in inv["hosts"].values()} == {"vllm"}
        assert inv["hosts"]["gpu-b02"]["server"]["restart"]["kind"] == "supervisor"

        # 2. rollout: each host verified on the path it runs
        rollout = section(out, "2. rollout", "3. check-patch")
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        paths = {n: h["executed_path"] for n, h in doc["hosts"].items()}
        assert paths == {"gpu-b01": "EagleSpeculator", "gpu-b02": "EagleSpeculator",
                         "gpu-b03": "EagleProposer", "gpu-b04": "EagleProposer"}, rollout
        assert {h["status"] for h in doc["hosts"].values()} == {"verified"}
        assert doc["stages"][0] == ["gpu-b01"]
        assert all(h["patch"] == "eagle-drafter-line@1" for h in doc["hosts"].values())

        # 3. check-patch: refused by the pre-flight on the V2 hosts, nothing written
        check = section(out, "3. check-patch", "4. deploy-patch")
        doc = json.loads((root / "reports" / "3-check-patch.json").read_text())
        assert {n: h["status"] for n, h in doc["hosts"].items()} == \
            {"gpu-b01": "not-executed", "gpu-b02": "not-executed"}, check
        assert "vllm-v1-only-beacon@1 would never execute (pre-flight)" in check, check

        # 4. forced: not-executed, the speculator that ran named
        deploy = section(out, "4. deploy-patch --force", "demo summary")
        doc = json.loads((root / "reports" / "4-deploy-patch.json").read_text())
        for n in ("gpu-b01", "gpu-b02"):
            h = doc["hosts"][n]
            assert h["status"] == "not-executed" and h["executed_path"] == "EagleSpeculator", h
            assert run_vllm.SPECULATOR_FILE in json.dumps(h), h
        assert "vllm-v1-only-beacon@1 never executed" in deploy, deploy
        assert f"EagleSpeculator ({run_vllm.SPECULATOR_FILE})" in deploy, deploy

        summary = section(out, "demo summary", None)
        assert "The demo behaved as expected" in summary
        # the V2 hosts carry both patches' bytes, the V1 hosts only the shipped one
        fleet = Fleet.attach(root)
        for n in ("gpu-b01", "gpu-b02"):
            assert "v1-only-beacon" in (fleet.hosts[n].site_packages / run_vllm.DRAFTER_FILE).read_text()
        for n in ("gpu-b03", "gpu-b04"):
            text = (fleet.hosts[n].site_packages / run_vllm.DRAFTER_FILE).read_text()
            assert "eagle-drafter-line" in text and "v1-only-beacon" not in text
    finally:
        code, out = fleetpatch("demo", "--down", cwd=tmp_path, **xdg)
        assert code == 0, out
    assert "Stopped the demo fleet" in out
    assert not root.exists()


@needs_fleet
@pytest.mark.skipif(not vllm_hosts.standin_available(), reason="the vLLM stand-in is not there yet")
def test_vllm_demo_in_containers(tmp_path, docker_daemon):
    """--containers: every engine a container of the vLLM image; the same four steps behave."""
    root = tmp_path / "demo"
    env = {"FLEETPATCH_TEST_DOCKER_SOCK": docker_daemon.sock}
    try:
        code, out = fleetpatch("demo", "--engine", "vllm", "--containers", "--root", str(root), cwd=tmp_path, **env)
        assert code == 0, out
        inv = yaml.safe_load((root / "hosts.yaml").read_text())
        assert all(h["engine"]["kind"] == "vllm" and h["engine"]["container"].startswith("vllm-gpu-b0")
                   and h["server"]["log"] == "container" for h in inv["hosts"].values()), inv
        doc = json.loads((root / "reports" / "2-rollout.json").read_text())
        assert {n: (h["status"], h["executed_path"]) for n, h in doc["hosts"].items()} == {
            "gpu-b01": ("verified", "EagleSpeculator"), "gpu-b02": ("verified", "EagleSpeculator"),
            "gpu-b03": ("verified", "EagleProposer"), "gpu-b04": ("verified", "EagleProposer")}
        doc = json.loads((root / "reports" / "4-deploy-patch.json").read_text())
        assert {n: h["status"] for n, h in doc["hosts"].items()} == \
            {"gpu-b01": "not-executed", "gpu-b02": "not-executed"}
    finally:
        code, out = fleetpatch("demo", "--down", "--root", str(root), cwd=tmp_path, **env)
        assert code == 0, out
    assert not root.exists()
