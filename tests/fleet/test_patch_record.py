"""verify-logs and rollback from a laptop that does not have the patch's folder:
the host recorded at deploy what they need (manifest, markers, revision, the
diff's sha256), so both work from any working folder. A local copy that differs
from the record is named, and the host's record (what was deployed) decides.
End to end on the real sshd fleet, through the installed program."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from fleetpatch_demo import fleet as fleetmod

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD),
                                reason="needs root and /usr/sbin/sshd")

from support.paths import FIXTURE_PATCHES as FIXTURES  # noqa: E402
PATCH = "v2-only-beacon"   # a test fixture, not shipped with fleetpatch
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def deploy_from_a_patches_dir(operator, host: str) -> None:
    """Deploy from the operator's folder, with the patch in its patches/."""
    shutil.copytree(FIXTURES / PATCH, operator.workdir / "patches" / PATCH)
    run = operator.run("deploy-patch", "--patch", PATCH, "--hosts", host, "--timeout", "60")
    assert run.code == 0, run


def move_to_another_folder(operator, tmp_path: Path, name: str = "elsewhere") -> Path:
    """The same operator in another working folder: the inventory, and no patches/."""
    other = tmp_path / name
    other.mkdir()
    shutil.copy(operator.inventory_path, other / "hosts.yaml")
    operator.workdir = other
    return other


def test_the_ledger_entry_records_what_verify_and_rollback_need(operator, fleet):
    deploy_from_a_patches_dir(operator, "v2a")
    entry = json.loads((fleet.hosts["v2a"].state_dir / "ledger.json").read_text())["patches"][PATCH]
    record = entry["record"]
    assert record["manifest"]["name"] == PATCH
    assert record["manifest"]["markers"] == {"EAGLEWorkerV2": "fleetpatch fixture v2-only-beacon: EAGLEWorkerV2 ("}
    assert record["manifest"]["forbid"] == ["Traceback (most recent call last)"]
    assert record["manifest"]["allow_single_path"] == "reproduces the motivating failure"
    assert record["revision"]["rev"] == 1
    assert record["revision"]["diff_sha256"] == sha256(FIXTURES / PATCH / "sglang-0.5.9.r1.diff")
    assert record["revision"]["files"] == {EAGLE_V2: "modify"}
    assert record["added"][EAGLE_V2], record["added"]


def test_verify_logs_and_rollback_from_a_folder_without_the_patch(operator, fleet, tmp_path):
    site = fleet.hosts["v2a"].site_packages
    original = sha256(site / EAGLE_V2)
    deploy_from_a_patches_dir(operator, "v2a")
    assert sha256(site / EAGLE_V2) != original
    move_to_another_folder(operator, tmp_path)

    verified = operator.run("verify-logs", "--hosts", "v2a", "--timeout", "30")
    assert verified.code == 0, verified
    assert verified.host("v2a")["status"] == "verified"
    assert "cannot be loaded here" not in verified.output
    named = operator.run("verify-logs", "--hosts", "v2a", "--patch", PATCH, "--timeout", "30")
    assert named.code == 0 and named.host("v2a")["patch"] == f"{PATCH}@1", named

    rolled = operator.run("rollback", "--hosts", "v2a", "--patch", PATCH, "--timeout", "60")
    assert rolled.code == 0, rolled
    assert rolled.host("v2a")["status"] == "rolled-back"
    assert sha256(site / EAGLE_V2) == original, "the original bytes are back"
    ledger = json.loads((fleet.hosts["v2a"].state_dir / "ledger.json").read_text())
    assert PATCH not in ledger["patches"]


def test_a_patch_neither_here_nor_recorded_is_named(operator, fleet, tmp_path):
    deploy_from_a_patches_dir(operator, "v2a")
    move_to_another_folder(operator, tmp_path)
    run = operator.run("verify-logs", "--hosts", "v2a", "--patch", "no-such-patch", "--timeout", "10")
    assert run.code == 1, run
    msg = run.host("v2a")["message"]
    assert "no-such-patch is not recorded as applied" in msg and f"{PATCH}@1" in msg, msg


def edited_copy(folder: Path) -> Path:
    """The patch as a colleague edited it after the deploy: another marker, and a diff
    that logs that marker instead (same revision number)."""
    dest = folder / "patches" / PATCH
    shutil.copytree(FIXTURES / PATCH, dest)
    old, new = "fleetpatch fixture v2-only-beacon: EAGLEWorkerV2 (", "edited beacon that never ran ("
    for name in ("patch.yaml", "sglang-0.5.9.r1.diff"):
        (dest / name).write_text((dest / name).read_text().replace(old, new))
    return dest


def test_a_local_copy_that_differs_from_the_record_is_named_and_the_record_decides(operator, fleet, tmp_path):
    site = fleet.hosts["v2a"].site_packages
    original = sha256(site / EAGLE_V2)
    deploy_from_a_patches_dir(operator, "v2a")
    other = move_to_another_folder(operator, tmp_path)
    edited = edited_copy(other)

    run = operator.run("verify-logs", "--hosts", "v2a", "--timeout", "30")
    # judged by the record: the deployed marker was logged; the edited one never was
    assert run.code == 0, run
    notes = [line for line in run.output.splitlines() if "differs from what was deployed" in line]
    assert len(notes) == 1, run.output
    note = notes[0]
    assert note.startswith("v2a: note: the local ") and "markers.EAGLEWorkerV2" in note, note
    assert f"sglang-0.5.9.r1.diff sha256 {sha256(edited / 'sglang-0.5.9.r1.diff')[:12]} here" in note, note
    assert "host's record" in note and f"{PATCH}@1" in note, note
    assert run.host("v2a")["notes"] == [note.removeprefix("v2a: note: ")]   # the report: the note, under its host

    rolled = operator.run("rollback", "--hosts", "v2a", "--timeout", "60")
    assert rolled.code == 0, rolled
    assert sha256(site / EAGLE_V2) == original
    assert any("markers.EAGLEWorkerV2" in line and "host's record" in line for line in rolled.output.splitlines())


def test_an_identical_local_copy_says_nothing(operator, fleet, tmp_path):
    deploy_from_a_patches_dir(operator, "v2a")
    other = move_to_another_folder(operator, tmp_path)
    shutil.copytree(FIXTURES / PATCH, other / "patches" / PATCH)
    run = operator.run("verify-logs", "--hosts", "v2a", "--timeout", "30")
    assert run.code == 0, run
    assert "note:" not in run.output and "notes" not in run.host("v2a")
