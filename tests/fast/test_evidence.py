"""evidence.judge over log windows built from the real SGLang wheels.

Every SGLang line in these windows is read out of the wheel of that version
(the warning literals of server_args.py / speculative_hook.py, the ready line of
http_server.py, the ServerArgs dump rendered from the ServerArgs dataclass
fields, the crash lines of scheduler.py / engine.py); only the patch's own
marker lines and the timestamps are made up here.
"""
from __future__ import annotations

import ast
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import pytest

from fleetpatch import evidence
from fleetpatch_demo.wheels import wheel_path
from fleetpatch.engines import get
from fleetpatch.engines.sglang import LaunchConfig
from fleetpatch.evidence import Check, Observation, Subject, judge

try:
    from fleetpatch.patchset import Marker
except Exception:  # patchset.py is written by someone else; same fields and methods
    @dataclass(frozen=True)
    class Marker:  # type: ignore[no-redef]
        path: str
        literal: Optional[str] = None
        regex: Optional[str] = None

        def matches(self, line: str) -> bool:
            if self.literal is not None:
                return self.literal in line
            return self.regex is not None and re.search(self.regex, line) is not None

        def describe(self) -> str:
            return f'"{self.literal}"' if self.literal is not None else f"regex /{self.regex}/"

PROFILE = get("sglang")
HOST, LABEL = "gpu-a01", "dynamic-spec-disable@1"
MARKERS = {
    "EAGLEWorker": Marker("EAGLEWorker", literal="Dynamic speculation disable enabled"),
    "EAGLEWorkerV2": Marker("EAGLEWorkerV2", regex="Dynamic speculation disable enabled .*V2"),
}
FORBID = ["Traceback (most recent call last)"]
TS = "[2026-01-05 10:11:12] "


# ----------------------------------------------------------------- the wheels' own text
@lru_cache(maxsize=None)
def _zip(version):
    try:
        return zipfile.ZipFile(wheel_path(version))
    except Exception as e:
        pytest.skip(f"sglang {version} wheel not available: {e}")


@lru_cache(maxsize=None)
def _tree(version, path):
    return ast.parse(_zip(version).read(path).decode())


@pytest.fixture(scope="module", autouse=True)
def _drop_the_parsed_wheels():
    """Parsed wheel files kept past this module would be walked by every full collection after it."""
    yield
    _tree.cache_clear()


def wheel_string(version, path, fragment, fill="0"):
    """The whole string literal (implicit concatenation joined, f-string holes
    filled with `fill`) in `path` of the wheel that contains `fragment`."""
    for n in ast.walk(_tree(version, path)):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and fragment in n.value:
            return n.value
        if isinstance(n, ast.JoinedStr):
            s = "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in n.values)
            if fragment in s:
                return s.replace("\x00", fill)
    raise AssertionError(f"{fragment!r} is not in {path} of sglang {version}")


SA = "sglang/srt/server_args.py"
HOOK = "sglang/srt/arg_groups/speculative_hook.py"


def W(version, which):
    """The routing warning, as printed (bare: before logging is configured)."""
    if version in ("0.5.7", "0.5.8", "0.5.9", "0.5.10"):
        frag = {"W1": "Overlap scheduler is disabled when spec v2 is off",
                "W2": "Spec v2 is enabled for eagle/eagle3",
                "W3": "disabled because of using ngram"}[which]
        return wheel_string(version, SA, frag)
    frag = {"W1": "Non-overlap (synchronous) spec v2", "W3": "disabled because of using ngram"}[which]
    return wheel_string(version, HOOK, frag)


def ready(version):
    return TS + wheel_string(version, "sglang/srt/entrypoints/http_server.py", "fired up and ready")


