"""The laptop works out each distinct engine file and launch once per run.

These memos only save time, so what is checked is that they never change an answer:
a host with other bytes or another launch gets its own."""
from __future__ import annotations

import dataclasses
import difflib
import gc
import weakref

import pytest

from support.localhost import job
from fleetpatch import protocol, steps
from fleetpatch.diffapply import AppliedFiles, parse_diff
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
    applied = AppliedFiles()
    first = applied.apply(fd, original)
    first.detail = "rewritten by a caller"          # make_plan rewrites a conflict's detail
    first.offsets.append(99)
    second = applied.apply(fd, original)
    assert second.state == "applies" and second.detail != "rewritten by a caller" and 99 not in second.offsets
    assert second.new == first.new and b"FLEETPATCH_MEMO_TEST" in second.new


def test_other_bytes_get_their_own_result(original):
    fd = parse_diff(diff_for(original), "memo.diff")[0]
    applied = AppliedFiles()
    assert applied.apply(fd, original).state == "applies"
    patched = applied.apply(fd, original).new
    assert applied.apply(fd, patched).state == "already-applied"
    assert applied.apply(fd, b"something else\n").state == "conflict"


def test_two_distinct_diffs_never_share_an_entry(original):
    """Diffs that differ in one added line, or only in the file they name, each get their own
    result, whichever comes first, also when the first is freed and its memory reused."""
    applied = AppliedFiles()
    fd = parse_diff(diff_for(original), "memo.diff")[0]
    other_line = dataclasses.replace(fd, hunks=[dataclasses.replace(
        h, target_lines=[ln.replace("FLEETPATCH_MEMO_TEST", "FLEETPATCH_OTHER") for ln in h.target_lines])
        for h in fd.hunks])
    other_file = dataclasses.replace(fd, path="sglang/srt/speculative/other.py")
    assert b"FLEETPATCH_MEMO_TEST" in applied.apply(fd, original).new
    assert b"FLEETPATCH_OTHER" in applied.apply(other_line, original).new
    assert applied.apply(other_file, original).path == "sglang/srt/speculative/other.py"
    for _ in range(50):   # diffs made and freed in turn: a freed one's id is soon another's
        a = parse_diff(diff_for(original), "memo.diff")[0]
        assert b"FLEETPATCH_MEMO_TEST" in applied.apply(a, original).new
        del a
        b = dataclasses.replace(other_line, hunks=list(other_line.hunks))
        assert b"FLEETPATCH_OTHER" in applied.apply(b, original).new
        del b


def test_a_runs_patch_is_not_kept_once_the_run_is_over(lh):
    """Two runs in one process share no memo: what one run planned with (its patch's diffs)
    is freed with it, not held for the next run."""
    j, host = job(lh, "spec-path-beacon")
    assert steps.check_patch(j, host).ok
    diffs = [weakref.ref(fd) for rev in j.patch.revisions for fd in rev.files]
    del j
    gc.collect()
    assert diffs and all(ref() is None for ref in diffs), "a finished run's diffs are still held"


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
