"""``fleetpatch demo``: a local fleet, the shipped patch rolled out, and the
motivating failure caught twice (by the pre-flight check, and - forced - by the
log verification).

The demo's state (fleet record, host trees, keys, inventory, reports) lives in
one per-user place, ``default_root()``: ``$XDG_STATE_HOME/fleetpatch/demo``,
else ``~/.local/state/fleetpatch/demo``; every command the demo prints names
it by its absolute path, so it works from any folder, and ``--down`` finds the
fleet from any folder.  A second ``up`` over a recorded fleet starts again from
pristine hosts only when the hosts' SGLang files are exactly as the last demo
left them (``END_RECORD``); otherwise (a patch deployed or rolled back since,
or a demo that did not finish there) it refuses and changes nothing, saying how
to keep using the fleet or take it down first.

``up(root)`` builds 4 real sshd hosts with SGLang 0.5.9 files (see ``fleet.py``),
two on the spec-v2 path and two not (one of them, gpu-a02, with two servers
on its one install: the inventory's ``servers:`` form), leaves them running (detached), and runs
the real ``fleetpatch`` commands against them as subprocesses, exactly as a user
would type them.  It returns 0 when every step behaved as the demo expects
(including the two steps that are *meant* to fail), else non-zero naming the
step.  When sglang-router is installed, the real router runs in front of the
fleet (started alongside it, left up with it; see ``traffic.py``), the
inventory gets its ``router:`` section, and the rollout runs under traffic
through it: a failed or cut request, or none served, is a misbehaviour.
Ctrl-C interrupts the step in flight the way it interrupts a rollout (the
child gets the SIGINT, hosts in flight finish or roll back, locks are
released) and then says where each host ended.  ``down(root)`` stops the
router and the fleet, checks that nothing is left, and removes the empty
mount-point directory.

``FLEETPATCH_DEMO_STARTUP_DELAY`` (seconds, default 1) is how long each stand-in
server takes to come up, so the live view is watchable; the tests lower it.
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.rule import Rule

from fleetpatch.errors import FleetpatchError

from . import demo_steps, run_vllm
from . import fleet as fleetmod
from . import proof as proofmod
from . import traffic as trafficmod
from .demo_steps import Interrupted as _Interrupted
from .demo_steps import Misbehaved as _Misbehaved
from .demo_steps import Step
from .demo_steps import host_digests as _host_digests
from .demo_steps import misbehaved as _misbehaved
from .demo_steps import point_at as _point_at
from .demo_steps import read_report as _report
from .demo_steps import run_step as _run_step
from .demo_steps import show_path as _show_path
from .fleet import Fleet, FleetError, HostSpec
from fleetpatch.cacheroot import cache_root

DEMO_PATCHES = Path(__file__).resolve().with_name("patches")
SHIPPED_PATCH = "dynamic-spec-disable"
ONE_PATH_PATCH = "v2-only-beacon"
SGLANG_VERSION = "0.5.9"
V2_HOSTS = ["gpu-a01", "gpu-a02"]      # SGLANG_ENABLE_SPEC_V2=True, --speculative-eagle-topk 1
V1_HOSTS = ["gpu-a03", "gpu-a04"]      # no env, --speculative-eagle-topk 4: EAGLEWorker runs
TWO_SERVERS = "gpu-a02"                # two servers (s0, s1) on its one SGLang install (`servers:`)
STARTUP_DELAY_ENV = "FLEETPATCH_DEMO_STARTUP_DELAY"
DEPLOY_TIMEOUT = "20"
# What the hosts' SGLang files were when the demo last finished: a rerun may start
# again from pristine hosts only when they still are.
END_RECORD = "demo-end.json"
# What up() and Fleet write under the demo's root (removed by down()).
CREATED_IN_ROOT = (fleetmod.STATE_FILE, fleetmod.STATE_FILE + ".tmp", "hosts.yaml", "reports", "keys", "hosts",
                   trafficmod.RECORD, trafficmod.RECORD + ".tmp", trafficmod.LOG, END_RECORD)


def default_root() -> Path:
    """The demo's per-user state folder: $XDG_STATE_HOME/fleetpatch/demo, else
    ~/.local/state/fleetpatch/demo (a relative $XDG_STATE_HOME is ignored, as the
    XDG spec says)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path(os.path.expanduser("~")) / ".local" / "state"
    return base / "fleetpatch" / "demo"