@lru_cache(maxsize=None)
def _server_args_fields(version):
    cls = next(n for n in ast.walk(_tree(version, SA)) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    out = []
    for s in cls.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            v = s.value
            out.append((s.target.id, v.value if isinstance(v, ast.Constant) else None))
    return out


def dump(version, algorithm, disable_overlap, multi_layer=False, topk=None, prefix=TS):
    """`server_args=ServerArgs(...)` as engine.py logs it, every field of that version's dataclass."""
    over = {"speculative_algorithm": algorithm, "disable_overlap_schedule": disable_overlap,
            "enable_multi_layer_eagle": multi_layer, "speculative_eagle_topk": topk, "model_path": "/models/kimi"}
    body = ", ".join(f"{k}={(over[k] if k in over else v)!r}" for k, v in _server_args_fields(version))
    return f"{prefix}server_args=ServerArgs({body})"


def launch(*flags, env=None, source="inventory"):
    return LaunchConfig(["/opt/sglang venv/bin/python", "-m", "sglang.launch_server", "--model-path",
                         "/models/kimi", *flags], dict(env or {}), source)


V1_LAUNCH = launch("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4")
V2_LAUNCH = launch("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
                   env={"SGLANG_ENABLE_SPEC_V2": "True"})
V1_MARK = "Dynamic speculation disable enabled (threshold=32)"
V2_MARK = "Dynamic speculation disable enabled (threshold=32) V2"


def obs(lines, first=1, server_info=None, alive=True, healthy=True, since_ready=10.0, timed_out=False):
    return Observation(list(lines), first, server_info, alive, healthy, since_ready, timed_out)


def J(o, version="0.5.9", lc=V1_LAUNCH, markers=None, expect=(), forbid=FORBID, want_markers=True, settle_s=2.0):
    check = Check(LABEL, dict(MARKERS if markers is None else markers), [e for e in expect if e],
                  [f for f in forbid if f], want_markers)
    return judge(o, Subject(PROFILE, version, lc, HOST, settle_s), check)


def tp(text, rank, ts="2026-01-05 10:11:40"):
    return f"[{ts} TP{rank}] {text}"


# ----------------------------------------------------------------- the contract's example
def test_motivating_not_executed_message_is_exactly_the_contracts():
    window = [W("0.5.9", "W1"), ready("0.5.9")]
    v = J(obs(window, first=1523))
    assert (v.status, v.final, v.executed_path) == ("not-executed", True, "EAGLEWorker")
    assert v.message == (
        "FAIL gpu-a01  dynamic-spec-disable@1 never executed\n"
        "  the server runs EAGLEWorker (sglang/srt/speculative/eagle_worker.py)\n"
        '    evidence: log line 1523 "Overlap scheduler is disabled when spec v2 is off ..."\n'
        "    cause: SGLANG_ENABLE_SPEC_V2 is not set (and --speculative-eagle-topk 4 needs the v1 path)\n"
        '  marker for EAGLEWorker not seen: "Dynamic speculation disable enabled"')
    assert v.cause == "SGLANG_ENABLE_SPEC_V2 is not set (and --speculative-eagle-topk 4 needs the v1 path)"
    assert v.evidence[0].source == "log" and v.evidence[0].line_no == 1523
    assert v.missing == ['marker for EAGLEWorker: "Dynamic speculation disable enabled"']


def test_motivating_with_the_real_dump_and_tp_ranks():
    window = ["loading weights ...", W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True, topk=4),
              *[tp("Capture draft cuda graph end. Time elapsed: 3.1 s", r) for r in range(4)], ready("0.5.9")]
    v = J(obs(window, first=100))
    assert v.status == "not-executed" and v.executed_path == "EAGLEWorker"
    lines = v.message.splitlines()
    assert lines[0] == "FAIL gpu-a01  dynamic-spec-disable@1 never executed"
    assert lines[2] == '    evidence: log line 101 "Overlap scheduler is disabled when spec v2 is off ..."'
    assert lines[3].startswith('    evidence: log line 102 "server_args=ServerArgs(... ')
    assert "disable_overlap_schedule=True" in lines[3] and "speculative_algorithm='EAGLE3'" in lines[3]
    assert lines[-1] == '  marker for EAGLEWorker not seen: "Dynamic speculation disable enabled"'


# ----------------------------------------------------------------- verified
@pytest.mark.parametrize("version", ["0.5.7", "0.5.9", "0.5.10"])
def test_verified_v1(version):
    window = [W(version, "W1"), dump(version, "EAGLE3", True, topk=4), tp(V1_MARK, 0), ready(version)]
    v = J(obs(window, first=10), version)
    assert (v.status, v.final, v.executed_path) == ("verified", True, "EAGLEWorker")
    assert v.message.splitlines()[0] == (
        f'OK   gpu-a01  dynamic-spec-disable@1 verified on EAGLEWorker (log line 12 "{V1_MARK}")')
    assert v.markers_seen == [{"path": "EAGLEWorker", "line_no": 12, "text": V1_MARK}]
    assert v.missing == []


