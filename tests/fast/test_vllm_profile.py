"""The vLLM profile behind the engine seam: found by engine.kind, the path a `vllm serve`
launch selects on each runner policy (from the facts generated from the wheels), what the
log says, the sibling rule on a vLLM patch, and a patch for one engine refused on a host of
the other with nothing changed there (the local transport, the real SGLang files)."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

import yaml

from fleetpatch import engines, steps
from fleetpatch.engines import vllm_wheel
from fleetpatch.engines.base import LaunchConfig
from fleetpatch.engines.vllm import PROFILE, READY_LINE, SMOKE_REQUEST
from fleetpatch.inventory import parse_inventory
from fleetpatch.patchset import PatchError, load_patch
from fleetpatch.transport_local import LocalTransport
from support.localhost import EAGLE, EAGLE_V2, job, sha256

EAGLE_V1 = "vllm/v1/spec_decode/eagle.py"
EAGLE_SPEC = "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"
SPEC = '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'


def serve(*flags, spec=SPEC):
    argv = ["/opt/venv/bin/vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    return argv + (["--speculative-config", spec] if spec else []) + list(flags)


def predict(version, env=None, *flags, spec=SPEC):
    return PROFILE.predict(version, LaunchConfig(serve(*flags, spec=spec), dict(env or {}), "process"))


def test_engine_kind_vllm_selects_the_vllm_profile():
    assert engines.get("vllm") is PROFILE and "vllm" in engines.kinds()
    inv = parse_inventory(textwrap.dedent("""\
        hosts:
          gpu-v01:
            address: 10.0.0.7
            engine: {kind: vllm, python: /opt/venv/bin/python}
            server: {log: /var/log/vllm.log, restart: {kind: systemd, unit: vllm}}
        """))
    assert engines.get(inv.hosts["gpu-v01"].engine.kind) is PROFILE
    assert (PROFILE.package, READY_LINE, SMOKE_REQUEST) == ("vllm", "Application startup complete.",
                                                           ("POST", "/v1/completions"))
    assert PROFILE.version_file == "vllm/_version.py"
    model = PROFILE.process_model("0.33.0")   # the defaults read from envs.py in the wheel
    assert (model["VLLM_WORKER_MULTIPROC_METHOD"], model["VLLM_ENABLE_V1_MULTIPROCESSING"]) == ("fork", "1")
    assert PROFILE.process_model("0.35.0") == {}


@pytest.mark.parametrize("version, env, path, words", [
    ("0.10.2", {}, "EagleProposer", "the V1 engine"),
    ("0.11.0", {}, "EagleProposer", "the only one in this release"),
    ("0.20.2", {}, "EagleProposer", "V2 is opt-in"),
    ("0.20.2", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "EagleSpeculator", "VLLM_USE_V2_MODEL_RUNNER=1 selects the V2"),
    ("0.33.0", {}, "EagleSpeculator", "the V2 model runner by default"),
    ("0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "EagleProposer", "VLLM_USE_V2_MODEL_RUNNER=0 selects the V1"),
    ("0.34.0", {}, "EagleSpeculator", "the only one in this release"),
])
def test_the_drafter_a_launch_selects(version, env, path, words):
    p = predict(version, env)
    assert (p.path, p.starts, p.known_version) == (path, True, True), p.cause
    assert p.file == PROFILE.file_of_path(path, version) and words in p.cause
    assert p.file in PROFILE.fetch_files(version)


def test_what_the_launch_cannot_show_is_left_to_the_probe():
    p = predict("0.27.0")
    assert p.path is None and p.starts and p.known_version
    assert "depends on the model's architecture" in p.cause and "the probe decides" in p.cause
    assert "vllm/config/vllm.py:" in p.cause
    assert predict("0.27.0", {"VLLM_USE_V2_MODEL_RUNNER": "1"}).path == "EagleSpeculator"
    dflash = predict("0.33.0", spec='{"method": "dflash", "model": "d"}')
    assert dflash.path is None and "by the draft model's architecture; the probe decides" in dflash.cause


def test_launches_that_do_not_start_or_run_no_drafter():
    v0 = predict("0.10.2", {"VLLM_USE_V1": "0"})
    assert v0.path is None and "V0 engine" in v0.cause and "no V0 speculative decoding" in v0.cause
    gone = predict("0.34.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert not gone.starts and gone.error == ("VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner "
                                              "V1 has been removed. Unset this variable.")
    bad = predict("0.33.0", spec="{method: eagle}")
    assert not bad.starts and bad.error.startswith("--speculative-config is not JSON")
    none = predict("0.33.0", spec=None)
    assert none.path is None and none.starts and none.cause.startswith("no --speculative-config")
    eager = predict("0.33.0", {}, "--enforce-eager")
    assert any("--enforce-eager" in n for n in eager.notes) and "--enforce-eager" in eager.inputs


def test_a_release_the_profile_does_not_know_is_never_guessed():
    for version in ("0.35.0", "0.9.2", "0.34.1rc1", "nonsense"):
        p = predict(version)
        assert (p.path, p.file, p.known_version) == (None, None, False) and "nothing is predicted" in p.cause
        assert PROFILE.siblings(version) == []
        assert set(PROFILE.fetch_files(version)) >= set(PROFILE.fetch_files("0.10.0")) | set(PROFILE.fetch_files("0.34.0"))


def test_the_log_lines_that_show_the_runner():
    lines = ["(EngineCore pid=71) INFO 12-06 02:33:52 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with config: x",
             "(EngineCore pid=71) WARNING 12-06 02:33:53 [vllm.py:761] Model Runner V2 does not yet support "
             "LoRA; using the V1 model runner instead."]
    facts = PROFILE.log_facts("0.33.0", lines, first_line_no=10)
    assert facts.values == {"engine": "v1", "runner": "v1"} and facts.evidence["runner"].line_no == 11
    assert facts.evidence["runner"].text.startswith("Model Runner V2 does not yet support")
    assert PROFILE.resolve("0.33.0", {**facts.values, "method": "eagle"}).path == "EagleProposer"
    v2 = PROFILE.log_facts("0.20.2", ["INFO 12-06 02:33:52 [gpu_worker.py:272] Using V2 Model Runner"])
    assert v2.values == {"runner": "v2"}
    assert PROFILE.resolve("0.20.2", {"runner": "v2", "method": "eagle"}).path == "EagleSpeculator"
    assert not PROFILE.resolve("0.33.0", {"method": "eagle"}).determined
    assert PROFILE.find_failures("0.33.0", ["(APIServer pid=1) ERROR 12-06 02:33:52 [core.py:1] "
                                            "EngineCore failed to start."])


# ----------------------------------------------------------------- patches
DIFF = """\
--- a/{path}
+++ b/{path}
@@ -1,2 +1,3 @@
 # SPDX-License-Identifier: Apache-2.0
