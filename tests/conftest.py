"""The shared test fleet: real sshd hosts with real SGLang wheel files.

One fleet serves every end-to-end test module; each test resets the hosts it
uses to pristine (tree, state, logs, server) before it starts, so tests don't
see each other's patches.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.fleet import Fleet, HostSpec

REPO = Path(__file__).resolve().parents[1]
FIXTURE_PATCHES = REPO / "tests" / "fixtures" / "patches"

# v1 hosts: launched without SGLANG_ENABLE_SPEC_V2 and with topk 4 (the
# motivating configuration); v2 hosts: SGLANG_ENABLE_SPEC_V2=True, topk 1.
FLEET_SPECS = [
    HostSpec("v1a", version="0.5.9", spec_v2=False),
    HostSpec("v2a", version="0.5.9", spec_v2=True),
    HostSpec("v1b", version="0.5.9", spec_v2=False),
    HostSpec("v2b", version="0.5.9", spec_v2=True),
    HostSpec("old", version="0.5.8", spec_v2=False),
]

needs_fleet = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    with Fleet(root, FLEET_SPECS) as f:
        yield f


class Operator:
    """Runs fleetpatch as the operator does: the installed program, in a
    working folder with a hosts.yaml, and reads back exit code, output, report."""

    def __init__(self, fleet: Fleet, workdir: Path):
        self.fleet = fleet
        self.workdir = workdir
        self.inventory_path = fleet.write_inventory(workdir / "hosts.yaml")
        self.runs = 0

    def inventory(self) -> dict:
        return yaml.safe_load(self.inventory_path.read_text())

    def write_inventory(self, doc: dict, name: str = "hosts.yaml") -> Path:
        path = self.workdir / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def run(self, *args: str, timeout: float = 180, env: dict | None = None) -> "Run":
        self.runs += 1
        report = self.workdir / f"report-{self.runs}.json"
        argv = [sys.executable, "-m", "fleetpatch", *args]
        if args and args[0] not in ("--help", "--list", "-l") and "--report" not in args:
            argv[3:4] = [args[0], "--report", str(report)]
        proc = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200", **(env or {})})
        doc = json.loads(report.read_text()) if report.exists() else None
        return Run(proc.returncode, proc.stdout + proc.stderr, doc)


class Run:
    def __init__(self, code: int, output: str, report: dict | None):
        self.code, self.output, self.report = code, output, report

    def host(self, name: str) -> dict:
        assert self.report is not None, f"no report written; output:\n{self.output}"
        return self.report["hosts"][name]

    def __repr__(self):
        return f"Run(code={self.code})\n{self.output}"


@pytest.fixture
def operator(fleet, tmp_path):
    fleet.reset_all()
    fleet.clear_commands()
    return Operator(fleet, tmp_path)


# Hosts on the local transport (tests/localhost.py): one venv template for the whole
# session, one fresh host tree per test.
@pytest.fixture(scope="session")
def template(tmp_path_factory):
    from localhost import template_env
    return template_env(tmp_path_factory.mktemp("venv"))


@pytest.fixture
def lh(tmp_path, template):
    from localhost import LocalHost
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
    HostSpec("c1", version="0.5.9", container=True),
    HostSpec("c2", version="0.5.9", container=True, spec_v2=True),
    HostSpec("p1", version="0.5.9"),
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
def container_operator(container_fleet, tmp_path):
    """The operator of the container fleet: every host reset (containers re-created from the image)."""
    container_fleet.reset_all()
    container_fleet.clear_commands()
    return Operator(container_fleet, tmp_path)