@pytest.mark.parametrize("version", ["0.5.7", "0.5.9", "0.5.10"])
def test_verified_v2(version):
    window = [W(version, "W2"), dump(version, "EAGLE3", False, topk=1), tp(V2_MARK, 0), ready(version)]
    v = J(obs(window, first=40), version, V2_LAUNCH)
    assert (v.status, v.executed_path) == ("verified", "EAGLEWorkerV2")
    assert "verified on EAGLEWorkerV2 (log line 42" in v.message
    assert "cause: SGLANG_ENABLE_SPEC_V2=True: spec v2 with overlap scheduling" in v.message
    # the V1 literal also matches the V2 line; it is credited to the more specific V2 marker only
    assert [m["path"] for m in v.markers_seen] == ["EAGLEWorkerV2"]


def test_verified_on_0_5_15_v2_only():
    window = [dump("0.5.15", "EAGLE", False), tp(V2_MARK, 0), ready("0.5.15")]
    lc = launch("--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "4")
    v = J(obs(window), "0.5.15", lc)
    assert (v.status, v.executed_path) == ("verified", "EAGLEWorkerV2")
    assert "sglang 0.5.15 has only the spec v2 workers" in v.cause


def test_0_5_15_v1_marker_alone_never_verifies():
    window = [W("0.5.15", "W1"), dump("0.5.15", "EAGLE3", True), tp(V1_MARK, 0), ready("0.5.15")]
    v = J(obs(window), "0.5.15", launch("--speculative-algorithm", "EAGLE3", "--disable-overlap-schedule"))
    assert v.status == "not-executed" and v.executed_path == "EAGLEWorkerV2"
    assert "marker for EAGLEWorker seen" in v.message and "the server does not run EAGLEWorker" in v.message
    assert "non-overlap (synchronous)" in v.cause


def test_tp_tagged_marker_lines_count_once_per_rank():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False, topk=1),
              *[f"[2026-01-05 10:11:40 DP0 TP{r}] {V2_MARK}" for r in range(8)], ready("0.5.9")]
    v = J(obs(window), lc=V2_LAUNCH)
    assert v.status == "verified"
    assert len(v.markers_seen) == 8 and {m["text"] for m in v.markers_seen} == {V2_MARK}
    assert "seen 8 times" in v.message


def test_inherited_marker_verifies_the_subclass_path():
    # 0.5.7 has no StandaloneWorkerV2: STANDALONE stays on StandaloneWorker(EAGLEWorker) even with spec v2 on
    lc = launch("--speculative-algorithm", "STANDALONE", env={"SGLANG_ENABLE_SPEC_V2": "True"})
    window = [W("0.5.7", "W1"), dump("0.5.7", "STANDALONE", True), tp(V1_MARK, 0), ready("0.5.7")]
    v = J(obs(window), "0.5.7", lc)
    assert (v.status, v.executed_path) == ("verified", "StandaloneWorker")
    assert "verified on StandaloneWorker via EAGLEWorker code" in v.message


def test_no_launch_config_uses_the_log_alone():
    window = [W("0.5.10", "W1"), dump("0.5.10", "EAGLE", True), ready("0.5.10")]
    v = J(obs(window), "0.5.10", None)
    assert v.status == "not-executed" and v.executed_path == "EAGLEWorker"
    assert "disable_overlap_schedule=True" in v.cause


# ----------------------------------------------------------------- not executed
def test_marker_of_the_other_path_only():
    window = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True, topk=4), tp(V2_MARK, 0), ready("0.5.9")]
    v = J(obs(window, first=7))
    assert (v.status, v.executed_path) == ("not-executed", "EAGLEWorker")
    assert f'marker for EAGLEWorkerV2 seen (log line 9 "{V2_MARK}"), but the server does not run EAGLEWorkerV2' \
        in v.message
    assert 'marker for EAGLEWorker not seen: "Dynamic speculation disable enabled"' in v.message


def test_patch_without_a_marker_for_the_running_path():
    only_v2 = {"EAGLEWorkerV2": MARKERS["EAGLEWorkerV2"]}
    v = J(obs([W("0.5.9", "W1"), ready("0.5.9")]), markers=only_v2)
    assert v.status == "not-executed"
    assert "has no marker for EAGLEWorker: it carries markers for EAGLEWorkerV2 only" in v.message


def test_judge_reads_only_the_window_it_is_given():
    # an earlier run printed the marker; the run since the restart did not
    before = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True, topk=4), tp(V1_MARK, 0), ready("0.5.9")]
    after = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True, topk=4), ready("0.5.9")]
    assert J(obs(before, first=1)).status == "verified"
    v = J(obs(after, first=len(before) + 1))
    assert v.status == "not-executed" and v.markers_seen == []
    assert f"log line {len(before) + 1} " in v.message


