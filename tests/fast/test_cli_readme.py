"""The README is the user's whole reference, and the repo's example inventory
never dials anything."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import yaml

from support.paths import REPO

MINE = ["README.md", "hosts.yaml", "src/fleetpatch/cli.py", "src/fleetpatch/cli_common.py",
        "src/fleetpatch/cli_hosts.py", "src/fleetpatch/cli_fleet.py", "src/fleetpatch/report.py",
        "src/fleetpatch/rollout.py", "src/fleetpatch/ssh_errors.py", "src/fleetpatch/textsafe.py",
        "src/fleetpatch_demo/run.py"]


def test_no_reference_to_a_contract_document_users_do_not_have():
    for rel in MINE:
        text = (REPO / rel).read_text().lower()
        assert "contract" not in text, rel


def test_the_benchmark_tables_live_in_bench_with_a_summary_and_a_link():
    readme = (REPO / "README.md").read_text()
    assert "| hosts | fleetpatch |" not in readme
    assert "[bench/FIGURES.md](bench/FIGURES.md)" in readme and "[bench/README.md](bench/README.md)" in readme
    figures = (REPO / "bench" / "FIGURES.md").read_text()
    assert "| hosts | fleetpatch | baseline (1 ssh/host) | Ansible |" in figures
    assert "| 32 | 16.10 s (13.07–16.30) | 9.07 s | 41.45 s |" in figures


def test_a_bare_status_in_the_repo_fails_at_once_naming_each_host():
    doc = yaml.safe_load((REPO / "hosts.yaml").read_text())
    assert all(h["address"].endswith(".invalid") for h in doc["hosts"].values())
    env = {k: v for k, v in os.environ.items() if k != "FLEETPATCH_INVENTORY"}
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fleetpatch", "status"], cwd=REPO, capture_output=True, text=True,
                       timeout=60, env=env)
    took = time.monotonic() - t
    assert r.returncode == 1, r
    assert took < 15, f"took {took:.1f}s: it dialled something"
    for name in doc["hosts"]:
        line = next(line for line in r.stdout.splitlines() if line.startswith(f"{name} ("))
        assert "unreachable" in r.stdout and "resolve" in line.lower() or "Name or service not known" in line, line
    assert r.stdout.splitlines()[-1].startswith("FAILED on 2 of 2 hosts: gpu-a01 (unreachable), gpu-a02 (unreachable)")