def down_command(root: Path) -> str:
    """The command that takes the fleet at `root` down, from any folder."""
    root = Path(root).absolute()
    return "fleetpatch demo --down" + ("" if root == default_root().absolute() else f" --root {shlex.quote(str(root))}")


def _console() -> Console:
    return demo_steps.console()


# ---------------------------------------------------------------- prerequisites


def _find_sshd() -> str | None:
    if os.path.exists(fleetmod.SSHD):
        return fleetmod.SSHD
    return shutil.which("sshd")


def _prerequisites() -> list[str]:
    """What this machine lacks for the demo fleet, as sentences for the user."""
    problems = []
    if not _find_sshd():
        problems.append("OpenSSH's sshd is missing (neither /usr/sbin/sshd nor sshd on PATH): "
                        "install it: apt-get install -y openssh-server")
    if os.geteuid() != 0:
        problems.append("the demo needs root: each demo host runs in its own mount namespace, "
                        "which needs root. Rerun as root (e.g. sudo fleetpatch demo)")
    for tool, pkg in (("unshare", "util-linux"), ("nsenter", "util-linux"),
                      ("ssh-keygen", "openssh-client")):
        if not shutil.which(tool):
            problems.append(f"{tool} is missing: install it: apt-get install -y {pkg}")
    return problems


def _startup_delay() -> float:
    raw = os.environ.get(STARTUP_DELAY_ENV, "")
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${STARTUP_DELAY_ENV}: expected seconds, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"${STARTUP_DELAY_ENV}: must not be negative")
    return value


def _specs(delay: float, containers: bool = False) -> list[HostSpec]:
    """The demo's hosts; with --containers each engine runs in a Docker container on its host."""
    return ([HostSpec(n, version=SGLANG_VERSION, spec_v2=True, startup_delay=delay, container=containers,
                      servers=2 if n == TWO_SERVERS and not containers else 1,   # one container, one server
                      # no warmup request at start-up: only a request proves a per-request line (proof.py)
                      args=(proofmod.SKIP_WARMUP,) if n == proofmod.PROOF_HOST else ())
             for n in V2_HOSTS]
            + [HostSpec(n, version=SGLANG_VERSION, spec_v2=False, startup_delay=delay, container=containers)
               for n in V1_HOSTS])


def _containers_missing() -> str | None:
    """What `demo --containers` lacks here (a reachable Docker daemon, a way to the base image), or None."""
    from .dockerd import sock_from_env
    from .images import containers_unavailable
    return containers_unavailable(sock_from_env())


# ---------------------------------------------------------------- steps


def _refuse_rerun(root: Path, down_cmd: str) -> list[str] | None:
    """None when a demo may start at `root`: no fleet recorded there, or one whose hosts'
    SGLang files are exactly as the last demo left them (then it starts again from
    pristine hosts and loses nothing). Else the lines that say why not and what to do."""
    if not (root / fleetmod.STATE_FILE).exists():
        return None
    try:
        fleet = Fleet.attach(root)
        running = fleet.is_running()
        now = _host_digests(fleet)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable record: nothing of it can be used or stopped; up says so and goes on
    try:
        ended = json.loads((root / END_RECORD).read_text())["hosts"]
    except (OSError, ValueError, KeyError, TypeError):
        ended = None
    if ended == now:
        return None
    engine = "vLLM" if any(h.vllm for h in fleet.hosts.values()) else "SGLang"
    if ended is None:
        why = ("the demo did not finish there (it was interrupted or misbehaved), so what its hosts carry "
               "may be yours")
    else:
        changed = sorted(n for n in set(now) | set(ended) if now.get(n) != ended.get(n))
        why = (f"the {engine} files of {', '.join(changed)} changed since the demo ended there (a patch was "
               "deployed or rolled back)")
    rerun = down_cmd.replace(" --down", "", 1)
    return [f"fleetpatch demo: a demo fleet is already {'running' if running else 'recorded (stopped)'} in "
            f"{root}, and {why}. Starting the demo again would put pristine {engine} files back on every host "
            "and lose that, so nothing was changed.",
            "To keep using it, point the everyday commands at it:",
            f"  {_point_at(root / 'hosts.yaml')}",
            "  fleetpatch status",
            f"To start over instead: `{down_cmd}`, then `{rerun}`."]


