"""Fixtures shared by every tier, and the tier marks.

Each tier is a folder with a mark of the same name, given here to every test it holds:
  fast   no sshd, no root: pure logic and hosts on the local transport (`lh`); a fault
         that only root can make (needs_root) is skipped without it
  fleet  real sshd hosts (the `fleet`/`operator` fixtures, or a fleet of its own), as root
  e2e    the demo, the bench, the live router, and the demo's own tools

The shared fleet (real sshd hosts with real SGLang wheel files) is started once, by the
first test that asks for it; before each test every host that is not as its last reset left
it (tree, state, logs, server, processes: tests/support/pristine.py) is reset, so tests don't
see each other's patches. Helpers that are not fixtures live in tests/support.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest

# This machine's environment (CI's too) sets PYTHONDONTWRITEBYTECODE=1. Then each test process
# rewrote the asserts of every test module again, and every fleetpatch command and stand-in that a
# test starts compiled its modules afresh: the fast tier took 110 s against 89 s with bytecode
# kept (2 cores, 4 processes). An installed fleetpatch and a fleet's Python keep bytecode, so the
# suite does too; a test that needs the variable sets it for its own process.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.fleet import Fleet, HostSpec
from support.localhost import LocalHost, template_env
from support.operator import Operator
from support.pristine import Pristine
from support.paths import TESTS
from support.standin_env import QUICK_STOP

# A suite started in the background (`cmd &` in a script, nohup) inherits SIGINT ignored, and so
# would every fleetpatch it starts; the Ctrl-C tests need what a terminal gives: the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TIERS = ("fast", "fleet", "e2e")

# v1 hosts: launched without SGLANG_ENABLE_SPEC_V2 and with topk 4 (the
# motivating configuration); v2 hosts: SGLANG_ENABLE_SPEC_V2=True, topk 1.
FLEET_SPECS = [
    HostSpec("v1a", version="0.5.9", spec_v2=False, env=QUICK_STOP),
    HostSpec("v2a", version="0.5.9", spec_v2=True, env=QUICK_STOP),
    HostSpec("v1b", version="0.5.9", spec_v2=False, env=QUICK_STOP),
    HostSpec("v2b", version="0.5.9", spec_v2=True, env=QUICK_STOP),
    HostSpec("old", version="0.5.8", spec_v2=False, env=QUICK_STOP),
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


@pytest.fixture(scope="session")
def pristine():
    """Which hosts of each test fleet are still as their last reset left them: the fixtures
    that hand a test a fleet reset the others (tests/support/pristine.py)."""
    return Pristine()


@pytest.fixture
def operator(fleet, pristine, tmp_path):
    pristine.restore(fleet)
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


# Container hosts (HostSpec(container=True)): a real Docker daemon.  .ci/run starts a private
# one and exports FLEETPATCH_TEST_DOCKER_SOCK; without it a private one is started here (root).
# Where none can be had the tests that need it skip, or fail under CI (CI=true).
@pytest.fixture(scope="session")
def docker_daemon():
    from fleetpatch_demo.dockerd import DEFAULT_SOCK, SOCK_ENV, Dockerd, DockerError, docker_unavailable
    sock = os.environ.get(SOCK_ENV)
    daemon = Dockerd(sock or DEFAULT_SOCK)
    try:
        reason = docker_unavailable(sock) if sock else None
        if reason:
            raise DockerError(f"{SOCK_ENV}={sock}: {reason}")
        if not sock:
            daemon.start()
    except DockerError as e:
        message = f"needs a Docker daemon: {e}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    yield daemon
    daemon.stop()   # only one started here


CONTAINER_FLEET_SPECS = [
    HostSpec("c1", version="0.5.9", container=True, env=QUICK_STOP),
    HostSpec("c2", version="0.5.9", container=True, spec_v2=True, env=QUICK_STOP),
    HostSpec("p1", version="0.5.9", env=QUICK_STOP),
]


@pytest.fixture(scope="session")
def container_fleet(docker_daemon, tmp_path_factory):
    """Two container hosts (c1, c2: sglang-<host>-<id> containers of the engine image) and
    a plain host (p1), on the tests' Docker daemon."""
    if os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD):
        pytest.skip("needs root and /usr/sbin/sshd")
    with Fleet(tmp_path_factory.mktemp("cfleet"), CONTAINER_FLEET_SPECS,
               docker_sock=docker_daemon.sock) as f:
        yield f


@pytest.fixture
def container_operator(container_fleet, pristine, tmp_path):
    """The operator of the container fleet: every host reset (containers re-created from the image;
    the plain host where it changed)."""
    pristine.restore(container_fleet)
    return Operator(container_fleet, tmp_path)