+# fixed
 # SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""


def vllm_patch(root: Path, paths=(EAGLE_V1, EAGLE_SPEC)) -> Path:
    folder = root / "vllm-fix"
    folder.mkdir(parents=True)
    (folder / "r1.diff").write_text("".join(DIFF.format(path=p) for p in paths))
    (folder / "patch.yaml").write_text('name: vllm-fix\nengine: vllm\n'
                                       'revisions:\n  - {rev: 1, diff: r1.diff, engine_versions: "==0.20.2"}\n')
    return root


def test_a_vllm_patch_that_changes_one_runner_s_drafter_only_is_refused(tmp_path):
    with pytest.raises(PatchError) as e:
        load_patch("vllm-fix", [vllm_patch(tmp_path, paths=(EAGLE_V1,))], PROFILE)
    assert f"changes {EAGLE_V1} but not its sibling {EAGLE_SPEC}" in str(e.value)
    patch, _ = load_patch("vllm-fix", [vllm_patch(tmp_path / "both")], PROFILE)
    assert patch.engine == "vllm"


def test_a_vllm_patch_on_an_sglang_host_is_refused_there_and_nothing_changes(lh, tmp_path):
    patch, rev = load_patch("vllm-fix", [vllm_patch(tmp_path / "p")], PROFILE)
    host = lh.host()
    before = {rel: sha256(lh.file(rel)) for rel in (EAGLE, EAGLE_V2)}
    for run in (steps.check_patch, steps.deploy):
        j = steps.Job(hosts_by_name={host.name: host}, patch=patch, rev=rev, patch_dirs=[tmp_path / "p"],
                      transport=lambda h: LocalTransport(h.name), timeout=20, settle_s=0.3)
        r = run(j, host)
        assert r.status == "conflict", r.message
        assert ("vllm-fix is a patch for vLLM, but this host runs SGLang (engine.kind in the inventory); "
                "nothing was changed on this host") in r.message
    assert {rel: sha256(lh.file(rel)) for rel in (EAGLE, EAGLE_V2)} == before and lh.is_pristine()
    assert not lh.lock.exists() and not (lh.state / "ledger.json").exists()


