"""What the operator sees: progress while hosts work, a summary, the loud
failure details last, and the JSON report."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.console import Group

OK_STATUSES = {"fetched", "applies", "applied", "already-applied", "verified", "rolled-back", "ok"}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class View:
    """Per-host phases: a rich live table on a TTY, timestamped lines otherwise."""

    def __init__(self, task: str, hosts: list[str], console: Console | None = None, live: bool | None = None):
        self.task = task
        self.console = console or Console()
        self.live_enabled = self.console.is_terminal if live is None else live
        self.rows = {h: {"phase": "queued", "detail": "", "since": None} for h in hosts}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self._live = None
        self._last_line: dict[str, str] = {}
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
        self.bar_task = self.bar.add_task(task, total=len(hosts))

    def __enter__(self):
        if self.live_enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=8, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def progress(self, host: str, phase: str, detail: str = "") -> None:
        with self.lock:
            row = self.rows.setdefault(host, {"phase": "", "detail": "", "since": None})
            if row["phase"] != phase:
                row["since"] = time.monotonic()
            row["phase"], row["detail"] = phase, detail
            if phase == "done":
                self.bar.advance(self.bar_task)
            if self._live is not None:
                self._live.update(self._render())
                return
            line = f"{phase} {detail}".strip()
            # verify ticks change every event; print a phase once, then only real changes
            key = phase if phase == "verify" else line
            if self._last_line.get(host) == key:
                return
            self._last_line[host] = key
        stamp = time.strftime("%H:%M:%S")
        self.console.print(f"{stamp} {host:<12} {line}", markup=False, highlight=False)

    def _render(self):
        table = Table(title=f"fleetpatch {self.task}", expand=False)
        table.add_column("host")
        table.add_column("phase", min_width=10)
        table.add_column("time", justify="right", min_width=6)
        table.add_column("detail", min_width=44)
        now = time.monotonic()
        for host, row in self.rows.items():
            style = ""
            if row["phase"] == "done":
                style = "green" if row["detail"] in OK_STATUSES else "bold red"
            if row.get("first") is None and row["phase"] not in ("queued",):
                row["first"] = row["since"]
            end = row.get("ended") or now
            took = f"{end - row['first']:.1f}s" if row.get("first") else ""
            if row["phase"] == "done" and not row.get("ended"):
                row["ended"] = now
            table.add_row(host, row["phase"], took, row["detail"], style=style)
        return Group(table, self.bar)


def summary_table(task: str, results: dict) -> Table:
    table = Table(title=f"fleetpatch {task}: summary")
    for col in ("host", "status", "engine", "patch", "path", "time", "trips"):
        table.add_column(col)
    for name, r in results.items():
        table.add_row(name, r.status, r.engine_version or "-", r.patch or "-", r.executed_path or "-",
                      f"{r.duration_s:.1f}s", str(r.round_trips),
                      style="green" if r.ok else "bold red")
    return table


def print_outcome(console: Console, task: str, results: dict, extra_lines: list[str] = ()) -> None:
    console.print(summary_table(task, results))
    failed = {n: r for n, r in results.items() if not r.ok}
    for name, r in results.items():
        if r.ok and r.message and task in ("check-patch", "fetch"):
            console.print(r.message, markup=False, highlight=False)
    for name, r in failed.items():
        console.print(r.message or f"FAIL {name} {r.status}", style="red", markup=False, highlight=False)
    for line in extra_lines:
        console.print(line, markup=False, highlight=False)
    if failed:
        console.print(
            f"FAILED on {len(failed)} of {len(results)} hosts: "
            + ", ".join(f"{n} ({r.status})" for n, r in failed.items())
            + " — see the details above for each host's cause and what to do",
            style="bold red", markup=False, highlight=False)
    else:
        console.print(f"OK: {task} succeeded on all {len(results)} hosts", style="bold green")


def write_report(path: str | Path, task: str, ok: bool, started: str, results: dict, extra: dict | None = None) -> None:
    doc = {"task": task, "ok": ok, "started": started, "finished": now_iso(),
           "hosts": {name: r.to_json() for name, r in results.items()}}
    if extra:
        doc.update(extra)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def status_table(results: dict) -> Table:
    table = Table(title="fleetpatch status")
    for col in ("host", "reachable", "engine", "patches applied", "drift", "server up", "last verification"):
        table.add_column(col)
    for name, r in results.items():
        d = r.details
        if not d.get("reachable"):
            table.add_row(name, f"no ({r.status})", "-", "-", "-", "-", "-", style="bold red")
            continue
        last = d.get("last_verification") or {}
        table.add_row(
            name, "yes", (r.engine_version or "?") + ("" if d.get("known_version", True) else " (unknown to profile)"),
            ", ".join(d.get("applied") or []) or "-",
            ", ".join(p.rsplit("/", 1)[-1] for p in d.get("drift") or []) or "no",
            ("yes" if d.get("server_up") else "NO") + (" (restart pending)" if d.get("restart_pending") else ""),
            f"{last.get('status', '-')} {last.get('at', '')}".strip(),
            style="" if r.ok else "bold red")
    return table
