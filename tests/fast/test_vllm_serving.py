"""The vLLM profile where it touches a running server (issue 32): the version a host's install
states, the smoke request (POST /v1/completions, judged by choices[0].text), no /server_info,
the compile-cache evidence, and the process a line ran in. SGLang's side of each stays as it was.

Log lines are built from vLLM's own format strings, quoted from the wheels (file:line in each
test); the version files are the real ones of the cached wheel members."""
import json

import pytest

from fleetpatch import protocol
from fleetpatch.agent.package import version_in_source
from fleetpatch.agent.smoke import answered_text
from fleetpatch.engines import LaunchConfig, get
from fleetpatch.engines import vllm_wheel
from fleetpatch.evidence import Verdict
from fleetpatch.probe.verdict import Timeline, execution_block
from fleetpatch.router import check_smoke_answer
from fleetpatch.steps import execution
from fleetpatch.steps.context import server_info_url
from fleetpatch.steps.follow import smoke_failure
from support.wheelcache import VLLM_RELEASES

VLLM, SGLANG = get("vllm"), get("sglang")
# vllm/logger.py's prefix as 0.20.2 writes it when the output is not a terminal, then the message
PREFIX = "(EngineCore_DP0 pid=7) INFO 12-06 02:33:52 [backends.py:291] "


def serve(*argv):
    return LaunchConfig(argv=["/opt/vllm/.venv/bin/vllm", "serve", *argv], env={})


# ------------------------------------------------------------------ the smoke request

def test_vllm_smoke_request_is_a_completion_naming_the_served_model():
    req = VLLM.smoke_request("The capital of France is", 4, serve("/models/llama-3-8b", "--port", "8000"))
    assert req == {"path": "/v1/completions", "answer": "choices",
                   "body": {"model": "/models/llama-3-8b", "prompt": "The capital of France is", "max_tokens": 4,
                            "temperature": 0}}
    named = VLLM.smoke_request("x", 8, serve("/models/m", "--served-model-name", "kimi", "--port", "8000"))
    assert named["body"]["model"] == "kimi"
    old = VLLM.smoke_request("x", 8, LaunchConfig(argv=["python3", "-m", "vllm.entrypoints.openai.api_server",
                                                        "--model", "/models/m"], env={}))
    assert old["body"]["model"] == "/models/m"


def test_without_a_model_in_the_launch_the_agent_asks_v1_models():
    req = VLLM.smoke_request("x", 8, LaunchConfig(argv=["/usr/bin/supervisord"], env={}))
    assert "model" not in req["body"] and req["model_from"] == "/v1/models"


def test_sglang_smoke_request_is_unchanged():
    req = SGLANG.smoke_request("Hello", 8, LaunchConfig(argv=["python", "-m", "sglang.launch_server"], env={}))
    assert req == {"path": "/generate", "answer": "text",
                   "body": {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}}


def completion(text):
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m",
                       "choices": [{"index": 0, "text": text, "finish_reason": "length"}]}).encode()


def test_a_completion_is_judged_by_choices_0_text():
    assert check_smoke_answer(200, completion(" Paris"), "choices") is None
    assert check_smoke_answer(200, completion(""), "choices").startswith("HTTP 200 with no text")
    assert check_smoke_answer(200, b'{"text": "Paris"}', "choices") == "no string choices[0].text in the answer"
    assert check_smoke_answer(404, b'{"detail":"Not Found"}\nmore', "choices") == 'HTTP 404: {"detail":"Not Found"}'
    # the host's agent reads the same field: it picks the first bad answer to send back
    assert answered_text((200, completion(" Paris")), "choices")
    assert not answered_text((200, completion("")), "choices")
    assert not answered_text((200, b'{"text": "Paris"}'), "choices")
    # SGLang's answer as before
    assert check_smoke_answer(200, b'{"text": "Paris"}') is None and answered_text((200, b'{"text": "Paris"}'))


