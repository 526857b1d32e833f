"""A command imports what it uses (issue 34, 1): help, the version and a usage error load
no SSH library, no rich, and none of the modules that run a command (steps, the rollout
loop, the inventory, patches, diffs, the report). Which modules, not how long: the time is
the bench's (bench/README.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fleetpatch

SRC = str(Path(fleetpatch.__file__).resolve().parent.parent)

NEVER = ("paramiko", "fabric", "rich", "cryptography",
         "fleetpatch.steps", "fleetpatch.rollout", "fleetpatch.report", "fleetpatch.inventory",
         "fleetpatch.patchset", "fleetpatch.diffapply", "fleetpatch.router", "fleetpatch.remote",
         "fleetpatch.engines", "fleetpatch.drain", "fleetpatch.evidence")


def imported(*argv: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules `fleetpatch ARGV` imports (from -X importtime), and the run."""
    env = dict(os.environ, PYTHONPATH=SRC, COLUMNS="80")
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fleetpatch", *argv], capture_output=True,
                          text=True, env=env, timeout=120)
    names = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return names, done


@pytest.mark.parametrize("argv, code", [(("--help",), 0), (("--version",), 0), (("deploy-patch", "--help"), 0),
                                        (("deploy-patch", "--patchs", "x"), 2), (("no-such-command",), 2)])
def test_help_version_and_usage_errors_load_nothing_that_runs_a_command(argv, code):
    names, done = imported(*argv)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "fleetpatch.cli" in names   # the measurement saw the program load
    loaded = sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in NEVER))
    assert not loaded, f"fleetpatch {' '.join(argv)} imported {loaded}"
