"""Polling until something a test waits for holds, within a bound (never a timed assertion)."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 20.0, step: float = 0.02) -> bool:
    """True as soon as `predicate()` is, False once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False