def test_not_executed_only_after_settling():
    window = [W("0.5.9", "W1"), ready("0.5.9")]
    v = J(obs(window, since_ready=0.5))
    assert (v.status, v.final) == ("pending", False)
    assert v.missing[0].startswith("marker for EAGLEWorker")
    assert J(obs(window, since_ready=0.5), settle_s=0.1).status == "not-executed"


def test_no_speculative_decoding_at_all():
    lc = launch()
    v = J(obs([dump("0.5.9", None, False), ready("0.5.9")]), lc=lc)
    assert v.status == "not-executed" and v.executed_path is None
    assert "the server runs no speculative decoding worker" in v.message
    assert "--speculative-algorithm is not set" in v.cause


def test_prediction_disagreeing_with_the_log_is_explained():
    # the inventory says spec v2, but the running server printed W1 and dumped disable_overlap_schedule=True
    window = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True, topk=1), ready("0.5.9")]
    v = J(obs(window), lc=V2_LAUNCH)
    assert v.executed_path == "EAGLEWorker"
    assert "predicts EAGLEWorkerV2" in v.cause and "disable_overlap_schedule=True" in v.cause


def test_expect_lines():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0), ready("0.5.9")]
    v = J(obs(window), lc=V2_LAUNCH, expect=["threshold=32"])
    assert v.status == "verified"
    v = J(obs(window), lc=V2_LAUNCH, expect=["batch size over threshold"])
    assert (v.status, v.final) == ("pending", False) and 'expected line "batch size over threshold"' in v.missing
    v = J(obs(window, timed_out=True), lc=V2_LAUNCH, expect=["batch size over threshold"])
    assert v.status == "not-executed" and 'expected line not seen: "batch size over threshold"' in v.message


def test_unknown_version_is_never_guessed_and_its_marker_names_the_path_that_ran():
    """Issue 26: a release the profile does not know is not routed; the marker that
    appears is in its path's own code, so it verifies that path (never printing None)."""
    window = [dump("0.5.15", "EAGLE", False), tp(V2_MARK, 0), ready("0.5.15")]
    for version in ("0.5.24", "0.5.24.dev3", "0.5.6", None):
        v = J(obs(window), version, V2_LAUNCH)
        assert (v.status, v.final, v.executed_path) == ("verified", True, "EAGLEWorkerV2"), v.message
        assert "verified on EAGLEWorkerV2 by its marker (log line 2" in v.message
        assert "the path was not predicted" in v.message and "None" not in v.message
    v = J(obs(window), "0.5.24", V2_LAUNCH)
    assert "SGLang 0.5.24 is newer than the profile (0.5.7 \u2013 0.5.23)" in v.message


def test_unknown_version_without_a_marker_never_verifies():
    window = [dump("0.5.15", "EAGLE", False), ready("0.5.15")]
    v = J(obs(window, timed_out=True), "0.5.24", V2_LAUNCH)
    assert v.status == "not-executed" and v.final and v.executed_path is None
    assert "not in fleetpatch's engine profile" in v.cause and "None" not in v.message


def test_long_lines_are_shortened():
    long_mark = "Dynamic speculation disable enabled " + "x" * 300 + " V2"
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(long_mark, 0), ready("0.5.9")]
    v = J(obs(window), lc=V2_LAUNCH)
    first = v.message.splitlines()[0]
    assert v.status == "verified" and " ...\")" in first and len(first) < 200


# ----------------------------------------------------------------- failures
def test_forbid_line_fails_at_once():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0),
              tp("CUDA error: an illegal memory access was encountered", 0), ready("0.5.9")]
    v = J(obs(window, first=300), lc=V2_LAUNCH, forbid=["illegal memory access"])
    assert (v.status, v.final) == ("restart-failed", True)
    assert 'forbidden line at log line 303 "CUDA error: an illegal memory access was encountered" ' \
           '(forbid: "illegal memory access")' in v.message
    assert "last 5 log lines (numbered from the restart):" in v.message and "303 | [2026-01-05 10:11:40 TP0] CUDA error" in v.message


