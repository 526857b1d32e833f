"""The demo's "proof under traffic" steps (5 to 8): a patch whose lines run only for
requests, proven by fleetpatch's own smoke request, and a gated one that stays
`unproven` until traffic makes the batch it waits for.

Both patches are markerless, and stacked on the shipped dynamic-spec-disable that
the rollout left on every host (their diffs are written against those files, as
`fleetpatch fetch` gives them). They go to PROOF_HOST, whose server runs with
`--skip-server-warmup`: SGLang's own warmup request never runs there, so no line
of theirs runs before fleetpatch's smoke request.

* step-count counts the scheduler steps at the top of both workers'
  forward_batch_generation (and, inside an `if`, the steps of 4 requests or
  more): one smoke request runs its first line, `verified`, proved by `smoke`.
* large-batch, on top of it, adds one line inside that `if`: one smoke request
  is a batch of 1, so the function runs and the line does not: `unproven`, exit 1.
  BUSY_REQUESTS requests at once straight to the server make batches of 4 and more;
  `verify-logs` then reads the probe's records: `verified`, proved by `traffic`.
* Both are rolled back, newest first, so the hosts end as the first four steps
  left them (the demo's END_RECORD, which a rerun compares).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.rule import Rule

from . import loadgen
from .demo_steps import Misbehaved, Step, read_report, run_step

FORWARD_PATCH = "step-count"
GATED_PATCH = "large-batch"
PROOF_HOST = "gpu-a01"
SKIP_WARMUP = "--skip-server-warmup"
BUSY_REQUESTS = 8          # at once: the stand-in's scheduler steps then hold up to 8 of them
BUSY_TOKENS = 24           # each: long enough that they are all in flight together


@dataclass
class ProofRun:
    """What the steps need from the demo: where things are, and how to look at the host."""

    console: Console
    inventory: str              # the inventory's absolute path
    patches: str                # the demo's patches folder, absolute
    reports: Path
    timeout: str                # deploy-patch --timeout
    server_url: str             # PROOF_HOST's server, as the host serves it (loopback)
    digest: Callable[[], str]   # sha256 of PROOF_HOST's SGLang files now


class StepFailed(Exception):
    """A step misbehaved: `step.problem` says how."""

    def __init__(self, step: Step):
        super().__init__(step.problem)
        self.step = step


def show(run: ProofRun) -> list[str]:
    """Run steps 5 to 8; their lines for the demo's summary. Raises StepFailed."""
    before = run.digest()
    s5 = _forward_step(run)
    s6 = _gated_step(run)
    s7, served = _traffic_step(run)
    s8 = _rollback_step(run, before)
    return [f"5. deploy-patch  exit {s5.code}  {FORWARD_PATCH} verified on {PROOF_HOST} by its smoke request "
            f"(proved_by: smoke; {SKIP_WARMUP})",
            f"6. deploy-patch  exit {s6.code}  {GATED_PATCH} unproven: one smoke request never makes a batch of 4",
            f"7. verify-logs   exit {s7.code}  {GATED_PATCH} verified after {served} requests at once "
            "(proved_by: traffic)",
            f"8. rollback      exit {s8.code}  {GATED_PATCH}, then {FORWARD_PATCH}, rolled back on {PROOF_HOST}"]


def _step(run: ProofRun, title: str, name: str, args: list[str], code: int) -> Step:
    report = run.reports / f"{name}.json"
    step = Step(title, [*args, "--inventory", run.inventory, "--report", str(report)], code, report)
    run_step(run.console, step)
    if step.problem:
        raise StepFailed(step)
    return step


def _host(step: Step, status: str) -> dict:
    """PROOF_HOST's entry of the step's report, checked to be `status`."""
    try:
        hosts = read_report(step).get("hosts", {})
        if sorted(hosts) != [PROOF_HOST]:
            raise Misbehaved(f"the report covers {sorted(hosts)}, expected [{PROOF_HOST!r}]")
        h = hosts[PROOF_HOST]
        if h.get("status") != status:
            raise Misbehaved(f"{PROOF_HOST} is {h.get('status')!r}, expected {status!r}: {h.get('message', '')}")
    except Misbehaved as e:
        step.problem = str(e)
        raise StepFailed(step) from None
    return h


def _expect(step: Step, ok: bool, problem: str) -> None:
    if not ok:
        step.problem = problem
        raise StepFailed(step)


def _proved_by(h: dict) -> str | None:
    return (h.get("execution") or {}).get("proved_by")


