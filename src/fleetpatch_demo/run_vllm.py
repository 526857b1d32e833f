"""``fleetpatch demo --engine vllm``: the one-path trap where it lives today, in vLLM.

A local fleet of 4 sshd hosts (fleet.py), each with the real files of vLLM 0.33.0
(the PyPI wheel's members, vllm_hosts.py) and the vLLM stand-in, started as ``vllm
serve`` is, with ``--speculative-config '{"method": "eagle3", ...}'``.  0.33.0 runs
Model Runner V2 by default; ``VLLM_USE_V2_MODEL_RUNNER=0`` keeps Model Runner V1,
which 0.33.0 still ships.  So:

* gpu-b01, gpu-b02: no runner setting: Model Runner V2, whose EAGLE speculator is
  ``EagleSpeculator`` (vllm/v1/worker/gpu/spec_decode/eagle/speculator.py);
* gpu-b03, gpu-b04: ``VLLM_USE_V2_MODEL_RUNNER=0``: Model Runner V1, whose EAGLE
  drafter is ``EagleProposer`` (vllm/v1/spec_decode/eagle.py).

gpu-b02 and gpu-b04 are restarted through supervisord, the others by their start
command (with ``--containers``: every host's engine is a container of the image laid
out like vllm/vllm-openai, images.py).  The steps, each a real ``fleetpatch``
command:

1. ``status``;
2. ``rollout`` of ``eagle-drafter-line`` (fleetpatch_demo/patches/), which changes
   BOTH EAGLE paths: verified on every host, each on the path it runs;
3. ``check-patch`` of ``vllm-v1-only-beacon`` (only v1/spec_decode/eagle.py) on the
   V2-runner hosts: refused by the pre-flight (exit 1), nothing written;
4. the same, forced (``deploy-patch --force``): not-executed (exit 1), the report
   naming EagleSpeculator and its file as what ran.

run.py does what both engines' demos share (prerequisites, the demo's root, Ctrl-C,
``--down``) and calls ``flow``; demo_steps.four_steps runs the four steps, which SGLang's
demo takes too, from this demo's ``Trap``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.rule import Rule

from .demo_steps import Misbehaved, Trap, four_steps, fresh_reports, host_digests, point_at, show_path
from .fleet import Fleet, FleetError, HostSpec

DEMO_PATCHES = Path(__file__).resolve().with_name("patches")
VLLM_VERSION = "0.33.0"
SHIPPED_PATCH = "eagle-drafter-line"
ONE_PATH_PATCH = "vllm-v1-only-beacon"
V2_HOSTS = ["gpu-b01", "gpu-b02"]     # 0.33.0's default: Model Runner V2 -> EagleSpeculator
V1_HOSTS = ["gpu-b03", "gpu-b04"]     # VLLM_USE_V2_MODEL_RUNNER=0: Model Runner V1 -> EagleProposer
SUPERVISED = ("gpu-b02", "gpu-b04")   # restarted through supervisord (plain hosts only)
V1_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
V2_PATH, V1_PATH = "EagleSpeculator", "EagleProposer"
SPECULATOR_FILE = "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py"
DRAFTER_FILE = "vllm/v1/spec_decode/eagle.py"
DEPLOY_TIMEOUT = "30"


def specs(delay: float, containers: bool = False) -> list[HostSpec]:
    """The vLLM demo's hosts; with --containers each engine runs in a container of the vLLM image."""
    def one(name: str, env: dict) -> HostSpec:
        kind = "supervisor" if name in SUPERVISED and not containers else "command"
        return HostSpec(name, version=VLLM_VERSION, engine="vllm", startup_delay=delay, env=dict(env),
                        restart_kind=kind, container=containers)
    return [one(n, {}) for n in V2_HOSTS] + [one(n, V1_ENV) for n in V1_HOSTS]


