"""One demo step: a real `fleetpatch` command run as a user types it, its exit code and
report checked against what the demo expects (shared by run.py and proof.py)."""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass
class Step:
    title: str
    args: list[str]
    expect_code: int
    report: Path | None = None
    code: int | None = None
    seconds: float = 0.0
    problem: str = ""


class Interrupted(Exception):
    def __init__(self, step: Step):
        super().__init__(step.title)
        self.step = step


def run_step(console: Console, step: Step) -> Step:
    shown = " ".join(shlex.quote(a) for a in ["fleetpatch", *step.args])
    console.print(f"$ {shown}", style="bold", markup=False)
    argv = [sys.executable, "-m", "fleetpatch", *step.args]
    sys.stdout.flush()
    sys.stderr.flush()
    t = time.monotonic()
    # The child writes to our stdout/stderr: on a terminal it shows its live table.
    # Run where the user is, so the command shown is exactly the command run.
    # Its own session: a Ctrl-C at the terminal reaches only the demo, which
    # passes exactly one SIGINT on, so the step stops the way it stops when a
    # person presses Ctrl-C at it (subprocess.run would kill it instead, leaving
    # hosts patched, unverified and locked).
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    interrupted = False
    while True:
        try:
            proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
    step.seconds = time.monotonic() - t
    step.code = proc.returncode
    if interrupted:
        raise Interrupted(step)
    if step.code != step.expect_code:
        step.problem = f"exited {step.code}, expected {step.expect_code}"
    return step


def read_report(step: Step) -> dict:
    try:
        return json.loads(step.report.read_text())
    except (OSError, ValueError, AttributeError) as e:
        raise Misbehaved(f"no readable report at {step.report}: {e}") from None


class Misbehaved(Exception):
    """A step did not do what the demo expects (the message says what)."""


def expect_hosts(doc: dict, names: list[str], status: str, paths: dict[str, str]) -> None:
    hosts = doc.get("hosts", {})
    if sorted(hosts) != sorted(names):
        raise Misbehaved(f"the report covers {sorted(hosts)}, expected {sorted(names)}")
    for n in names:
        h = hosts[n]
        if h.get("status") != status:
            raise Misbehaved(f"{n} is {h.get('status')!r}, expected {status!r}: {h.get('message', '')}")
        if h.get("executed_path") != paths[n]:
            raise Misbehaved(f"{n}: the report says the server runs {h.get('executed_path')!r}, "
                              f"expected {paths[n]!r}")
        for s, sh in (h.get("servers") or {}).items():   # a host with several servers: each one judged
            if sh.get("status") != status or sh.get("executed_path") != paths[n]:
                raise Misbehaved(f"{n}: its server {s} is {sh.get('status')!r} on {sh.get('executed_path')!r}, "
                                  f"expected {status!r} on {paths[n]!r}")