# ---------------------------------------------------------------- up


ENGINES = ("sglang", "vllm")


def up(root: Path | None = None, containers: bool = False, engine: str = "sglang") -> int:
    """The demo of `engine`: SGLang's (the fleet below) or vLLM's (run_vllm.py)."""
    console = _console()
    if engine not in ENGINES:
        console.print(f"fleetpatch demo: --engine must be one of {', '.join(ENGINES)}, not {engine!r}",
                      style="bold red", markup=False)
        return 2
    problems = _prerequisites()
    missing = _containers_missing() if containers and not problems else None
    if missing:
        problems.append(f"--containers runs each engine in a Docker container, and {missing}")
    if problems:
        for p in problems:
            console.print(f"fleetpatch demo: {p}", style="bold red", markup=False)
        console.print("fleetpatch demo: nothing was started", style="red")
        return 2
    try:
        delay = _startup_delay()
    except ValueError as e:
        console.print(f"fleetpatch demo: {e}", style="bold red", markup=False)
        return 2
    sshd = _find_sshd()
    if sshd != fleetmod.SSHD:  # sshd on PATH only: fleet.py defaults to /usr/sbin/sshd
        fleetmod.SSHD = sshd
    root = Path(root or default_root()).absolute()
    shown_root = _show_path(root)
    down_cmd = down_command(root)
    refusal = _refuse_rerun(root, down_cmd)
    if refusal:
        console.print(refusal[0], style="bold red", markup=False)
        for line in refusal[1:]:
            console.print(line, markup=False)
        return 2
    started = time.monotonic()
    ctx: dict = {"containers": containers, "end_record": root / END_RECORD}
    try:
        if engine == "vllm":
            if trafficmod.read_record(root) is not None:
                trafficmod.stop_router(root)  # a previous SGLang demo's, in front of hosts about to go
            try:
                (root / END_RECORD).unlink()  # written again only when this run finishes
            except FileNotFoundError:
                pass
            return run_vllm.flow(console, root, delay, down_cmd, started, ctx)
        return _up(console, root, shown_root, delay, down_cmd, started, ctx)
    except (KeyboardInterrupt, _Interrupted) as e:
        return _interrupted(console, root, down_cmd, ctx, e.step if isinstance(e, _Interrupted) else None)


def _interrupted(console: Console, root: Path, down_cmd: str, ctx: dict, step: Step | None) -> int:
    """After Ctrl-C: where each host ended (the step's report), whether a lock
    is left (checked on the hosts' files), how to look and how to take it down."""
    say = functools.partial(console.print, markup=False)
    console.print()
    if step is None:
        say("fleetpatch demo: interrupted before a fleetpatch step ran.", style="bold red")
    else:
        say(f"fleetpatch demo: interrupted during step {step.title!r}: fleetpatch stopped it the way Ctrl-C "
            f"stops a rollout (it exited {step.code}).", style="bold red")
        try:
            doc = _report(step)
            for name, h in doc.get("hosts", {}).items():
                say(f"  {name}: {h.get('status')}  {h.get('patch') or ''}".rstrip())
        except _Misbehaved:
            say(f"  (the step wrote no report at {_show_path(step.report)}: it was stopped before any host "
                "was changed)")
    fleet = ctx.get("fleet")
    if fleet is None:
        say(f"Whatever was started keeps running: `{down_cmd}` removes it.", style="bold")
        return 130
    locked = [n for n, h in fleet.hosts.items() if (h.state_dir / "lock").exists()]
    if locked:
        say(f"Still locked: {', '.join(locked)} (a step is still finishing; rerun status in a moment).")
    else:
        say("No host is left locked (checked).")
    if ctx.get("router_url"):
        say(f"The router {ctx['router_url']} stays up in front of the fleet (the demo's inventory names it); "
            "the demo's clients stopped with it.")
    if "inventory" not in ctx:
        say(f"The demo fleet stays up. `{down_cmd}` takes it down.", style="bold")
        return 130
    say("The demo fleet stays up. To look at it, point the everyday commands at it:")
    say(f"  {_point_at(ctx['inventory'])}")
    say("  fleetpatch status")
    say(f"`{down_cmd}` takes it down.", style="bold")
    return 130