def test_crash_after_the_marker_is_restart_failed():
    she = wheel_string("0.5.9", "sglang/srt/managers/scheduler.py", "Scheduler hit an exception: ", fill="")
    dead = wheel_string("0.5.9", "sglang/srt/entrypoints/engine.py", " scheduler is dead.")
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0),
              tp(she + "Traceback (most recent call last):", 0),
              '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 3188',
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
              TS + dead]
    v = J(obs(window, first=50, alive=False, healthy=False, since_ready=None), lc=V2_LAUNCH, forbid=[])
    assert (v.status, v.final) == ("restart-failed", True)
    assert 'log line 53 "Scheduler hit an exception: Traceback (most recent call last):"' in v.message
    assert 'log line 55 "torch.OutOfMemoryError: CUDA out of memory.' in v.message
    assert "the server process is not running" in v.message
    assert "markers seen before it failed: EAGLEWorkerV2" in v.message
    assert "Rank 0 scheduler is dead." in v.message  # in the last lines


def test_process_gone_without_any_error_line():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0), ready("0.5.9")]
    v = J(obs(window, alive=False), lc=V2_LAUNCH)
    assert v.status == "restart-failed" and "the server process is not running" in v.message


@pytest.mark.parametrize("version", ["0.5.7", "0.5.9", "0.5.10"])
def test_spec_v2_with_topk_4_value_error(version):
    err = wheel_string(version, SA, "Spec v2 currently only supports topk = 1")
    lc = launch("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4",
                env={"SGLANG_ENABLE_SPEC_V2": "True"})
    window = [W(version, "W2"), "Traceback (most recent call last):",
              '  File "/opt/venv/lib/python3.11/site-packages/sglang/launch_server.py", line 29, in <module>',
              '  File "/opt/venv/lib/python3.11/site-packages/sglang/srt/server_args.py", in _handle_speculative_decoding',
              "    raise ValueError(", f"ValueError: {err}"]
    v = J(obs(window, first=1, alive=False, healthy=None, since_ready=None), version, lc, forbid=[])
    assert (v.status, v.final, v.executed_path) == ("restart-failed", True, None)
    assert f'log line 6 "ValueError: {err}"' in v.message
    assert "cause: --speculative-eagle-topk 4 cannot run on spec v2: the server would not start" in v.message


def test_scheduler_died_line_0_5_10_and_0_5_15():
    for version in ("0.5.10", "0.5.15"):
        died = wheel_string(version, "sglang/srt/entrypoints/engine.py", " scheduler died during initialization ")
        window = [dump(version, "EAGLE", False), "RuntimeError: " + died]
        v = J(obs(window, alive=True, healthy=None, since_ready=None), version, V2_LAUNCH, forbid=[])
        assert v.status == "restart-failed", version
        assert "Rank 0 scheduler died during initialization" in v.message


def test_timeout_before_ready():
    window = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True), "Load weight begin. avail mem=78.00 GB"]
    v = J(obs(window, healthy=None, since_ready=None, timed_out=True))
    assert (v.status, v.final) == ("timeout", True)
    assert 'no "The server is fired up and ready to roll!" in the 3 log lines since the restart' in v.message
    assert "last 3 log lines (numbered from the restart):" in v.message
    pending = J(obs(window, healthy=None, since_ready=None))
    assert (pending.status, pending.final) == ("pending", False)
    assert pending.missing[0] == "the server to be ready"
    assert pending.message.startswith("WAIT gpu-a01  dynamic-spec-disable@1 waiting for the server to be ready")


def test_timeout_after_ready_without_marker_is_not_executed():
    window = [W("0.5.9", "W1"), ready("0.5.9")]
    v = J(obs(window, since_ready=0.0, timed_out=True))
    assert v.status == "not-executed" and v.final


def test_unhealthy_after_the_marker():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0), ready("0.5.9")]
    v = J(obs(window, healthy=False), lc=V2_LAUNCH)
    assert (v.status, v.final) == ("pending", False) and "a healthy /health answer" in v.missing
    v = J(obs(window, healthy=False, timed_out=True), lc=V2_LAUNCH)
    assert v.status == "restart-failed" and "not healthy" in v.message
    # health unknown counts only once the ready line is there
    assert J(obs(window, healthy=None), lc=V2_LAUNCH).status == "verified"
    assert J(obs(window[:-1], healthy=None, since_ready=None), lc=V2_LAUNCH).status == "pending"


