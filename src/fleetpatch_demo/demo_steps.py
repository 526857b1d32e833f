"""The demo's steps: each a real ``fleetpatch`` command run as the user would type it, its
exit code and JSON report checked against what the demo expects (run.py for SGLang,
run_vllm.py for vLLM). `four_steps` runs the four steps both engines' demos take (status,
rollout, check-patch and the forced deploy of a one-path patch), an engine's `Trap` saying
what differs."""
from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.rule import Rule

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


def fresh_reports(root: Path) -> Path:
    """root/reports, emptied: where this run's steps write their reports."""
    reports = root / "reports"
    if reports.exists():
        shutil.rmtree(reports)
    reports.mkdir(parents=True)
    return reports


def point_at(inventory: Path) -> str:
    """The one line that points the everyday commands at the demo fleet."""
    return f"export FLEETPATCH_INVENTORY={shlex.quote(str(Path(inventory).absolute()))}"


def misbehaved(console: Console, step: Step, down_cmd: str) -> int:
    console.print(f"fleetpatch demo: step {step.title!r} misbehaved: {step.problem}", style="bold red", markup=False)
    if step.report is not None:
        console.print(f"  its report: {show_path(step.report)}", markup=False)
    console.print(f"The demo fleet is still running for a look; `{down_cmd}` stops it.", markup=False)
    return 1


def no_more_checks(doc: dict) -> None:
    """A step checked by its exit code and hosts alone."""


@dataclass
class Trap:
    """One engine's demo of the one-path trap, as `four_steps` takes it: the release, the patch
    rolled out (step 2), the one-path patch (steps 3 and 4), the hosts that run the path it misses,
    what each step says first, and what the engine checks beyond the hosts' statuses."""

    engine: str                    # "SGLang" | "vLLM": the release's and its files' name in what is said
    version: str
    shipped: str
    one_path: str
    trap_hosts: list[str]
    paths: dict[str, str]          # each host -> the path its server runs
    canary: str
    deploy_timeout: str
    rollout_says: str
    check_says: str
    force_says: str
    shipped_in: list[str] = field(default_factory=list)      # rollout's --patches, where fleetpatch does not ship it
    run_rollout: Callable[[Console, Step], Step] = run_step   # step 2 as it runs (under the router's traffic)
    after_rollout: Callable[[dict], None] = no_more_checks    # its report checked (Misbehaved), then said
    after_force: Callable[[dict], None] = no_more_checks


def four_steps(console: Console, trap: Trap, fleet: Fleet, inv: str, patches: str, reports: Path,
               down_cmd: str) -> tuple[int | None, list[Step]]:
    """Status, the rollout of the shipped patch, check-patch and the forced deploy of the one-path
    patch on the hosts it misses, each checked: (None, the 4 steps) when they behaved, else (the
    demo's exit code, said why, and the steps so far)."""
    say = console.print
    done: list[Step] = []
    hosts = ",".join(trap.trap_hosts)

    def rep(name: str) -> Path:
        return reports / f"{name}.json"

    def behaved(step: Step, check: Callable[[], None], run: Callable[[Console, Step], Step] = run_step) -> bool:
        done.append(step)
        if run(console, step).problem:
            return False
        try:
            check()
        except Misbehaved as e:
            step.problem = str(e)
            return False
        return True

    say(Rule("1. status"))
    say(f"What the fleet runs now: every host reachable, {trap.engine} {trap.version}, nothing applied.")
    s1 = Step("status", ["status", "--inventory", inv, "--report", show_path(rep("1-status"))], 0, rep("1-status"))
    if not behaved(s1, lambda: None):
        return misbehaved(console, s1, down_cmd), done

    say(Rule("2. rollout"))
    say(trap.rollout_says, markup=False)
    s2 = Step("rollout", ["rollout", "--patch", trap.shipped, *trap.shipped_in, "--group", "all", "--inventory", inv,
                          "--report", show_path(rep("2-rollout"))], 0, rep("2-rollout"))

    def rolled_out() -> None:
        doc = read_report(s2)
        expect_hosts(doc, list(trap.paths), "verified", trap.paths)
        stages = doc.get("stages") or []
        if stages and stages[0] != [trap.canary]:
            raise Misbehaved(f"the first stage was {stages[0]}, expected the canary [{trap.canary}]")
        trap.after_rollout(doc)
    if not behaved(s2, rolled_out, trap.run_rollout):
        return misbehaved(console, s2, down_cmd), done

    say(Rule("3. check-patch"))
    say(trap.check_says, markup=False)
    before = tree_hashes(fleet, trap.trap_hosts)
    pids = {n: fleet.server_pid(n) for n in trap.trap_hosts}
    s3 = Step("check-patch", ["check-patch", "--patch", trap.one_path, "--patches", patches, "--hosts", hosts,
                              "--inventory", inv, "--report", show_path(rep("3-check-patch"))], 1, rep("3-check-patch"))

    def nothing_changed() -> None:
        expect_hosts(read_report(s3), trap.trap_hosts, "not-executed", trap.paths)
        if tree_hashes(fleet, trap.trap_hosts) != before:
            raise Misbehaved(f"the {trap.engine} files of the hosts changed: a dry run must write nothing")
        if {n: fleet.server_pid(n) for n in trap.trap_hosts} != pids:
            raise Misbehaved("a server was restarted: a dry run must change nothing")
    if not behaved(s3, nothing_changed):
        return misbehaved(console, s3, down_cmd), done
    say("Exit 1, as it should be: refused by the pre-flight check, and the hosts' files and servers are untouched "
        "(checked).")

    say(Rule("4. deploy-patch --force"))
    say(trap.force_says, markup=False)
    s4 = Step("deploy-patch --force", [
        "deploy-patch", "--patch", trap.one_path, "--patches", patches, "--hosts", hosts, "--force",
        "--timeout", trap.deploy_timeout, "--inventory", inv, "--report", show_path(rep("4-deploy-patch"))], 1,
        rep("4-deploy-patch"))

    def never_executed() -> None:
        doc = read_report(s4)
        expect_hosts(doc, trap.trap_hosts, "not-executed", trap.paths)
        trap.after_force(doc)
    if not behaved(s4, never_executed):
        return misbehaved(console, s4, down_cmd), done
    return None, done