def _worker_urls(fleet: Fleet) -> dict:
    """Each server as the router lists it (the string the inventory's server.url must be): {host or host/server: URL}."""
    return fleet.worker_urls()


def _launch_router(console: Console, root: Path):
    """Start the router while the fleet starts: its `finish`, or None (said why) to go on without one."""
    if not trafficmod.available():
        console.print(trafficmod.missing_line(), style="yellow", markup=False)
        return None
    root.mkdir(parents=True, exist_ok=True)
    return trafficmod.start_router(root)


def _start_router(console: Console, root: Path, fleet: Fleet, finish) -> str | None:
    """The router's URL in front of the fleet, or None (said why) to go on without one."""
    if finish is None:
        return None
    try:
        url = finish(_worker_urls(fleet))
    except (RuntimeError, OSError, FleetpatchError) as e:
        trafficmod.stop_router(root)
        said = " ".join(str(e).split())  # its log's tail, on this one line
        console.print(f"fleetpatch demo: could not start sglang-router ({said}); the demo goes on without a router "
                      f"(its log: {_show_path(root / trafficmod.LOG)}).", style="yellow", markup=False)
        return None
    console.print(f"sglang-router up on {url}, listing the {len(_worker_urls(fleet))} servers (the real router from "
                  "PyPI, in front of the fleet as in production).", markup=False)
    return url


def _write_inventory(fleet: Fleet, path: Path, router_url: str | None) -> Path:
    doc = fleet.inventory(canary=True)
    if router_url:
        doc["defaults"]["router"] = {"urls": [router_url]}
        for name, url in _worker_urls(fleet).items():
            if name in doc["hosts"]:   # a host with several servers: fleet.inventory() gave each its url
                doc["hosts"][name]["server"]["url"] = url
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run_rollout_under_traffic(console: Console, step: Step, router_url: str, fleet: Fleet,
                               ctx: dict) -> Step:
    """The rollout step with traffic through the router and the live traffic line.
    Sets ctx["traffic"] to the final counts (also when interrupted)."""
    shown = " ".join(shlex.quote(a) for a in ["fleetpatch", *step.args])
    console.print(f"$ {shown}", style="bold", markup=False)
    names = {u: n for n, u in _worker_urls(fleet).items()}
    traffic = trafficmod.Traffic(router_url, names, log=fleet.root / trafficmod.LOG)
    ctx["traffic_gen"] = traffic
    sys.stdout.flush()
    t = time.monotonic()

    def interrupt(proc):  # exactly what Ctrl-C at the rollout itself would do
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass

    traffic.start()
    time.sleep(0.5)  # requests in flight on every worker before the first one leaves the router
    try:
        code, interrupted = trafficmod.run_child(console, [sys.executable, "-m", "fleetpatch", *step.args],
                                                 traffic, interrupt)
    finally:
        ctx["traffic"] = traffic.stop()
    step.seconds = time.monotonic() - t
    step.code = code
    console.print(trafficmod.totals_line(ctx["traffic"], interrupted), style="bold", markup=False)
    if interrupted:
        raise _Interrupted(step)
    if step.code != step.expect_code:
        step.problem = f"exited {step.code}, expected {step.expect_code}"
    return step


