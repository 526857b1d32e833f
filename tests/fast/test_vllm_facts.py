"""The shipped vLLM facts (src/fleetpatch/engines/vllm_releases/<release>.json): their shape,
facts quoted from the wheels, the docs table, and regeneration byte for byte from the wheel
members `invoke engine-facts --engine vllm` cached (~/.cache/fleetpatch/wheels/vllm-X.members;
`python3 tests/support/wheelcache.py` and tests/e2e/test_vllm_release_facts.py fetch them from PyPI)."""
from __future__ import annotations

import json

import pytest

from fleetpatch.engines import vllm_wheel
from fleetpatch.engines.vllm import POLICIES, PROFILE
from support.paths import REPO
from support.wheelcache import VLLM_RELEASES

SHIPPED = vllm_wheel.shipped_releases()
EXPECTED = ["0.10.0", "0.10.1", "0.10.1.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0",
            "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1",
            "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1",
            "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


def doc(version: str) -> dict:
    return json.loads((vllm_wheel.FACTS_DIR / f"{version}.json").read_text())


def test_every_final_release_from_0_10_0_to_0_34_0_is_shipped_reviewed_and_known():
    assert SHIPPED == EXPECTED
    assert all(PROFILE.knows(v) for v in EXPECTED) and not PROFILE.knows("0.35.0")
    assert not PROFILE.knows("0.34.1rc1") and PROFILE.knows("0.33.0+cu129")


@pytest.mark.parametrize("version", EXPECTED)
def test_a_facts_file_is_sorted_json_of_its_release(version):
    text = (vllm_wheel.FACTS_DIR / f"{version}.json").read_text()
    d = json.loads(text)
    assert vllm_wheel.to_text(d) == text, "not the sorted-key JSON engine-facts writes"
    assert d["release"] == version == d["extracted"]["version"]
    assert d["wheel"].startswith(f"vllm-{version}-") and d["wheel"].endswith(".whl")
    assert d["reviewed"]["status"] == "reviewed" and d["reviewed"]["policy"] in POLICIES
    x = d["extracted"]
    assert x["files"][:2] == ["vllm/_version.py", "vllm/envs.py"]
    assert all(f.startswith("vllm/") and f.endswith(".py") for f in x["files"])
    assert set(x["runners"].values()) <= set(x["files"])
    assert {b["file"] for b in x["drafter_branches"] + x["speculator_branches"]} <= set(x["files"])
    for s in x["siblings"]:
        assert s["v1"] and s["v2"] and set(s["v1"] + s["v2"]) <= set(x["files"])
    assert x["ready"]["line"] == "Application startup complete."
    assert x["banner"] and all(b["text"] in ("vLLM API server version %s", "vLLM server version %s, serving model %s")
                               for b in x["banner"])


def test_the_engine_and_runner_choice_as_the_wheels_state_it():
    policies = {v: doc(v)["reviewed"]["policy"] for v in EXPECTED}
    assert [v for v, p in policies.items() if p == "v0-v1"] == ["0.10.0", "0.10.1", "0.10.1.1", "0.10.2"]
    assert policies["0.11.0"] == "v1-only" and policies["0.12.0"] == "v2-opt-in" and policies["0.21.0"] == "v2-opt-in"
    assert policies["0.22.0"] == "v2-by-architecture" and policies["0.28.0"] == "v2-by-architecture"
    assert policies["0.29.0"] == "v2-default" and policies["0.33.0"] == "v2-default"
    assert policies["0.34.0"] == "v2-only"
    x10 = doc("0.10.2")["extracted"]
    assert x10["engines"] == {"v0": "vllm/engine/llm_engine.py", "v1": "vllm/v1/engine/core.py"}
    assert x10["env"]["VLLM_USE_V1"]["reads"] == "lambda: bool(int(os.getenv('VLLM_USE_V1', '1')))"
    assert any("Falling back to V0" in c["text"] and c["source"] == "vllm/engine/arg_utils.py" for c in x10["choice_lines"])
    assert x10["banner"][0]["text"] == "vLLM API server version %s"
    x33 = doc("0.33.0")["extracted"]
    assert {"source": "vllm/config/vllm.py", "line": 761, "used_by": "logger.warning_once",
            "text": "Model Runner V2 does not yet support %s; using the V1 model runner instead."} in x33["choice_lines"]
    assert {"source": "vllm/v1/worker/gpu_worker.py", "line": 513, "used_by": "logger.info_once",
            "text": "Using V2 Model Runner"} in x33["choice_lines"]
    assert x33["banner"][0]["text"] == "vLLM server version %s, serving model %s"
    x34 = doc("0.34.0")["extracted"]
    assert "v1" not in x34["runners"] and x34["siblings"] == [] and "vllm/v1/spec_decode/eagle.py" not in x34["files"]


def test_the_v1_drafter_and_v2_speculator_of_each_method_are_sibling_sets():
    eagle = {s["method"]: s for s in doc("0.33.0")["extracted"]["siblings"]}["eagle"]
    assert (eagle["v1"], eagle["v2"]) == (["vllm/v1/spec_decode/eagle.py"],
                                          ["vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"])
    assert ("vllm/v1/spec_decode/eagle.py", "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py") in PROFILE.siblings("0.20.2")
    assert PROFILE.siblings("0.11.0") == [] and PROFILE.siblings("0.34.0") == []
    # the model runners side by side: a fix to one runs on none of the servers that run the other
    assert PROFILE.siblings("0.10.2") == [("vllm/worker/model_runner.py", "vllm/v1/worker/gpu_model_runner.py")]
    assert ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py") in PROFILE.siblings("0.33.0")


def test_the_docs_table_of_vllm_releases_is_generated_from_the_facts():
    text = (REPO / "docs" / "engine-versions.md").read_text()
    begin, end = "<!-- generated: invoke supported-releases --engine vllm -->\n", "<!-- end generated vllm -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == vllm_wheel.supported_table(), (
        "docs/engine-versions.md is stale: replace its vLLM table with `invoke supported-releases --engine vllm`")


# one release per runner policy here (about 1 s each); every release in tests/e2e/test_vllm_release_facts.py
@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_regenerated_byte_for_byte_from_the_cached_wheel_members(version):
    members = vllm_wheel.cached(version)
    if members is None:
        pytest.skip(f"vllm {version}'s members are not cached: `python3 tests/support/wheelcache.py` fetches them")
    shipped = (vllm_wheel.FACTS_DIR / f"{version}.json").read_text()
    assert vllm_wheel.regenerate(version, members) == shipped
