"""How far the code got (probe/verdict.reach): verified, not-executed or unproven, from the
probe's records as the runtime writes them, and what proved it (Timeline)."""
import json

from fleetpatch.probe.verdict import Timeline, execution_block, reach

V2 = "sglang/srt/speculative/eagle_worker_v2.py"
V1 = "sglang/srt/speculative/eagle_worker.py"
PLAN = {"modules": {
    "sglang.srt.speculative.eagle_worker_v2": {"path": V2, "expected": "/v/" + V2, "lines": [40, 41]},
    "sglang.srt.speculative.eagle_worker": {"path": V1, "expected": "/v/" + V1, "lines": [], "twins": [V2]}}}
ADDED = {V2: [40, 41]}


def rec(d):
    return json.dumps(d).encode()


def proc(pid, **records):
    out = {f"{pid}-1/process.json": rec({"pid": pid, "ppid": 1, "mode": "lines"})}
    out.update({f"{pid}-1/{name}": rec(obj) for name, obj in records.items()})
    return out


def imported(module, path):
    return {"module": module, "path": path, "file": "/v/" + path, "same": True}


def count(module, path, unit, n, lines=()):
    return {"module": module, "path": path, "unit": unit, "count": n, "lines": list(lines), "first_line": 30}


def judged(files, timeline=None):
    block = execution_block(files, PLAN, ADDED)
    return reach(block, ADDED, timeline)


def test_a_holder_that_ran_without_its_lines_is_unproven_naming_function_count_and_first_line():
    files = proc(41, **{
        "M-v2.json": imported("sglang.srt.speculative.eagle_worker_v2", V2),
        "C-v2-fbg.json": count("sglang.srt.speculative.eagle_worker_v2", V2,
                               "EAGLEWorkerV2.forward_batch_generation", 3, [40, 41])})
    got = judged(files)
    assert got["status"] == "unproven"
    assert ("EAGLEWorkerV2.forward_batch_generation (eagle_worker_v2.py) ran 3 times, but no line this patch "
            "adds ran: line 40 of " + V2) in got["lines"][0]
    assert "prove.concurrency" in got["lines"][1] and "--bake" in got["lines"][1] and "verify-logs" in got["lines"][1]


def test_counts_of_several_processes_add_up_and_past_eight_are_a_lower_bound():
    rec_a = count("sglang.srt.speculative.eagle_worker", V1, "EAGLEWorker.forward_batch_generation", 8)
    rec_b = count("sglang.srt.speculative.eagle_worker", V1, "EAGLEWorker.forward_batch_generation", 16)
    files = {**proc(41, **{"C-v1.json": rec_a}), **proc(52, **{"C-v1.json": rec_b})}
    got = judged(files)
    assert got["status"] == "not-executed"
    assert got["lines"] == ["  EAGLEWorker.forward_batch_generation (eagle_worker.py) ran at least 24 times; "
                            "this patch changes only eagle_worker_v2.py"]


def test_the_one_path_mistake_is_not_executed_naming_the_sibling_function():
    files = proc(41, **{
        "M-v1.json": imported("sglang.srt.speculative.eagle_worker", V1),
        "C-v1.json": count("sglang.srt.speculative.eagle_worker", V1, "EAGLEWorker.forward_batch_generation", 5)})
    got = judged(files)
    assert got["status"] == "not-executed"
    assert "EAGLEWorker.forward_batch_generation (eagle_worker.py) ran 5 times; this patch changes only " \
           "eagle_worker_v2.py" in got["lines"][0]


def test_imported_with_nothing_on_its_path_run_yet_is_unproven_and_never_imported_is_not_executed():
    got = judged(proc(41, **{"M-v2.json": imported("sglang.srt.speculative.eagle_worker_v2", V2)}))
    assert got["status"] == "unproven" and "no function that holds its added lines ran yet" in got["lines"][0]
    assert judged(proc(41))["status"] == "not-executed"


def line_at(t):
    return proc(41, **{"L-v2-41.json": {"module": "sglang.srt.speculative.eagle_worker_v2", "path": V2,
                                        "line": 41, "t": t}})


def test_proved_by_startup_smoke_or_traffic_from_the_first_line_time():
    timeline = Timeline(ready_at=100.0, smoke_from=101.0, smoke_to=120.0)
    assert judged(line_at(99.5), timeline) == {"status": "verified", "proved_by": "startup", "lines": []}
    assert judged(line_at(105.0), timeline)["proved_by"] == "smoke"
    assert judged(line_at(130.0), timeline)["proved_by"] == "traffic"
    # the earliest line of any process decides
    both = {**line_at(130.0), **{k.replace("41-", "52-"): v for k, v in line_at(99.0).items()}}
    assert judged(both, timeline)["proved_by"] == "startup"
    # no smoke window known: after ready is traffic; nothing known: unknown
    assert judged(line_at(105.0), Timeline(ready_at=100.0))["proved_by"] == "traffic"
    assert judged(line_at(105.0))["proved_by"] is None
