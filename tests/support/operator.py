"""fleetpatch run as the operator runs it, against a test fleet."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from fleetpatch_demo.fleet import Fleet


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
