"""bench/shapes_bench.py's flags: a bad value is refused naming the flag, before any fleet starts."""
import subprocess
import sys

import pytest

from support.paths import REPO


@pytest.mark.parametrize("args,says", [
    (["--repeats", "0"], "--repeats takes a whole number of 1 or more, not '0'"),
    (["--repeats", "two"], "--repeats takes a whole number of 1 or more, not 'two'"),
    (["--out", "/nonexistent-shapes-dir/x.json"], "--out: no folder '/nonexistent-shapes-dir'"),
])
def test_a_bad_shapes_bench_flag_is_refused_and_starts_nothing(args, says):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "shapes_bench.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr
    assert "starting a fleet" not in r.stdout + r.stderr
