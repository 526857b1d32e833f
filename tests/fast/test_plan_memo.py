"""The laptop works out each distinct engine file and launch once per run.

These memos only save time, so what is checked is that they never change an answer:
a host with other bytes or another launch gets its own."""
from __future__ import annotations

import difflib

import pytest

from fleetpatch import protocol, steps
from fleetpatch.diffapply import parse_diff
from fleetpatch.engines import LaunchConfig
from fleetpatch.engines import get as get_profile
from fleetpatch_demo.wheels import sglang_tree

V1 = "sglang/srt/speculative/eagle_worker.py"


@pytest.fixture(scope="module")
def original():
    return (sglang_tree("0.5.9") / V1).read_bytes()


def diff_for(original: bytes) -> str:
    before = original.decode().splitlines(keepends=True)
    at = next(i for i, line in enumerate(before) if line.startswith("class EAGLEWorker"))
    after = before[:at + 1] + ["    FLEETPATCH_MEMO_TEST = 1\n"] + before[at + 1:]
    return "".join(difflib.unified_diff(before, after, f"a/{V1}", f"b/{V1}"))


def test_the_same_original_gives_equal_results_that_callers_own(original):
    fd = parse_diff(diff_for(original), "memo.diff")[0]
    first = steps.apply_file(fd, original)
    first.detail = "rewritten by a caller"          # make_plan rewrites a conflict's detail
    second = steps.apply_file(fd, original)
    assert second.state == "applies" and second.detail != "rewritten by a caller"
    assert second.new == first.new and b"FLEETPATCH_MEMO_TEST" in second.new


def test_other_bytes_get_their_own_result(original):
    fd = parse_diff(diff_for(original), "memo.diff")[0]
    assert steps.apply_file(fd, original).state == "applies"
    patched = steps.apply_file(fd, original).new
    assert steps.apply_file(fd, patched).state == "already-applied"
    assert steps.apply_file(fd, b"something else\n").state == "conflict"


def test_unpacked_and_packed_bytes_round_trip(original):
    reply = {"files": {V1: {"content": protocol.pack(original)}}}
    assert steps.file_bytes(reply, V1) == original
    assert steps.file_bytes(reply, V1) == original
    assert protocol.unpack(steps.packed(original)) == original
    other = original + b"# one more line\n"
    assert protocol.unpack(steps.packed(other)) == other
    assert steps.file_bytes({"files": {V1: None}}, V1) is None


def test_each_launch_gets_its_own_prediction():
    profile = get_profile("sglang")
    argv = ["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3",
            "--speculative-eagle-topk", "1"]
    v1 = profile.predict("0.5.9", LaunchConfig(argv=argv, env={}))
    v2 = profile.predict("0.5.9", LaunchConfig(argv=argv, env={"SGLANG_ENABLE_SPEC_V2": "1"}))
    again = profile.predict("0.5.9", LaunchConfig(argv=list(argv), env={}))
    assert (v1.path, v2.path, again.path) == ("EAGLEWorker", "EAGLEWorkerV2", "EAGLEWorker")
    topk4 = profile.predict("0.5.9", LaunchConfig(argv=argv[:-1] + ["4"], env={"SGLANG_ENABLE_SPEC_V2": "1"}))
    assert topk4.path != "EAGLEWorkerV2"
    unknown = profile.predict("0.1.0", LaunchConfig(argv=argv, env={}))
    assert not unknown.known_version