# ----------------------------------------------------------------- server_info
def test_server_info_alone_and_in_agreement():
    info = {"speculative_algorithm": "EAGLE3", "disable_overlap_schedule": False, "enable_multi_layer_eagle": False,
            "speculative_eagle_topk": 1, "version": "0.5.9"}
    window = ["[2026-01-05 10:11:40 TP0] " + V2_MARK, ready("0.5.9")]  # no routing lines (e.g. log level error)
    v = J(obs(window, server_info=info), lc=None)
    assert (v.status, v.executed_path) == ("verified", "EAGLEWorkerV2")
    assert "/server_info speculative_algorithm='EAGLE3'" in v.message
    agree = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False)] + window
    assert J(obs(agree, server_info=info), lc=V2_LAUNCH).status == "verified"


def test_evidence_conflict():
    info = {"speculative_algorithm": "EAGLE3", "disable_overlap_schedule": False, "enable_multi_layer_eagle": False}
    window = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True), tp(V1_MARK, 0), ready("0.5.9")]
    v = J(obs(window, first=20, server_info=info))
    assert (v.status, v.final, v.executed_path) == ("not-executed", True, None)
    assert v.cause == "evidence conflict: log says EAGLEWorker (line 21), server_info says EAGLEWorkerV2"
    assert v.message.splitlines()[0] == "FAIL gpu-a01  dynamic-spec-disable@1 not verified: evidence conflict"


# ----------------------------------------------------------------- rollback
def test_rollback_passes_without_markers():
    window = [W("0.5.9", "W1"), dump("0.5.9", "EAGLE3", True), ready("0.5.9")]
    v = J(obs(window), want_markers=False)
    assert (v.status, v.final) == ("rolled-back", True)
    assert v.message.startswith("OK   gpu-a01  dynamic-spec-disable@1 rolled back")


def test_rollback_fails_when_a_marker_still_appears():
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), tp(V2_MARK, 0), ready("0.5.9")]
    v = J(obs(window, first=5), lc=V2_LAUNCH, want_markers=False)
    assert (v.status, v.final) == (evidence.ROLLBACK_STILL_PATCHED, True)
    assert v.status != "rolled-back"
    assert v.message.splitlines()[0] == "FAIL gpu-a01  dynamic-spec-disable@1 still executes after the rollback"
    assert "marker for EAGLEWorkerV2 seen at log line 7" in v.message and "the patched code still runs" in v.message


def test_rollback_waits_and_times_out():
    window = [W("0.5.9", "W1")]
    v = J(obs(window, healthy=None, since_ready=None), want_markers=False)
    assert (v.status, v.final) == ("pending", False)
    v = J(obs(window, healthy=None, since_ready=None, timed_out=True), want_markers=False)
    assert v.status == "timeout"
    v = J(obs(window + [ready("0.5.9")], healthy=False, timed_out=True), want_markers=False)
    assert v.status == "restart-failed"
    v = J(obs(window + [ready("0.5.9")], since_ready=0.1), want_markers=False)
    assert (v.status, v.final) == ("pending", False)


def test_rollback_crash_is_restart_failed():
    window = [W("0.5.9", "W1"), "Traceback (most recent call last):", "RuntimeError: boom"]
    v = J(obs(window, alive=False, since_ready=None), want_markers=False, forbid=[])
    assert v.status == "restart-failed" and 'log line 3 "RuntimeError: boom"' in v.message


# ----------------------------------------------------------------- shapes
def test_verdict_fields_and_statuses():
    v = J(obs([W("0.5.9", "W1"), ready("0.5.9")]))
    assert set(vars(v)) == {"status", "final", "executed_path", "evidence", "cause", "markers_seen", "missing",
                            "message"}
    assert set(vars(v.evidence[0])) == {"source", "line_no", "text"}
    assert v.status in evidence.STATUSES
    assert evidence.shorten("Overlap scheduler is disabled when spec v2 is off or using unsupported", 50) == \
        "Overlap scheduler is disabled when spec v2 is off ..."
    assert PROFILE.strip_prefix("[2026-01-05 10:11:12 DP0 TP3] hello") == "hello"


def test_unhealthy_with_no_marker_to_quote_is_restart_failed_not_a_crash():
    """A patch the probe judges (markers optional) on a server whose health check fails: the
    verdict says so; it used to quote a marker line that was never there (IndexError)."""
    window = [W("0.5.9", "W2"), dump("0.5.9", "EAGLE3", False), ready("0.5.9")]
    check = Check(LABEL, {}, [], list(FORBID), True, markers_optional=True)
    subject = Subject(PROFILE, "0.5.9", V2_LAUNCH, HOST)
    v = judge(obs(window, healthy=False, timed_out=True), subject, check)
    assert v.status == "restart-failed" and v.final
    assert "the server logged that it is ready, but the health check does not answer 200" in v.message
