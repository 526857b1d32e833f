"""Fixtures shared by every tier, and the tier marks.

Each tier is a folder with a mark of the same name, given here to every test it holds:
  fast   no sshd, no root: pure logic and hosts on the local transport (`lh`); a fault
         that only root can make (needs_root) is skipped without it
  fleet  real sshd hosts (the `fleet`/`operator` fixtures, or a fleet of its own), as root
  e2e    the demo, the bench, the live router, and the demo's own tools

The shared fleet (real sshd hosts with real SGLang wheel files) is started once, by the
first test that asks for it; each test resets the hosts it uses to pristine (tree, state,
logs, server) before it starts, so tests don't see each other's patches. Helpers that are
not fixtures live in tests/support.
"""
from __future__ import annotations

import pytest

from fleetpatch_demo.fleet import Fleet, HostSpec
from support.localhost import LocalHost, template_env
from support.operator import Operator
from support.paths import TESTS

TIERS = ("fast", "fleet", "e2e")

# v1 hosts: launched without SGLANG_ENABLE_SPEC_V2 and with topk 4 (the
# motivating configuration); v2 hosts: SGLANG_ENABLE_SPEC_V2=True, topk 1.
FLEET_SPECS = [
    HostSpec("v1a", version="0.5.9", spec_v2=False),
    HostSpec("v2a", version="0.5.9", spec_v2=True),
    HostSpec("v1b", version="0.5.9", spec_v2=False),
    HostSpec("v2b", version="0.5.9", spec_v2=True),
    HostSpec("old", version="0.5.8", spec_v2=False),
]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if TESTS in item.path.parents:
            folder = item.path.relative_to(TESTS).parts[0]
            if folder in TIERS:
                item.add_marker(folder)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    with Fleet(root, FLEET_SPECS) as f:
        yield f


@pytest.fixture
def operator(fleet, tmp_path):
    fleet.reset_all()
    fleet.clear_commands()
    return Operator(fleet, tmp_path)


# Hosts on the local transport (tests/support/localhost.py): one venv template for the
# whole session, one fresh host tree per test.
@pytest.fixture(scope="session")
def template(tmp_path_factory):
    return template_env(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def lh(tmp_path, template):
    h = LocalHost(tmp_path / "h1", template)
    yield h
    h.stop()
