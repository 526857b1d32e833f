"""Every SGLang release the profile knows, regenerated from its real wheel, byte for byte.

The facts files (src/fleetpatch/engines/sglang_releases/<release>.json) are what
`invoke engine-facts --version <release>` writes.  This test downloads each
release's wheel once per machine (pip download --no-deps; cached in
~/.cache/fleetpatch/wheels, or $FLEETPATCH_CACHE/wheels) and regenerates the
file from it.  It needs PyPI the first time: `-m "not pypi"` skips it offline.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetpatch.engines import sglang_facts, sglang_wheel
from fleetpatch.engines.sglang import PROFILE

from support.paths import REPO  # noqa: E402
SHIPPED = sglang_wheel.shipped_releases()


def wheel(version: str) -> Path:
    try:
        return sglang_wheel.download(version)
    except RuntimeError as e:   # offline and not cached: skipped, never faked
        pytest.skip(str(e))


@pytest.mark.pypi
@pytest.mark.parametrize("version", SHIPPED)
def test_shipped_facts_are_regenerated_byte_for_byte_from_the_wheel(version):
    shipped = (sglang_wheel.FACTS_DIR / f"{version}.json").read_text()
    assert sglang_wheel.regenerate(version, wheel(version)) == shipped


def test_every_release_from_0_5_7_to_0_5_23_is_known_and_reviewed():
    expected = ["0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12",
                "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16",
                "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    assert SHIPPED == expected
    assert [r.name for r in sglang_facts.RELEASES] == expected
    assert all(PROFILE.knows(v) for v in expected)


def test_facts_of_today_s_releases():
    r16, r20, r22 = (PROFILE.range_for(v) for v in ("0.5.16", "0.5.20", "0.5.22"))
    assert r16.siblings == () and PROFILE.siblings("0.5.16") == []       # no eagle_worker.py any more
    assert dict(r16.paths)["DSparkWorkerV2"] == "sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
    assert "UnoWorkerV2" not in dict(r16.paths) and dict(r20.paths)["UnoWorkerV2"].endswith("uno_worker_v2.py")
    assert PROFILE.range_for("0.5.18").dump_shape == "ServerArgs(...)" and PROFILE.range_for("0.5.19").dump_shape == "{...}"
    assert any(s.endswith(".so") for s in r22.ready_sources) and not any(
        s.endswith(".so") for s in PROFILE.range_for("0.5.21").ready_sources)
    assert r22.requires_python == ">=3.11"


def test_the_table_of_supported_releases_is_generated_from_the_facts():
    out = subprocess.run([sys.executable, "-m", "invoke", "supported-releases"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("| release |") and len(lines) == 2 + len(SHIPPED)
    assert lines[-1].startswith("| 0.5.23 | DFlashWorkerV2, DSparkWorkerV2, EAGLEWorkerV2, ")
    assert "`server_args={...}`, redacted" in lines[-1] and "Rust server" in lines[-1]


def test_a_new_release_starts_from_the_previous_reviewed_facts_pending_review(tmp_path):
    for v in ("0.5.22", "0.5.23"):
        (tmp_path / f"{v}.json").write_text((sglang_wheel.FACTS_DIR / f"{v}.json").read_text())
    reviewed = sglang_wheel.reviewed_for("0.5.24", tmp_path)
    assert reviewed["status"] == "pending review (copied from 0.5.23)"
    old = json.loads((tmp_path / "0.5.22.json").read_text())
    new = json.loads((tmp_path / "0.5.23.json").read_text())
    diff = sglang_wheel.differences(old, new)
    assert any(d.startswith("+ extracted.dispatch.branches.platform_worker_cls") for d in diff), diff
    assert diff[-1].endswith("line numbers moved)")


@pytest.mark.pypi
@pytest.mark.parametrize("version", SHIPPED)
def test_a_rank_above_0_logs_the_node_ready_line_in_every_release(version):
    """A multi-node server's ranks above 0 are judged up by launch_dummy_health_check_server's line."""
    import zipfile
    with zipfile.ZipFile(wheel(version)) as z:
        common = z.read("sglang/srt/utils/common.py").decode()
        engine = z.read("sglang/srt/entrypoints/engine.py").decode()
    body = common[common.index("def launch_dummy_health_check_server"):]
    assert f'f"{PROFILE.node_ready_line}' in body.split("\ndef ", 1)[0]
    assert "launch_dummy_health_check_server(" in engine.split("node_rank >= 1", 1)[1][:4000]