def test_a_failed_vllm_smoke_is_smoke_failed_with_status_path_and_first_body_line():
    spec = dict(protocol.SmokeSpec(url="http://127.0.0.1:8000", requests=2),
                **VLLM.smoke_request("x", 4, serve("/models/m")))
    event = {"statuses": [400, 400], "bodies": [{"status": 400, "body": protocol.pack(
        b'{"object":"error","message":"The model `x` does not exist.","code":404}\n')}]}
    why = smoke_failure(event, spec)
    assert why == ('2 of 2 smoke requests to http://127.0.0.1:8000/v1/completions failed; the first: HTTP 400: '
                   '{"object":"error","message":"The model `x` does not exist.","code":404}')
    ok = {"statuses": [200], "bodies": [{"status": 200, "body": protocol.pack(completion(" Paris"))}]}
    assert smoke_failure(ok, spec) is None


# ------------------------------------------------------------------ version, ready, server_info

@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_the_version_file_of_the_wheel_states_its_release(version):
    members = vllm_wheel.cached(version)
    if members is None:
        pytest.skip(f"vllm {version}'s members are not cached: `python3 tests/support/wheelcache.py` fetches them")
    assert VLLM.version_file == "vllm/_version.py"
    assert version_in_source(members.text("vllm/_version.py").encode()) == version


def test_version_file_forms():
    assert version_in_source(b"version: str\n__version__: str\n__version__ = version = '0.33.0'\n") == "0.33.0"
    assert version_in_source(b'__version__ = "0.5.9"\n') == "0.5.9"
    assert version_in_source(b"from ._version import __version__\n__version__ = 'dev' if x else y\n") is None


def test_vllm_has_no_server_info_and_its_ready_line_is_uvicorns():
    assert server_info_url("http://127.0.0.1:8000/health", VLLM.server_info_path) is None
    assert server_info_url("http://127.0.0.1:30000/health", SGLANG.server_info_path) == \
        "http://127.0.0.1:30000/server_info"
    for version in ("0.10.2", "0.20.2", "0.33.0", "0.34.0"):
        ready = VLLM.release(version).x["ready"]
        assert ready["line"] == VLLM.ready_line == "Application startup complete."


# ------------------------------------------------------------------ compiled from the cache

# vllm/compilation/backends.py: 0.10.2:162, 0.20.2:291, 0.33.0:311 (its "%s" is the compile tag prefix)
CACHE_LINES = {
    "0.10.2": "Directly load the compiled graph(s) for dynamic shape from the cache, took %.3f s" % 1.25,
    "0.20.2": "Directly load the compiled graph(s) for compile range %s from the cache, took %.3f s" % ("(1, 8192)", 2.5),
    "0.33.0": "%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s"
              % ("[backbone] ", "(1, 8192)", 2.5),
}
# vllm/compilation/decorators.py: 0.20.2:306
AOT_LINE = "Directly load AOT compilation from path %s" % "/root/.cache/vllm/torch_compile_cache/aot/model"


@pytest.mark.parametrize("version", sorted(CACHE_LINES))
def test_the_cache_load_line_is_found_after_vllms_prefix(version):
    lines = [PREFIX + "Initializing a V1 LLM engine (v%s) with config: ..." % version, PREFIX + CACHE_LINES[version],
             PREFIX + AOT_LINE]
    found = VLLM.compiled_from_cache(lines, [10, 11, 12])
    assert [e.line_no for e in found] == [11, 12] and found[0].text == CACHE_LINES[version]
    assert SGLANG.compiled_from_cache(lines) == []


MODEL = "vllm/model_executor/models/llama.py"
PLAN = {"modules": {"vllm.model_executor.models.llama": {"path": MODEL, "expected": "/v/" + MODEL, "lines": [120]}}}


def rec(d):
    return json.dumps(d).encode()


def records(**named):
    out = {"41-1/process.json": rec({"pid": 41, "ppid": 1, "mode": "lines"})}
    out.update({f"41-1/{k}": rec(v) for k, v in named.items()})
    return out