def flow(console: Console, root: Path, delay: float, down_cmd: str, started: float, ctx: dict) -> int:
    """Start the vLLM demo fleet under `root` and run the four steps; 0 when each behaved as expected.
    Sets ctx["fleet"] and ctx["inventory"] (for run.py's Ctrl-C report) and writes ctx["end_record"]
    (the hosts' engine files when the demo ended) on success."""
    say = console.print
    containers = bool(ctx.get("containers"))
    say(Rule("fleetpatch demo --engine vllm"))
    say(f"A local fleet of 4 GPU hosts - real OpenSSH sshd servers on 127.0.0.1, each in its own mount namespace "
        f"with the files of vLLM {VLLM_VERSION} (from its PyPI wheel) and a stand-in server that imports them and "
        "picks the model runner and the EAGLE drafter exactly as that release does, started as `vllm serve` with "
        "--speculative-config '{\"method\": \"eagle3\", ...}':", markup=False)
    say(f"  {', '.join(V2_HOSTS)}  (no runner setting)           Model Runner V2 (0.33's default) -> {V2_PATH}",
        markup=False)
    say(f"  {', '.join(V1_HOSTS)}  VLLM_USE_V2_MODEL_RUNNER=0     Model Runner V1               -> {V1_PATH}",
        markup=False)
    say(f"The two runners share no EAGLE code: {V2_PATH} lives in {SPECULATOR_FILE}, {V1_PATH} in {DRAFTER_FILE}. "
        + ("Each engine runs in a Docker container on its host (--containers), laid out as the official "
           "vllm/vllm-openai image: vLLM in the system dist-packages, its log the container's output."
           if containers else f"{' and '.join(SUPERVISED)} are restarted through supervisord, the others by "
                              "their start command; each logs to its own file."), markup=False)
    t = time.monotonic()
    try:
        fleet = Fleet(root, specs(delay, containers), detach=True).start(timeout=60 + 4 * delay)
        ctx["fleet"] = fleet
    except (FleetError, RuntimeError, OSError) as e:
        say(f"fleetpatch demo: could not start the demo fleet: {e}", style="bold red", markup=False)
        return 1
    say(f"{len(fleet.hosts)} hosts up in {time.monotonic() - t:.1f}s.", markup=False)
    inventory = root / "hosts.yaml"
    inventory.write_text(yaml.safe_dump(fleet.inventory(canary=True), sort_keys=False))
    ctx["inventory"] = inventory
    inv = show_path(inventory)
    say(f"Inventory {inv} (engine.kind: vllm on every host; group canary: [{V2_HOSTS[0]}])", markup=False)
    reports = fresh_reports(root)
    patches = show_path(DEMO_PATCHES)
    v2 = ",".join(V2_HOSTS)
    paths = {**{n: V2_PATH for n in V2_HOSTS}, **{n: V1_PATH for n in V1_HOSTS}}

    def names_the_speculator(doc: dict) -> None:
        for n in V2_HOSTS:
            if SPECULATOR_FILE not in json.dumps(doc["hosts"][n]):
                raise Misbehaved(f"{n}: the report does not name {SPECULATOR_FILE}, the speculator that ran")

    trap = Trap(
        "vLLM", VLLM_VERSION, SHIPPED_PATCH, ONE_PATH_PATCH, V2_HOSTS, paths, V2_HOSTS[0], DEPLOY_TIMEOUT,
        rollout_says=f"Roll {SHIPPED_PATCH} out to the whole fleet, the canary {V2_HOSTS[0]} first. It changes both "
                     f"EAGLE paths ({DRAFTER_FILE} and {SPECULATOR_FILE}), so whichever runner a host picked, its own "
                     "line must run in the server restarted by fleetpatch.",
        check_says=f"Now the one-path mistake. {ONE_PATH_PATCH} changes only {DRAFTER_FILE} ({V1_PATH}, Model Runner "
                   f"V1). {' and '.join(V2_HOSTS)} run vLLM {VLLM_VERSION} with no runner setting, so they run Model "
                   f"Runner V2 and {V2_PATH}: the patched file would never execute. The dry run says so before "
                   "anything is written:",
        force_says="Force it past the pre-flight check: the patch applies, imports and restarts cleanly, and vLLM "
                   "never complains. fleetpatch reads the log written since its restart and what the probe saw run, "
                   "and fails loudly, naming the speculator that ran instead:",
        shipped_in=["--patches", patches], after_force=names_the_speculator)
    code, steps = four_steps(console, trap, fleet, inv, patches, reports, down_cmd)
    if code is not None:
        return code
    s1, s2, s3, s4 = steps

    # summary -------------------------------------------------------------
    say(Rule("demo summary"))
    say(f"1. status        exit {s1.code}  all {len(paths)} hosts reachable, vLLM {VLLM_VERSION}", markup=False)
    say(f"2. rollout       exit {s2.code}  {SHIPPED_PATCH} verified on {len(paths)}/{len(paths)} hosts, "
        f"{V2_PATH} on {', '.join(V2_HOSTS)}, {V1_PATH} on {', '.join(V1_HOSTS)}", markup=False)
    say(f"3. check-patch   exit {s3.code}  {ONE_PATH_PATCH} refused by the pre-flight check on {v2}, nothing "
        "written", markup=False)
    say(f"4. deploy-patch  exit {s4.code}  forced: not-executed on {v2}, {V2_PATH} ({SPECULATOR_FILE}) ran, failed "
        "loudly", markup=False)
    end_record = ctx.get("end_record")
    if end_record:
        Path(end_record).write_text(json.dumps({"hosts": host_digests(fleet)}, indent=1) + "\n")
    say(f"The demo behaved as expected in {time.monotonic() - started:.0f}s; steps 3 and 4 are meant to fail, that "
        "is the point.", style="bold green")
    say(f"The demo fleet is still running ({', '.join(V2_HOSTS)} keep {ONE_PATH_PATCH}: deploy-patch defaults to "
        f"--on-failure keep). Reports are in {show_path(reports)}. Try:", markup=False)
    say(f"  fleetpatch rollback --patch {ONE_PATH_PATCH} --patches {patches} --hosts {v2} --inventory {inv}",
        markup=False)
    say(f"  fleetpatch status --inventory {inv}", markup=False)
    say("The demo fleet stays up. To point the everyday commands at it (no --inventory needed):", markup=False)
    say(f"  {point_at(inventory)}", markup=False)
    say(f"`{down_cmd}` takes it down.", style="bold", markup=False)
    return 0
