"""Every vLLM release the profile knows, regenerated from its real wheel, byte for byte.

`invoke engine-facts --engine vllm --version X` writes the facts from a few MB of
the wheel's members, fetched by HTTP range from PyPI's file host (the central
directory, then only the wanted files) and cached in ~/.cache/fleetpatch/wheels
(or $FLEETPATCH_CACHE/wheels). This test fetches each release's members once
per machine (about 2-3 MB and 2-4 s each) and regenerates the file from them.
"""
from __future__ import annotations

import pytest

from fleetpatch.engines import vllm_members, vllm_wheel

SHIPPED = vllm_wheel.shipped_releases()


def members(version: str) -> vllm_members.Members:
    try:
        return vllm_wheel.members(version)
    except RuntimeError as e:   # offline and not cached: skipped, never faked
        pytest.skip(str(e))


@pytest.mark.pypi
@pytest.mark.parametrize("version", SHIPPED)
def test_shipped_vllm_facts_are_regenerated_byte_for_byte_from_the_wheel(version):
    m = members(version)
    assert m.wheel.startswith(f"vllm-{version}-")
    assert vllm_wheel.regenerate(version, m) == (vllm_wheel.FACTS_DIR / f"{version}.json").read_text()


@pytest.mark.pypi
def test_the_range_reader_fetches_the_members_and_not_the_wheel(tmp_path):
    """A fresh fetch of one release: a few MB in a handful of requests, of a 400 MB wheel."""
    try:
        info = vllm_members.wheel_file("0.10.2")
        got, rf = vllm_members.fetch_members(info["url"], info["size"], vllm_wheel.wanted,
                                             tmp_path / "vllm-0.10.2.members", info["filename"])
    except OSError as e:
        pytest.skip(f"PyPI not reachable: {e}")
    assert info["size"] > 300_000_000 and rf.bytes_fetched < 5_000_000 and rf.requests < 20
    assert "vllm/v1/spec_decode/eagle.py" in got.names and got.has("vllm/v1/spec_decode/eagle.py")
    assert "class EagleProposer" in got.text("vllm/v1/spec_decode/eagle.py")
    assert not got.has("vllm/model_executor/models/llama.py")    # in the wheel, not wanted, not fetched
    assert "vllm/model_executor/models/llama.py" in got.names
    assert vllm_wheel.regenerate("0.10.2", got) == (vllm_wheel.FACTS_DIR / "0.10.2.json").read_text()