def _drain_proof(doc: dict) -> str:
    """What 0 failed and 0 cut prove, with the drain's own figures from the report."""
    routed = [s.get("router") or {} for h in doc.get("hosts", {}).values()
              for s in (list((h.get("servers") or {}).values()) or [h])]
    waited = sum(int(r.get("in_flight_at_removal") or 0) for r in routed)
    longest = max((float(r.get("drained_s") or 0) for r in routed), default=0.0)
    return ("0 failed, 0 cut: that is the drained rollout. fleetpatch took each worker out of the router before "
            f"restarting it; {waited} requests were still running on the workers it took out, and it waited for "
            f"them (at most {longest:.1f}s) before the SIGTERM, then put each worker back only after its smoke "
            "request. Without the router section the same rollout restarts workers the router still sends to, "
            "and the streams in flight are cut (README, 'Serving traffic', has the measured figures of both).")


def _traffic_problem(counts: dict, traffic: trafficmod.Traffic) -> str:
    bad = "; ".join(f"request {o.index} ({'stream' if o.stream else 'plain'}, {o.tokens} tokens): {o.result}, "
                    f"{o.detail}" for o in traffic.lg.bad()[:3])
    if counts[trafficmod.OK] == 0:
        return ("no request was served through the router during the rollout"
                + (f": {bad}" if bad else "") + f"; the router's log is {_show_path(traffic.log)}")
    if counts[trafficmod.FAILED] or counts[trafficmod.CUT]:
        return (f"the drained rollout lost requests ({counts[trafficmod.FAILED]} failed, "
                f"{counts[trafficmod.CUT]} cut; expected 0 and 0): {bad}")
    return ""


