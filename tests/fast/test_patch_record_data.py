"""The record a deploy leaves on the host (fleetpatch.patchrecord), without a host:
a patch survives the trip through the record (what verify-logs and rollback
judge by), and every difference of a local copy is named by file and key."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from fleetpatch import engines, patchrecord
from fleetpatch.patchset import load_patch

from support.paths import FIXTURE_PATCHES as FIXTURES  # noqa: E402
PATCH = "v2-only-beacon"


def load(folder: Path):
    return load_patch(PATCH, [folder], engines.get("sglang"))[0]


def record_of(patch):
    # as it comes back from the host: through JSON
    return json.loads(json.dumps(patchrecord.record_of(patch, patch.revisions[0], {"a.py": [3, 4]})))


def test_the_patch_rebuilt_from_its_record_judges_alike():
    patch = load(FIXTURES)
    rebuilt = patchrecord.patch_of(record_of(patch))
    for field in ("name", "engine", "markers", "expect", "forbid", "smoke_expect", "executed", "allow_single_path"):
        assert getattr(rebuilt, field) == getattr(patch, field), field
    rev, mine = rebuilt.revisions[0], patch.revisions[0]
    assert (rev.rev, rev.diff_sha256, rev.paths, rev.spec_text) == (mine.rev, mine.diff_sha256, mine.paths,
                                                                      mine.spec_text)
    assert rev.admits("0.5.9") and not rev.admits("0.5.8")
    assert patchrecord.differences(patch, record_of(patch)) == []


def test_every_difference_of_a_local_copy_is_named(tmp_path):
    record = record_of(load(FIXTURES))
    shutil.copytree(FIXTURES / PATCH, tmp_path / PATCH)
    manifest = tmp_path / PATCH / "patch.yaml"
    manifest.write_text(manifest.read_text().replace('forbid: ["Traceback (most recent call last)"]',
                                                     'forbid: ["Traceback", "CUDA error"]'))
    diff = tmp_path / PATCH / "sglang-0.5.9.r1.diff"
    diff.write_text(diff.read_text().replace("fixture v2-only-beacon", "fixture v2-only-beacon (edited)"))
    found = patchrecord.differences(load(tmp_path), record)
    assert found[0] == "patch.yaml forbid"
    assert found[1].startswith("sglang-0.5.9.r1.diff sha256 ") and found[1].endswith(
        f"here, {record['revision']['diff_sha256'][:12]} deployed")
    assert len(found) == 2