def _forward_step(run: ProofRun) -> Step:
    run.console.print(Rule("5. deploy-patch: proven by a request"))
    run.console.print(
        f"Most fixes run per request, not at start-up. {FORWARD_PATCH} adds lines at the top of "
        f"forward_batch_generation in both workers, with no marker, stacked on the shipped dynamic-spec-disable. {PROOF_HOST}'s server "
        f"runs with {SKIP_WARMUP}, so nothing runs those lines at start-up: fleetpatch sends the restarted server "
        "a smoke request, and the probe sees the added lines run for it:")
    step = _step(run, "deploy-patch (a request proves it)", f"5-deploy-{FORWARD_PATCH}",
                 ["deploy-patch", "--patch", FORWARD_PATCH, "--patches", run.patches, "--hosts", PROOF_HOST,
                  "--timeout", run.timeout], 0)
    h = _host(step, "verified")
    _expect(step, _proved_by(h) == "smoke", f"{PROOF_HOST}: execution.proved_by is {_proved_by(h)!r}, expected "
                                            "'smoke' (no line may run before the smoke request)")
    run.console.print("Verified, and the report says what proved it: execution.proved_by = smoke.", markup=False)
    return step


def _gated_step(run: ProofRun) -> Step:
    run.console.print(Rule("6. deploy-patch: a gated line"))
    run.console.print(
        f"{GATED_PATCH}, on top of it, adds one line inside step-count's `if`: it runs only when a scheduler "
        "step's batch holds 4 requests or more. One smoke request is a batch of 1: the function runs, the line "
        "does not. That is not a success, and not a wrong path either:")
    step = _step(run, "deploy-patch (a gated line)", f"6-deploy-{GATED_PATCH}",
                 ["deploy-patch", "--patch", GATED_PATCH, "--patches", run.patches, "--hosts", PROOF_HOST,
                  "--timeout", run.timeout], 1)
    h = _host(step, "unproven")
    _expect(step, "forward_batch_generation" in h.get("message", ""),
            f"the message does not name the function that ran: {h.get('message', '')}")
    run.console.print("Exit 1: unproven. patch.yaml's `prove: {concurrency: 8}` would have sent 8 smoke requests "
                      "at once; here real traffic finishes the proof, while the probe keeps watching the line in the "
                      "running server.", markup=False)
    return step


def _traffic_step(run: ProofRun) -> tuple[Step, int]:
    run.console.print(Rule("7. verify-logs after traffic"))
    run.console.print(f"{BUSY_REQUESTS} requests at once, straight to {PROOF_HOST}'s server ({run.server_url}), "
                      f"{BUSY_TOKENS} tokens each:", markup=False)
    gen = loadgen.LoadGen(run.server_url, concurrency=BUSY_REQUESTS, stream_share=0.0, tokens=(BUSY_TOKENS,),
                          max_requests=BUSY_REQUESTS, max_seconds=60.0)
    counts = gen.run()
    run.console.print(f"{counts['sent']} sent, {counts[loadgen.OK]} served, {counts[loadgen.FAILED]} failed.",
                      markup=False)
    step = Step("verify-logs after traffic", [], 0)
    if counts[loadgen.OK] != BUSY_REQUESTS:
        bad = "; ".join(f"{o.result}: {o.detail}" for o in gen.bad()[:3])
        step.problem = f"{BUSY_REQUESTS} requests to {run.server_url}: {counts[loadgen.OK]} served ({bad})"
        raise StepFailed(step)
    run.console.print("verify-logs reads what the probe recorded since the restart:", markup=False)
    step = _step(run, "verify-logs after traffic", "7-verify-logs", ["verify-logs", "--patch", GATED_PATCH, "--hosts", PROOF_HOST], 0)
    h = _host(step, "verified")
    _expect(step, _proved_by(h) == "traffic",
            f"{PROOF_HOST}: execution.proved_by is {_proved_by(h)!r}, expected 'traffic'")
    run.console.print("Verified, proved_by = traffic.", markup=False)
    return step, counts[loadgen.OK]


def _rollback_step(run: ProofRun, before: str) -> Step:
    run.console.print(Rule("8. rollback"))
    run.console.print(f"Both come off again, newest first, so {PROOF_HOST} ends as step 2 left it. After the "
                      "restart a smoke request proves the server still answers:", markup=False)
    last = None
    for n, name in enumerate((GATED_PATCH, FORWARD_PATCH)):
        last = _step(run, f"rollback {name}", f"8-rollback-{n + 1}-{name}",
                     ["rollback", "--patch", name, "--hosts", PROOF_HOST], 0)
        _host(last, "rolled-back")
    _expect(last, run.digest() == before,
            f"{PROOF_HOST}'s SGLang files are not as step 2 left them after the rollbacks")
    return last
