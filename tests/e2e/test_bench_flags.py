"""The bench's flags: a bad value is one line naming the flag, before any fleet starts."""
import os
import subprocess
import sys

import pytest

from support.paths import REPO


@pytest.mark.parametrize("flag,value,says", [
    ("--repeats", "0", "--repeats takes a whole number of 1 or more, not '0'"),
    ("--repeats", "abc", "--repeats takes a whole number of 1 or more, not 'abc'"),
    ("--delay-ms", "x", "--delay-ms takes milliseconds, a number of 0 or more, not 'x'"),
    ("--delay-ms", "nan", "--delay-ms takes milliseconds, a number of 0 or more, not 'nan'"),
    ("--quiet-wait", "-3", "--quiet-wait takes seconds, a number of 0 or more, not '-3'"),
    ("--sizes", "1,64", "sizes must be 1..32"),
    ("--tools", "foo", "unknown tool(s) ['foo']"),
    ("--fleets", "plain,vm", "--fleets takes plain and/or container, not 'plain,vm'"),
    ("--fleets", "container", "only fleetpatch and the baseline run on container hosts; add fleetpatch or baseline to --tools"),
])
def test_a_bad_bench_flag_is_one_line_and_starts_nothing(flag, value, says):
    extra = ["--tools", "pyinfra"] if flag == "--fleets" else []   # container hosts: fleetpatch and the baseline only
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), flag, value, *extra, "--no-install"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert says in r.stderr
    assert "starting a fleet" not in r.stdout + r.stderr


def test_the_bench_help_lists_the_container_fleet():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "--fleets FLEETS" in text and "plain,container times both in one run" in text


def test_the_bench_renders_issue_34s_figures_from_its_results(tmp_path):
    """fleetpatch with the probe on and off side by side, the verdict latency, the phases each host
    timed and the CPU per host on each side, rendered from the committed bench/results.json."""
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--render", str(REPO / "bench" / "results.json"),
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| fleetpatch-noprobe |" in text
    for title in ("Verdict latency", "CPU per host (ms)", "CPU of each new server"):
        assert title in text, title
