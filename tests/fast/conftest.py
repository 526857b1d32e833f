"""Fixtures of the fast tier's own."""
from __future__ import annotations

import pytest


@pytest.fixture
def router(tmp_path):
    """A real sglang-router on loopback, with no worker yet (skipped without the test extra)."""
    from fleetpatch_demo.routerproc import RouterProcess, router_command
    if router_command() is None:
        pytest.skip("sglang-router is not installed (test extra)")
    with RouterProcess(tmp_path / "router.log") as rp:
        yield rp