def _up(console: Console, root: Path, shown_root: str, delay: float, down_cmd: str, started: float,
        ctx: dict) -> int:
    console.print(Rule("fleetpatch demo"))
    console.print(
        "A local fleet of 4 GPU hosts - real OpenSSH sshd servers on 127.0.0.1, each in its own mount "
        f"namespace with its own SGLang {SGLANG_VERSION} tree (the files of the real wheel) and a stand-in "
        "server that imports them and routes speculative decoding exactly as SGLang does:")
    console.print(f"  {', '.join(V2_HOSTS)}  SGLANG_ENABLE_SPEC_V2=True  topk 1 -> EAGLEWorkerV2", markup=False)
    console.print(f"  {', '.join(V1_HOSTS)}  (not set)                  topk 4 -> EAGLEWorker", markup=False)
    if not ctx.get("containers"):
        console.print(f"{TWO_SERVERS} runs two servers (s0, s1, each on its own port, with its own log and pidfile) "
                      "from its one SGLang install: the inventory's `servers:` form. fleetpatch patches the install "
                      "once, then restarts, drains and verifies each server in turn.", markup=False)
    console.print(f"{proofmod.PROOF_HOST}'s server runs with {proofmod.SKIP_WARMUP}: SGLang sends itself no warmup "
                  "request there, so only a real request runs its per-request code.", markup=False)
    if ctx.get("containers"):
        console.print("Each engine runs in a Docker container on its host (--containers), laid out as the official "
                      "lmsysorg/sglang image: SGLang installed editable under /sgl-workspace, its log the "
                      "container's output.", markup=False)

    if trafficmod.read_record(root) is not None:
        trafficmod.stop_router(root)  # the previous demo's, in front of hosts about to go
    if (root / fleetmod.STATE_FILE).exists():
        try:
            old = Fleet.attach(root)
            if old.is_running():  # _refuse_rerun found its hosts as the last demo left them
                console.print(f"A demo fleet is already running in {shown_root}, as the last demo left it (no "
                              "patch was deployed or rolled back there since): stopping it and starting again "
                              "from pristine hosts.", markup=False)
            old.stop()
        except (OSError, ValueError, KeyError, TypeError) as e:
            console.print(f"(ignoring an unreadable fleet record in {shown_root}: {e})", markup=False)

    try:
        (root / END_RECORD).unlink()  # written again only when this run finishes
    except FileNotFoundError:
        pass
    if not (cache_root() / "trees" / SGLANG_VERSION / ".complete").exists():
        console.print(f"First run: downloading the sglang {SGLANG_VERSION} wheel with pip "
                      "(once; it is cached) ...")
    finish_router = _launch_router(console, root)
    console.print(f"Starting the fleet in {shown_root}" + (" and sglang-router" if finish_router else "") + " ...",
                  markup=False)
    sys.stdout.flush()
    t = time.monotonic()
    try:
        fleet = Fleet(root, _specs(delay, ctx.get("containers", False)), detach=True).start(timeout=60 + 4 * delay)
        ctx["fleet"] = fleet
    except (FleetError, RuntimeError, OSError) as e:
        if finish_router is not None:
            finish_router.launched.join(120)  # so that its record is there to stop it by
            trafficmod.stop_router(root)
        console.print(f"fleetpatch demo: could not start the demo fleet: {e}", style="bold red", markup=False)
        return 1
    console.print(f"{len(fleet.hosts)} hosts up in {time.monotonic() - t:.1f}s.", markup=False)
    router_url = _start_router(console, root, fleet, finish_router)
    ctx["router_url"] = router_url
    inventory = _write_inventory(fleet, root / "hosts.yaml", router_url)
    ctx["inventory"] = inventory
    inv = _show_path(inventory)
    console.print(f"Inventory {inv} (group canary: [{V2_HOSTS[0]}]"
                  + (f"; router: {router_url}, each server's url as the router lists it)" if router_url
                     else ")"), markup=False)
    reports = demo_steps.fresh_reports(root)
    patches = _show_path(DEMO_PATCHES)
    v1 = ",".join(V1_HOSTS)
    paths = {**{n: "EAGLEWorkerV2" for n in V2_HOSTS}, **{n: "EAGLEWorker" for n in V1_HOSTS}}

    def drained(doc: dict) -> None:
        """Under the router: no request lost, and what that proves said."""
        if router_url:
            problem = _traffic_problem(ctx["traffic"], ctx["traffic_gen"])
            if problem:
                raise _Misbehaved(problem)
            console.print(_drain_proof(doc), style="green", markup=False)

    trap = demo_steps.Trap(
        "SGLang", SGLANG_VERSION, SHIPPED_PATCH, ONE_PATH_PATCH, V1_HOSTS, paths, V2_HOSTS[0], DEPLOY_TIMEOUT,
        rollout_says=f"Roll the shipped patch {SHIPPED_PATCH} out to the whole fleet: the canary {V2_HOSTS[0]} first, "
                     "then the rest. It changes both eagle_worker.py and eagle_worker_v2.py, so whichever worker a "
                     "host runs, its marker must show up in the log written since fleetpatch's own restart."
                     + (" Meanwhile clients send a steady mix of streaming and plain requests through the router: "
                        "each worker leaves the router, finishes what it has in flight, restarts, answers a smoke "
                        "request and goes back, so none of them should fail or be cut." if router_url else ""),
        check_says=f"Now the motivating failure. {ONE_PATH_PATCH} changes only eagle_worker_v2.py (EAGLEWorkerV2). "
                   f"{' and '.join(V1_HOSTS)} were launched without SGLANG_ENABLE_SPEC_V2 and with "
                   "--speculative-eagle-topk 4, so they run EAGLEWorker and the patched file would never execute. "
                   "The dry run says so before anything is written:",
        force_says="Force it past the pre-flight check and this is the original incident: the patch applies, imports "
                   "and restarts cleanly, and SGLang never complains. fleetpatch reads the log written since its "
                   "restart, works out which worker ran, and fails loudly:",
        run_rollout=(lambda console, step: _run_rollout_under_traffic(console, step, router_url, fleet, ctx))
        if router_url else _run_step,
        after_rollout=drained)
    code, steps = demo_steps.four_steps(console, trap, fleet, inv, patches, reports, down_cmd)
    if code is not None:
        return code
    s1, s2, s3, s4 = steps

    # 5-8 ----------------------------------------------------------- proof under traffic (proof.py)
    try:
        proved = proofmod.show(proofmod.ProofRun(
            console, inv, patches, reports, DEPLOY_TIMEOUT, _worker_urls(fleet)[proofmod.PROOF_HOST],
            lambda: _host_digests(fleet).get(proofmod.PROOF_HOST, "")))
    except proofmod.StepFailed as e:
        return _misbehaved(console, e.step, down_cmd)

    # summary -------------------------------------------------------------
    console.print(Rule("demo summary"))
    console.print(f"1. status        exit {s1.code}  all {len(paths)} hosts reachable, SGLang {SGLANG_VERSION}")
    console.print(f"2. rollout       exit {s2.code}  {SHIPPED_PATCH} verified on {len(paths)}/{len(paths)} hosts "
                  f"({len(_worker_urls(fleet))} servers), each on the path it runs")
    console.print(f"3. check-patch   exit {s3.code}  {ONE_PATH_PATCH} refused by the pre-flight check on "
                  f"{v1}, nothing written")
    console.print(f"4. deploy-patch  exit {s4.code}  forced: not-executed on {v1}, EAGLEWorker ran, "
                  "failed loudly" + (", kept out of the router" if router_url else ""))
    for line in proved:
        console.print(line, markup=False)
    if router_url:
        c = ctx["traffic"]
        console.print(f"Router traffic during the rollout: {c['sent']} requests sent, {c[trafficmod.OK]} served, "
                      f"{c[trafficmod.FAILED]} failed, {c[trafficmod.CUT]} cut.", markup=False)
    (root / END_RECORD).write_text(json.dumps({"hosts": _host_digests(fleet)}, indent=1) + "\n")
    console.print(f"The demo behaved as expected in {time.monotonic() - started:.0f}s; steps 3, 4 and 6 "
                  "are meant to fail, that is the point.", style="bold green")
    console.print(f"The demo fleet is still running ({', '.join(V1_HOSTS)} keep {ONE_PATH_PATCH}: deploy-patch "
                  "defaults to --on-failure keep"
                  + (f"; a host that fails verification stays out of the router, so {router_url} now sends only "
                     f"to {', '.join(V2_HOSTS)}, and the rollback below puts them back" if router_url else "")
                  + f"). Reports are in {_show_path(reports)}. Try:", markup=False)
    console.print(f"  fleetpatch rollback --patch {ONE_PATH_PATCH} --patches {patches} --hosts {v1} "
                  f"--inventory {inv}", markup=False)
    console.print(f"  fleetpatch status --inventory {inv}", markup=False)
    console.print("The demo fleet stays up. To point the everyday commands at it (no --inventory needed):",
                  markup=False)
    console.print(f"  {_point_at(inventory)}", markup=False)
    console.print(f"`{down_cmd}` takes it down.", style="bold", markup=False)
    return 0


