"""Created and deleted files end to end: the installed program, the real sshd fleet,
the real SGLang 0.5.9 wheel files (tests/conftest.py). The fixture patch helper-module
creates sglang/srt/speculative/fleetpatch_helper.py (imported by both EAGLE workers),
deletes cpp_ngram/ngram_cache.py and changes both workers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.marks import needs_fleet
from support.paths import FIXTURE_PATCHES
from support.localhost import speculative_tree

HELPER = "sglang/srt/speculative/fleetpatch_helper.py"
NGRAM = "sglang/srt/speculative/cpp_ngram/ngram_cache.py"
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
PATCH = "helper-module"


def tree(site: Path) -> dict:
    return speculative_tree(site / "sglang/srt/speculative")


def strays(host_dir: Path) -> list:
    return sorted(str(p) for p in host_dir.rglob("*") if p.name.endswith(".tmp") and ".fleetpatch-" in p.name
                  or p.name == "writing.json")


def helper_bytecode(site: Path) -> list:
    return sorted(p.name for p in (site / HELPER).parent.joinpath("__pycache__").glob("fleetpatch_helper.*.pyc"))


@needs_fleet
def test_create_and_delete_deploy_verify_status_and_roll_back_to_pristine(operator, fleet):
    name = "v2a"
    h = fleet.hosts[name]
    site = h.site_packages
    ngram = site / NGRAM
    ngram.chmod(0o604)          # a mode and owner of its own: rollback must give both back
    os.chown(ngram, 4321, 5432)
    pristine = tree(site)
    patches = ("--patches", str(FIXTURE_PATCHES))

    # A write that fails mid-revision (after the create and the delete) leaves the host byte-identical.
    subprocess.run(["chattr", "+i", str(site / EAGLE_V2)], check=True)
    try:
        failed = operator.run("deploy-patch", "--patch", PATCH, *patches, "--hosts", name)
    finally:
        subprocess.run(["chattr", "-i", str(site / EAGLE_V2)], check=True)
    rep = failed.host(name)
    assert failed.code == 1 and rep["status"] == "error" and "put back" in rep["message"], failed
    assert tree(site) == pristine and not (site / HELPER).exists()
    assert not strays(h.host_dir) and not (h.state_dir / "lock").exists()

    check = operator.run("check-patch", "--patch", PATCH, *patches, "--hosts", name)
    assert check.code == 0 and check.host(name)["status"] == "applies", check
    for text in (f"will create {HELPER} (", f"will delete {NGRAM}"):
        assert text in check.host(name)["message"] and text in check.output, check
    assert tree(site) == pristine

    run = operator.run("deploy-patch", "--patch", PATCH, *patches, "--hosts", name, "--timeout", "60")
    rep = run.host(name)
    assert run.code == 0 and rep["status"] == "verified" and rep["executed_path"] == "EAGLEWorkerV2", run
    assert "fleetpatch fixture helper-module: EAGLEWorkerV2 via" in h.log_path.read_text()
    created = (site / HELPER).stat()
    sibling = (site / EAGLE_V2).stat()
    assert (created.st_mode & 0o7777, created.st_uid, created.st_gid) == \
        (sibling.st_mode & 0o7777, sibling.st_uid, sibling.st_gid), "a created file gets its siblings' mode and owner"
    assert not ngram.exists()

    status = operator.run("status", "--hosts", name)
    assert status.code == 0, status
    assert status.host(name)["applied"] == [f"{PATCH}@1"] and status.host(name)["drift"] == []

    subprocess.run([sys.executable, "-m", "py_compile", str(site / HELPER)], check=True)
    assert helper_bytecode(site), "the created module has bytecode for rollback to remove"
    rb = operator.run("rollback", "--hosts", name, *patches)
    assert rb.code == 0 and rb.host(name)["status"] == "rolled-back", rb
    assert tree(site) == pristine, "every file's sha256, mode and owner as before; the created file gone"
    assert helper_bytecode(site) == []
    assert not strays(h.host_dir) and not (h.state_dir / "lock").exists()
    status = operator.run("status", "--hosts", name)
    assert status.code == 0 and status.host(name)["applied"] == [], status
