"""A host's thread prints its progress line by line; once nobody reads the output (`| head` ended,
the terminal hung up) those prints must neither raise nor stop: the rest goes to /dev/null."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PRINTS = ("import sys\nfrom fleetpatch.report import LineConsole\nconsole = LineConsole()\n"
          "for i in range(3000):\n    console.line('progress line %d ' % i + 'x' * 80)\n"
          "sys.stderr.write('all %d lines handed over\\n' % (i + 1))\n")


@pytest.mark.parametrize("rich", [False, True], ids=["plain", "rich (FORCE_COLOR)"])
def test_progress_lines_after_the_reader_went_away_neither_raise_nor_stop(rich):
    read, write = os.pipe()
    os.close(read)   # the reader is gone before the first line
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    if rich:
        env["FORCE_COLOR"] = "1"
    done = subprocess.run([sys.executable, "-c", PRINTS], stdout=write, stderr=subprocess.PIPE, env=env, timeout=60)
    os.close(write)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0 and "all 3000 lines handed over" in err, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
