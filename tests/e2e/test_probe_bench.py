"""bench/probe_overhead.py runs here with no install and no torch: its CPU part measures the probe
in a real interpreter, and its GPU part says why it is skipped instead of failing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import REPO

BENCH = REPO / "bench" / "probe_overhead.py"


def test_the_gpu_part_skips_cleanly_without_torch_or_cuda(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--gpu", "--no-cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "probe_overhead.json").read_text())
    assert "skipped" in report["gpu"]
    assert "GPU part skipped: " in done.stdout


def test_the_cpu_part_reports_each_cost_and_what_the_probe_recorded(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--reps", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "probe_overhead.json").read_text())["cpu"]
    here = rows[0]
    assert here["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert here["mode"] == ("lines" if sys.version_info >= (3, 12) else "functions")
    # hot + the 200 first-hit functions; the 6 gated lines never ran, in either mode (functions
    # mode's guard for a line sits in the line's own block)
    assert here["recorded_lines"] == 201 and here["disabled"] == []
    assert {"first_hit_us", "watched_call_ns", "unwatched_call_ns", "counted_call_ns"} <= set(here)


def test_a_bad_flag_is_one_line():
    done = subprocess.run([sys.executable, str(BENCH), "--reps", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--reps and --steps must be at least 1" in done.stderr


def test_the_gpu_overhead_interval_is_order_statistics_2_and_8_of_9_pairs():
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe_overhead", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lo, hi, coverage = bench.median_interval([5.0, -1.0, 0.2, 0.1, 30.0, -0.3, 0.0, 0.4, -20.0])
    assert (lo, hi) == (-1.0, 5.0) and round(coverage, 3) == 0.961
    assert bench.median_interval([1.0, 2.0, 3.0])[:2] == (1.0, 3.0)


def test_a_run_seconds_of_zero_is_one_line():
    done = subprocess.run([sys.executable, str(BENCH), "--run-seconds", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--run-seconds must be above 0" in done.stderr


def test_a_control_row_times_the_same_pairs_with_the_probe_in_neither_copy(tmp_path):
    """The A/A rows (--control-modes) tell a bias of the pairing from the probe's cost: they are
    worth that only if neither copy is probed. Runs the GPU part's code on the CPU (--device cpu
    --tiny) with an interpreter that has torch ($FLEETPATCH_TORCH_PYTHON, as .ci/run sets it)."""
    python = os.environ.get("FLEETPATCH_TORCH_PYTHON")
    if not python or subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip("no interpreter with torch here (set FLEETPATCH_TORCH_PYTHON)")
    done = subprocess.run([python, str(BENCH), "--gpu", "--no-cpu", "--device", "cpu", "--tiny", "--modes", "eager",
                           "--functions-modes", "", "--control-modes", "eager", "--reps", "1", "--steps", "8",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "probe_overhead.json").read_text())["gpu"]["rows"]
    assert [(r["probe_mode_asked"], r["batch"]) for r in rows] == [("best", 1), ("best", 64), ("control", 1),
                                                                    ("control", 64)]
    for probed in rows[:2]:
        assert probed["probe"]["processes"] == 1 and probed["probe"]["executed"] == [6, 7], probed["probe"]
    for control in rows[2:]:
        assert control["probe"]["processes"] == 0 and control["probe"]["executed"] == [], control["probe"]
        assert "no probe in either copy" in done.stdout


def test_an_unknown_execution_mode_is_one_line():
    done = subprocess.run([sys.executable, str(BENCH), "--gpu", "--control-modes", "eager,graphs"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--control-modes: unknown execution mode 'graphs'" in done.stderr
