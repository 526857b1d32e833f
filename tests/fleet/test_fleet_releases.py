"""check-patch, deploy-patch, verify-logs and rollback on hosts carrying the real
files of today's SGLang releases (0.5.16 - 0.5.23, v2 only), each release on the
overlapped path and on the synchronous one (--disable-overlap-schedule), over
real sshd, with the stand-in server building the worker from the host's files.

The patch is tests/fixtures/patches/release-marker: a marker in
EAGLEWorkerV2.__init__, one revision per family of that file (r1: 0.5.15 -
0.5.16, r2: 0.5.17 - 0.5.23). This module runs its own fleet (not the shared
one of the other end-to-end tests).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetpatch_demo import fleet as fleetmod
from fleetpatch_demo.fleet import Fleet, HostSpec
from fleetpatch_demo.wheels import sglang_tree

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(fleetmod.SSHD), reason="needs root and /usr/sbin/sshd")

from support.paths import FIXTURE_PATCHES as PATCHES  # noqa: E402
from support.standin_env import QUICK_STOP  # noqa: E402
PATCH = "release-marker"
MARKER = "fleetpatch fixture release-marker: EAGLEWorkerV2 ("
EAGLE_V2 = "sglang/srt/speculative/eagle_worker_v2.py"
SYNC_FLAG = "--disable-overlap-schedule"
RELEASES = ("0.5.16", "0.5.19", "0.5.20", "0.5.22", "0.5.23")
# (host, release, synchronous): every release on both paths, and 0.5.23 behind the
# Rust HTTP server (SGLANG_RUST_SERVER=1: the ready line is the Rust server's)
HOSTS = [(f"r{v.replace('.', '')[-3:]}{'s' if sync else 'o'}", v, sync)
         for v in RELEASES for sync in (False, True)] + [("r523rust", "0.5.23", True)]
RUST_ENV = {"r523rust": {"SGLANG_RUST_SERVER": "1"}}
REVISION = {"0.5.16": 1, "0.5.19": 2, "0.5.20": 2, "0.5.22": 2, "0.5.23": 2}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def release_fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("release-fleet")
    specs = [HostSpec(name, version=version, startup_delay=0.1, args=(SYNC_FLAG,) if sync else (),
                      env={**QUICK_STOP, **RUST_ENV.get(name, {})})
             for name, version, sync in HOSTS]
    with Fleet(root, specs) as fleet:
        yield fleet


class Cli:
    """fleetpatch as the operator runs it, in a folder holding the fleet's hosts.yaml."""

    def __init__(self, workdir: Path, fleet: Fleet):
        self.workdir = workdir
        fleet.write_inventory(workdir / "hosts.yaml")
        self.runs = 0

    def __call__(self, *args: str, timeout: float = 300) -> tuple[int, str, dict]:
        self.runs += 1
        report = self.workdir / f"report-{self.runs}.json"
        argv = [sys.executable, "-m", "fleetpatch", args[0], "--report", str(report), *args[1:]]
        proc = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200"})
        doc = json.loads(report.read_text()) if report.exists() else {}
        return proc.returncode, proc.stdout + proc.stderr, doc


@pytest.fixture(scope="module")
def cli(release_fleet, tmp_path_factory):
    return Cli(tmp_path_factory.mktemp("release-operator"), release_fleet)


def hosts_arg() -> str:
    return ",".join(name for name, _, _ in HOSTS)


def host_file(fleet: Fleet, name: str) -> Path:
    return fleet.hosts[name].site_packages / EAGLE_V2


def test_check_patch_names_each_hosts_revision_and_path(release_fleet, cli):
    code, out, report = cli("check-patch", "--patch", PATCH, "--patches", str(PATCHES), "--hosts", hosts_arg())
    assert code == 0, out
    assert "None" not in out, out
    for name, version, sync in HOSTS:
        host = report["hosts"][name]
        assert host["ok"] and host["status"] == "applies", (name, host)
        assert host["executed_path"] == "EAGLEWorkerV2", (name, host)
        assert host["engine_version"] == version, (name, host)
        assert host["patch"] == f"{PATCH}@{REVISION[version]}", (name, host)
        assert sha256(host_file(release_fleet, name)) == sha256(sglang_tree(version) / EAGLE_V2), \
            f"{name}: check-patch changed a file"


def test_deploy_verify_and_rollback_on_every_release_and_path(release_fleet, cli):
    code, out, report = cli("deploy-patch", "--patch", PATCH, "--patches", str(PATCHES),
                            "--hosts", hosts_arg(), "--timeout", "120")
    assert code == 0, out
    for name, version, sync in HOSTS:
        host = report["hosts"][name]
        assert host["status"] == "verified", (name, host)
        assert host["executed_path"] == "EAGLEWorkerV2", (name, host)
        assert host["patch"] == f"{PATCH}@{REVISION[version]}", (name, host)
        log = release_fleet.hosts[name].log_path.read_text(errors="replace")
        assert MARKER in log, name
        assert ("Non-overlap (synchronous) spec v2 is used" in log) is sync, name
        assert any(e["text"].startswith("Non-overlap (synchronous)") for e in host["evidence"]) is sync, host
        assert ("SGLANG_RUST_SERVER enabled, Rust server listen on" in log) is (name in RUST_ENV), name
        assert sha256(host_file(release_fleet, name)) != sha256(sglang_tree(version) / EAGLE_V2)

    code, out, report = cli("verify-logs", "--patch", PATCH, "--patches", str(PATCHES),
                            "--hosts", hosts_arg(), "--timeout", "30")
    assert code == 0, out
    for name, _, _ in HOSTS:
        assert report["hosts"][name]["status"] == "verified", (name, report["hosts"][name])

    quiet = [name for name, _, _ in HOSTS if name not in RUST_ENV]
    code, out, report = cli("rollback", "--patches", str(PATCHES), "--hosts", ",".join(quiet), timeout=300)
    assert code == 0, out
    for name, version, _ in HOSTS:
        if name in RUST_ENV:
            continue
        assert report["hosts"][name]["status"] == "rolled-back", (name, report["hosts"][name])
        assert sha256(host_file(release_fleet, name)) == sha256(sglang_tree(version) / EAGLE_V2), \
            f"{name}: not restored byte for byte"


def test_rollback_behind_the_rust_server(release_fleet, cli):
    (name,) = RUST_ENV
    code, out, report = cli("rollback", "--patches", str(PATCHES), "--hosts", name, timeout=300)
    assert code == 0, out
    assert report["hosts"][name]["status"] == "rolled-back", report["hosts"][name]
    assert sha256(host_file(release_fleet, name)) == sha256(sglang_tree("0.5.23") / EAGLE_V2)