# ---------------------------------------------------------------- down


def down(root: Path | None = None) -> int:
    console = _console()
    root = Path(root or default_root()).absolute()
    shown_root = _show_path(root)
    router_doc = trafficmod.read_record(root)
    router_said = trafficmod.stop_router(root)  # first: it would health-check servers going away
    if router_said:
        console.print(router_said, markup=False)
    if not (root / fleetmod.STATE_FILE).exists():
        console.print(f"No demo fleet is recorded in {shown_root}: nothing " + ("else " if router_said else "")
                      + "to stop.", markup=False)
        return 0
    try:
        fleet = Fleet.attach(root)
    except (OSError, ValueError, KeyError, TypeError) as e:
        console.print(f"fleetpatch demo: cannot read the fleet record {root / fleetmod.STATE_FILE}: {e}",
                      style="bold red", markup=False)
        return 1
    members = fleet._ns_members()
    procs = sum(len(p) for p in members.values())
    ports = {n: (h.ssh_port, *(h.http_ports or [h.http_port])) for n, h in fleet.hosts.items()}
    if router_doc is not None:
        ports["the router"] = tuple(trafficmod.ports(router_doc))
    try:
        fleet.stop()
    except (OSError, FleetError) as e:
        console.print(f"fleetpatch demo: stopping the fleet failed: {e}", style="bold red", markup=False)
        return 1
    left = _leftovers(fleet, ports)
    if left:
        for line in left:
            console.print(f"fleetpatch demo: still there after stopping: {line}", style="bold red", markup=False)
        return 1
    removed = _remove_created(root, fleet.mount_point)
    if procs:
        hosts = [n for n, p in members.items() if p]
        console.print(f"Stopped the demo fleet in {shown_root}: {len(hosts)} hosts ({', '.join(hosts)}), "
                      f"{procs} processes (sshd, servers and their sessions); their mount namespaces and "
                      "bind mounts are gone, their ports closed (checked).", markup=False)
    else:
        console.print(f"The demo fleet in {shown_root} was not running: nothing to stop "
                      "(checked: no process, mount namespace or port of it is left).", markup=False)
    for line in removed:
        console.print(line, markup=False)
    console.print(f"The engine wheels (SGLang, vLLM) stay cached in {cache_root()} for the next run.", markup=False)
    return 0