def vllm_host(lh, version="0.33.0"):
    """The lh host tree with vLLM's files laid out beside SGLang's from the cached wheel members
    (the dist-info's METADATA among them), as an `engine.kind: vllm` host."""
    members = vllm_wheel.cached(version)
    meta = f"vllm-{version}.dist-info/METADATA"
    if members is None or not members.has(meta):
        pytest.skip(f"vllm {version}'s wheel members are not cached: `python3 tests/support/wheelcache.py` "
                    "fetches them")
    shutil.copytree(members.root / "files", lh.site, dirs_exist_ok=True)
    inv = lh.inventory()
    inv["hosts"][lh.name]["engine"]["kind"] = "vllm"
    return parse_inventory(yaml.safe_dump(inv), file=str(lh.root / "hosts.yaml")).hosts[lh.name]


def test_fetch_on_a_vllm_host_copies_its_release_s_files(lh, tmp_path):
    host = vllm_host(lh)
    j, _ = job(lh, None, host=host, dest=tmp_path / "src")
    r = steps.fetch(j, host)
    assert r.status == "fetched", r.message
    meta = json.loads((tmp_path / "src" / host.name / "fetch.json").read_text())
    assert (meta["engine"], meta["version"]) == ("vllm", "0.33.0")
    assert meta["package_dir"] == str(lh.site)   # the folder that holds the vllm package
    assert sorted(meta["files"]) == sorted(PROFILE.fetch_files("0.33.0"))
    assert meta["files"][EAGLE_V1] == sha256(lh.site / EAGLE_V1)


def test_an_sglang_patch_on_a_vllm_host_is_refused_there_and_nothing_changes(lh):
    host = vllm_host(lh)
    before = {rel: sha256(lh.site / rel) for rel in (EAGLE, EAGLE_V2, EAGLE_V1, EAGLE_SPEC)}
    pid = lh.server_pid()
    for run in (steps.check_patch, steps.deploy):
        j, _ = job(lh, host=host)
        r = run(j, host)
        assert r.status == "conflict", r.message
        assert ("spec-path-beacon is a patch for SGLang, but this host runs vLLM (engine.kind in the inventory); "
                "nothing was changed on this host") in r.message
    assert {rel: sha256(lh.site / rel) for rel in before} == before and lh.is_pristine()
    assert not lh.lock.exists() and lh.server_pid() == pid   # not restarted


def test_the_cli_checks_a_patch_against_the_profile_its_engine_names(lh, tmp_path):
    """`prepare` loads an `engine: vllm` patch with the vLLM profile even when the selected hosts run
    SGLang (each such host is refused later, alone); an engine without a profile stays exit 2."""
    from fleetpatch.cli_common import patch_profile
    from fleetpatch.errors import UsageError
    root = vllm_patch(tmp_path / "p")
    assert patch_profile("vllm-fix", [root], [lh.host()]) is PROFILE
    manifest = root / "vllm-fix" / "patch.yaml"
    manifest.write_text(manifest.read_text().replace("engine: vllm", "engine: tgi"))
    profile = patch_profile("vllm-fix", [root], [lh.host()])
    assert profile is engines.get("sglang")
    with pytest.raises(UsageError, match="this patch is for 'tgi', but the engine profile is 'sglang'"):
        load_patch("vllm-fix", [root], profile)


def test_a_file_names_the_classes_it_defines_in_the_host_s_release():
    """SpecDecodeBaseProposer lived in v1/spec_decode/eagle.py in 0.15-0.19 only: a 0.33.0 host's
    pre-flight must not say a patch of eagle.py changes it (it moved to llm_base_proposer.py)."""
    f = "vllm/v1/spec_decode/eagle.py"
    assert PROFILE.paths_of_file(f, "0.19.1") == ["EagleProposer", "SpecDecodeBaseProposer"]
    assert PROFILE.paths_of_file(f, "0.33.0") == ["EagleProposer"]
    assert PROFILE.paths_of_file("vllm/v1/spec_decode/llm_base_proposer.py", "0.33.0") == ["SpecDecodeBaseProposer"]
    assert PROFILE.paths_of_file(f, "9.9.9") == PROFILE.paths_of_file(f) == ["EagleProposer", "SpecDecodeBaseProposer"]
