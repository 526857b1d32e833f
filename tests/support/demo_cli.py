"""The demo as a test runs it: `fleetpatch ...` as a subprocess with a short start-up delay,
wide output and no inventory from the caller's environment; and a section of its output."""
from __future__ import annotations

import os
import subprocess
import sys

from fleetpatch_demo import run as demo_run


def fleetpatch(*args, cwd, timeout=600, **extra_env):
    env = {**os.environ, "COLUMNS": "200", demo_run.STARTUP_DELAY_ENV: "0.2", **extra_env}
    env.pop("FLEETPATCH_INVENTORY", None)
    proc = subprocess.run([sys.executable, "-m", "fleetpatch", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def section(out: str, start: str, end: str | None) -> str:
    i = out.index(start)
    return out[i:out.index(end, i)] if end else out[i:]