def _mounted_in_some_namespace(path: str) -> bool:
    """Whether any mount namespace on this machine has a mount at `path`:
    another demo or test fleet may use the same mount point, and removing the
    directory under it would detach its hosts' trees (Linux >= 3.18)."""
    seen = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in seen:
                continue
            seen.add(ns)
            with open(f"/proc/{pid}/mountinfo") as f:
                for line in f:
                    point = line.split()[4].replace("\\040", " ")
                    if point == path:
                        return True
        except OSError:
            continue
    return False


def _remove_created(root: Path, mount_point: str) -> list[str]:
    """Remove what `up` created here: the demo folder (fleet record, host trees,
    keys, logs, reports) and the empty mount-point directory. Says what it did."""
    out = []
    # Only the entries the demo writes: a --root that was an existing folder keeps the rest.
    for name in CREATED_IN_ROOT:
        p = root / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()
    try:
        root.rmdir()
        out.append(f"Removed {_show_path(root)} (the hosts' files, keys, logs and reports).")
    except OSError:
        left = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        out.append(f"Removed the demo's files from {_show_path(root)}"
                   + (f"; kept what it did not create: {', '.join(left)}." if left else "."))
    try:
        parent = root.parent
        if (parent.name == ".fleetpatch" or root == default_root().absolute()) and not any(parent.iterdir()):
            parent.rmdir()  # the empty .../fleetpatch (or a former default's .fleetpatch) the demo made
    except OSError:
        pass
    if os.path.isdir(mount_point):
        if _mounted_in_some_namespace(mount_point):
            out.append(f"Kept the mount point {mount_point}: another fleet on this machine mounts its hosts there.")
        else:
            try:
                os.rmdir(mount_point)
                out.append(f"Removed the empty mount point {mount_point}.")
            except OSError as e:
                out.append(f"Kept the mount point {mount_point}: {e.strerror or e}.")
    return out


def _leftovers(fleet: Fleet, ports: dict, wait: float = 5.0) -> list[str]:
    """What of the fleet is still there: processes in its namespaces (each namespace,
    with its bind mount, lives exactly as long as a process in it), a listening port,
    or a bind mount at mount_point leaked into this namespace."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for n, pids in fleet._ns_members().items():
            if pids:
                left.append(f"{n}: processes {pids} in its mount namespace")
        listening = fleetmod._listening_ports()
        for n, ps in ports.items():
            for p in ps:
                if p and p in listening:
                    left.append(f"{n}: 127.0.0.1:{p} is still listening")
        if os.path.ismount(fleet.mount_point):
            left.append(f"a mount at {fleet.mount_point} in this mount namespace")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
