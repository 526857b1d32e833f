"""The demo's steps: each a real ``fleetpatch`` command run as the user would type it, its
exit code and JSON report checked against what the demo expects (run.py for SGLang,
run_vllm.py for vLLM)."""
from __future__ import annotations

import hashlib
import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from .fleet import Fleet
from .images import container_package_dir


def console() -> Console:
    # soft_wrap: a command the demo tells the user to run stays on one line,
    # piped or not (the terminal wraps it for the eye, a copy gets it whole).
    return Console(highlight=False, soft_wrap=True)


def show_path(p: Path) -> str:
    """p as a command the user may run from any folder needs it: absolute."""
    return str(Path(p).absolute())


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
    pass


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


def tree_hashes(fleet: Fleet, names: list[str]) -> dict:
    """sha256 of every engine file (SGLang's or vLLM's) of each host (what a write would change)."""
    out = {}
    for n in names:
        h = fleet.hosts[n]
        base = h.package_dir
        if h.containerized:   # the files inside its container, through the container's root
            pid = fleet.server_pid(n)
            if not pid:
                continue
            base = Path(f"/proc/{pid}/root") / container_package_dir(h.spec.engine).lstrip("/")
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[(n, str(p.relative_to(base)))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def host_digests(fleet: Fleet) -> dict:
    """{host: sha256 of all its engine files}: what a deploy or a rollback changes."""
    out: dict = {}
    for (name, rel), digest in sorted(tree_hashes(fleet, list(fleet.hosts)).items()):
        out.setdefault(name, hashlib.sha256()).update(f"{rel}\0{digest}\n".encode())
    return {name: h.hexdigest() for name, h in out.items()}


def point_at(inventory: Path) -> str:
    """The one line that points the everyday commands at the demo fleet."""
    return f"export FLEETPATCH_INVENTORY={shlex.quote(str(Path(inventory).absolute()))}"


def misbehaved(console: Console, step: Step, down_cmd: str) -> int:
    console.print(f"fleetpatch demo: step {step.title!r} misbehaved: {step.problem}", style="bold red", markup=False)
    if step.report is not None:
        console.print(f"  its report: {show_path(step.report)}", markup=False)
    console.print(f"The demo fleet is still running for a look; `{down_cmd}` stops it.", markup=False)
    return 1