def imported():
    return {"module": "vllm.model_executor.models.llama", "path": MODEL, "file": "/v/" + MODEL, "same": True}


def verdict():
    return Verdict("verified", True, None, [], "", [], [], "OK gpu-v1  fix@1 verified")


def folded(files, profile, cache_lines=()):
    block = execution_block(files, PLAN, {MODEL: [120]}, {41})
    block.update(added={MODEL: [120]}, changed_files=[MODEL])
    evidence = profile.compiled_from_cache([PREFIX + line for line in cache_lines], [300 + i for i in range(len(cache_lines))])
    ctx = execution.Context("gpu-v1", "fix@1", profile, "0.33.0", True, False, 12.0, Timeline())
    ctx.compiled_cache = evidence
    return execution.fold(verdict(), block, ctx, marker_seen=False), block


def test_a_model_patch_compiled_from_the_cache_is_not_not_executed_and_says_what_to_do():
    v, block = folded(records(**{"M-llama.json": imported()}), VLLM, [CACHE_LINES["0.20.2"]])
    assert v.status == "unproven"
    assert v.message.splitlines()[0] == ("FAIL gpu-v1  fix@1 unproven: the patched code was compiled from the "
                                         "cache, no Python line of it ran")
    assert 'log line 300 "Directly load the compiled graph(s) for compile range (1, 8192) from the cache' in v.message
    assert "--enforce-eager" in v.message and "torch_compile_cache" in v.message
    assert block["compiled"]["from_cache"] is True and block["compiled"]["files"] == [MODEL]
    assert block["proved_by"] is None


def test_without_the_cache_line_the_usual_verdict_stands():
    v, _ = folded(records(**{"M-llama.json": imported()}), VLLM, [])
    assert v.status == "unproven" and "compiled from the cache" not in v.message
    # a patched file the server never imported is in no compiled graph it loaded: the usual verdict
    v, _ = folded(records(), VLLM, [CACHE_LINES["0.33.0"]])
    assert v.status == "not-executed" and "compiled from the cache" not in v.message
    assert f"{MODEL}: never imported" in v.message


def test_lines_traced_by_torch_compile_ran_under_trace():
    traced = {"module": "vllm.model_executor.models.llama", "path": MODEL, "line": 120, "traced": "dynamo"}
    v, block = folded(records(**{"M-llama.json": imported(), "T-llama-120.json": traced}), VLLM)
    assert v.status == "verified" and block["proved_by"] == "trace"
    assert f"executed under trace (lines mode): {MODEL} line 120" in v.message
    # SGLang's verdict of the same records is what it was: only traced is not run
    v, block = folded(records(**{"M-llama.json": imported(), "T-llama-120.json": traced}), SGLANG)
    assert v.status == "unproven" and "proved_by" not in block


# ------------------------------------------------------------------ which process ran it

@pytest.mark.parametrize("name,role", [("MainProcess", "API server"), ("EngineCore_DP0", "EngineCore"),
                                       ("EngineCore", "EngineCore"), ("VllmWorker-0", "Worker"),
                                       ("Worker_TP1", "Worker"), ("Thread-3", None)])
def test_process_roles(name, role):
    assert VLLM.process_role(name) == role
    assert SGLANG.process_role(name) is None


def test_the_verdict_names_the_process_a_line_ran_in():
    ran = {"module": "vllm.model_executor.models.llama", "path": MODEL, "line": 120, "traced": None,
           "proc": "EngineCore_DP0"}
    v, block = folded(records(**{"M-llama.json": imported(), "L-llama-120.json": ran}), VLLM)
    assert v.status == "verified"
    assert f"executed (lines mode): {MODEL} line 120 (pids 41; in EngineCore)" in v.message
    assert block["ran_in"] == ["EngineCore"]


def test_the_probe_runtime_names_its_process():
    from fleetpatch.probe import runtime
    import multiprocessing  # noqa: F401  (the server's; the runtime only reads it when loaded)
    assert runtime.process_name() == "MainProcess"
