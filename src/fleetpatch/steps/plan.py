"""What applying a patch would do to one host, computed from its probe, and
check-patch, which shows it.

A release the profile does not know is never guessed (`can_prove`): deploy-patch
writes to such a host only when the result can be proven from what runs. Its
refusal, like the pre-flight's, is found on the host (the version is read there)
and is per host: the host fails (status `error`, details `refused: unprovable`),
nothing is written to it. When every selected host is refused so, the command exits 2 (a patch
error found before any host changed), otherwise 1 as for any failed host; --force
does not override it. A superseded patch (manifest `superseded`) fails the host
as `skipped`, saying what to use instead, with nothing written."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import diffapply, protocol
from ..engines import LaunchConfig
from ..engines import get as get_profile
from ..errors import HostFailure, Status
from ..hostcalls import HostResult
from ..inventory import Host
from ..patchset import NoRevisionFits, lone_siblings
from .context import HostRun, Job, host_step, inventory_launch, probe, running_launch, session_env

if TYPE_CHECKING:  # imported where a verdict is made, not on the way to the first connect
    from .. import evidence


# The hosts of a fleet mostly hold the same engine files, so the same bytes arrive from
# each (zlib is deterministic) and the same patched bytes go back: each distinct file is
# unpacked and packed once, keyed by its bytes; each diff is applied to it once per run
# (the run's `Job.applied`, a diffapply.AppliedFiles).
_MEMO_MOST = 64
_unpack = functools.lru_cache(maxsize=_MEMO_MOST)(protocol.unpack)
packed = functools.lru_cache(maxsize=_MEMO_MOST)(protocol.pack)


def file_bytes(probe_reply: protocol.ProbeReply, path: str) -> bytes | None:
    rec = (probe_reply.get("files") or {}).get(path)
    return None if rec is None else _unpack(rec["content"])


CHANGE_STATES = ("applies", "creates", "deletes")


@dataclass
class Plan:
    """What applying one revision to one host would do; computed, not done."""

    version: str | None
    label: str
    states: dict            # path -> FileResult
    preflight: evidence.Verdict | None
    prediction: object | None
    launch: LaunchConfig
    misfits: list = field(default_factory=list)   # conflicts of layout: a changed file or a created one's folder is missing
    revision: object | None = None                  # the patchset.Revision this plan applies
    clashes: dict = field(default_factory=dict)     # path -> name@rev of another patch that holds the file (`clashes`)
    session_env: dict = field(default_factory=dict)  # what a command restart inherits from the agent's SSH session

    @property
    def changes(self):
        """The files the apply writes: patched, created or deleted."""
        return [r for r in self.states.values() if r.state in CHANGE_STATES]

    @property
    def conflicts(self):
        return [r for r in self.states.values() if r.state == "conflict"]

    @property
    def already(self) -> bool:
        return all(r.state == "already-applied" for r in self.states.values())


def revision_files(job: Job) -> list[str]:
    """Every file any revision touches: one probe serves whichever revision the host's version picks.
    And the unchanged sibling of a file a revision changes alone: whether the host has it judges
    the sibling rule on a release the profile does not know (`lone_sibling`)."""
    paths = []
    pairs = [] if job.patch.allow_single_path else getattr(get_profile(job.patch.engine), "sibling_pairs", [])
    for rev in job.patch.revisions:
        changed = [fd.path for fd in rev.files]
        for path in changed + [miss for _, miss in lone_siblings(changed, pairs)]:
            if path not in paths:
                paths.append(path)
    return paths


def lone_sibling(host: Host, profile, patch, revision, reply: dict, version: str) -> str | None:
    """The sibling rule on a release the profile does not know, judged by the files this host
    has: why a revision that changes one file of a pair, not the other that the host has, is
    refused here (None: it is not). A known release was judged when the patch was loaded."""
    if patch.allow_single_path or profile.knows(version):
        return None
    files = reply.get("files") or {}
    for have, miss in lone_siblings([fd.path for fd in revision.files], getattr(profile, "sibling_pairs", [])):
        if files.get(miss) is not None:
            label = patch.label(revision)
            engine = ENGINE_NAMES.get(getattr(profile, "kind", ""), profile.package)
            return (f"{host.name}: {label} changes {have} but not its sibling {miss}, which this host has "
                    f"({engine} {version}, a release the profile does not know, in {reply.get('package_dir')}): "
                    "a server on the other code path would run the unpatched file and the patch would "
                    "never execute; nothing was changed on this host. Patch both files, or, if the patch really "
                    f'concerns one path only, set allow_single_path: "<reason>" in {patch.manifest}')
    return None


def _file_states(job: Job, profile, revision, reply: dict, version: str) -> tuple[dict, list]:
    """Each file of the revision as applying it would find it; and the misfits of layout."""
    states = {}
    missing_folders = set(reply.get("absent_folders") or [])
    misfits = []
    for fd in revision.files:
        # None: the file does not exist (a diff that creates it needs exactly that)
        state = job.applied.apply(fd, file_bytes(reply, fd.path))
        if state.state == "creates" and os.path.dirname(fd.path) in missing_folders:
            state = diffapply.FileResult(fd.path, "conflict", None, state.offsets,
                                         f"the diff creates {fd.path}, but its folder {os.path.dirname(fd.path)} "
                                         f"does not exist in {reply.get('package_dir')} ({profile.package} {version})")
            misfits.append(fd.path)
        elif state.state == "conflict" and fd.op == diffapply.MODIFY and file_bytes(reply, fd.path) is None:
            state.detail = (f"{fd.path} does not exist in {reply.get('package_dir')} ({profile.package} {version}), "
                            "so the diff cannot change it")
            misfits.append(fd.path)
        states[fd.path] = state
    return states, misfits


def version_note(profile, version: str | None) -> str | None:
    """None for a release the profile knows; else the one line that says so and how
    the path is judged instead (never the text "None"). A profile without the method
    knows only what `knows` says."""
    note = getattr(profile, "version_note", None)
    if note is not None:
        return note(version)
    if version and profile.knows(version):
        return None
    return (f"{profile.package} {version or '(the host does not say which version)'} is not in the engine profile: "
            "the path will be judged by the markers")


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}   # how messages name an engine (else its package name)


def refuse_other_engine(job: Job, host: Host) -> None:
    """A patch is for one engine: a host of another is refused before anything is written."""
    kind = (host.engine.kind or "sglang").strip().lower()
    want = str(getattr(job.patch, "engine", "") or "").strip().lower()
    if want and kind != want:
        raise HostFailure(Status.CONFLICT, f"{host.name}: {job.patch.name} is a patch for "
                                           f"{ENGINE_NAMES.get(want, want)}, but this host runs "
                                           f"{ENGINE_NAMES.get(kind, kind)} (engine.kind in the inventory); "
                                           "nothing was changed on this host")


def superseded_line(profile, patch, version: str) -> str | None:
    """What to use instead of `patch` on this engine version, when its manifest says upstream has it."""
    sup = getattr(patch, "superseded", None)
    if sup is None or not sup.admits(version):
        return None
    engine = ENGINE_NAMES.get(getattr(profile, "kind", ""), profile.package)
    release = getattr(profile, "release_of", lambda v: None)(version) or version   # 0.5.23+cu128 is 0.5.23
    return (f"superseded on {engine} {release} by {sup.use}: use that instead\n  (its manifest: upstream has "
            f"the change for {sup.spec_text})")


def make_plan(job: Job, host: Host, reply: dict) -> tuple[Plan, object]:
    refuse_other_engine(job, host)
    profile = get_profile(host.engine.kind)
    version = reply.get("version") or None
    if not version:
        raise HostFailure(Status.ERROR, f"{host.name}: {version_note(profile, None)}\n  {job.patch.name}: no "
                                        f"revision can be chosen without the version, so nothing was changed; check "
                                        f"that {host.engine.python} imports the {profile.package} whose dist-info "
                                        "holds its METADATA")
    superseded = superseded_line(profile, job.patch, version)
    if superseded:
        raise HostFailure(Status.SKIPPED, f"{host.name}: {job.patch.name} is {superseded}; nothing was changed "
                                          "on this host")
    try:
        revision = job.patch.choose(job.rev, version)
    except NoRevisionFits as e:
        raise HostFailure(Status.ERROR, f"{host.name}: {e}") from None
    label = f"{job.patch.name}@{revision.rev}"
    sibling = lone_sibling(host, profile, job.patch, revision, reply, version)
    if sibling:
        raise HostFailure(Status.ERROR, sibling)
    states, misfits = _file_states(job, profile, revision, reply, version)
    clash = clashes(states, reply, job.patch.name)
    session = session_env(reply)
    launch = running_launch(host, reply)
    if not launch.argv:
        # systemd/supervisor with the server down: nothing says how it will be launched,
        # so the pre-flight cannot predict; the log after the restart decides.
        return Plan(version, label, states, None, None, launch, misfits, revision=revision, clashes=clash,
                    session_env=session), revision
    prediction = profile.predict(version, launch)
    verdict = preflight_verdict(host, profile, revision, prediction, label)
    if verdict is not None:
        verdict.message += launch_note(host, profile, version, launch, prediction, session)
    elif launch.source == "process":
        verdict = restart_launch_verdict(host, profile, version, revision, session, prediction, label)
    return Plan(version, label, states, verdict, prediction, launch, misfits, revision=revision,
                clashes=clash, session_env=session), revision


def restart_launch_verdict(host: Host, profile, version: str, revision, session: dict, prediction, label: str):
    """For a running server (`prediction`, from its process): a `command` restart starts the server
    with the inventory's start and env (over `session`, the agent's SSH session's), not with what
    the running process was started with: where the two lead elsewhere, the patch must run (and
    the server start) under the inventory's too. A typo in hosts.yaml (an env value the engine
    cannot parse) is refused here, before a write and a restart it would leave the server down
    after, its rollback's restart included. On a host of several servers each one's settings are
    judged so (only the first server's process is read)."""
    for view in host.server_views():
        planned = restart_would_differ(view, profile, version, prediction, session)
        if planned is None:
            continue
        verdict = preflight_verdict(view, profile, revision, planned, label)
        if verdict is not None:
            verdict.message += (f"\n  (server {view.server_name}: launch configuration from the inventory's start and "
                                "env, which fleetpatch restarts it with)" if host.servers else
                                "\n  (launch configuration from the inventory's start and env, which fleetpatch "
                                "restarts the server with; the running server was started otherwise and runs "
                                f"{would_run(prediction, profile, why=False)})")
            return verdict
    return None


def restart_prediction(view: Host, profile, version: str, session: dict):
    """What a `command` restart of `view`'s server would run: the inventory's start, and its env
    over `session` (the agent's SSH session's). None where the restart is not fleetpatch's command
    (systemd, a supervisor)."""
    if view.server.restart.kind != "command":
        return None
    return profile.predict(version, inventory_launch(view, session))


def restart_would_differ(view: Host, profile, version: str, prediction, session: dict):
    """restart_prediction, where it differs from `prediction` (the running server's): another path,
    or no start. None where they agree, or where the restart is not fleetpatch's command."""
    planned = restart_prediction(view, profile, version, session)
    if planned is None or (planned.path, planned.starts) == (prediction.path, prediction.starts):
        return None
    return planned


def would_run(prediction, profile, why: bool = True) -> str:
    """'EAGLEWorkerV2', 'no speculative worker', or 'nothing' (with `why`: 'nothing: <the error>')."""
    if prediction.starts:
        return prediction.path or f"no {profile.path_noun}"
    return f"nothing: {prediction.error}" if why else "nothing"


def restart_change(view: Host, profile, version: str | None, probe_reply: dict):
    """(what the running server runs, what a restart with the inventory's start and env would run),
    where the two differ (another path, or no start); None where they agree, where the server is
    not running, or where the engine's version is not known."""
    if not version or not profile.knows(version):
        return None
    launch = running_launch(view, probe_reply)
    if launch.source != "process":
        return None
    running = profile.predict(version, launch)
    planned = restart_would_differ(view, profile, version, running, session_env(probe_reply))
    return None if planned is None else (running, planned)


def restart_hazard(view: Host, profile, version: str | None, probe_reply: dict) -> str | None:
    """For status and check-patch: the running server runs one path and a restart with the
    inventory's start and env (what fleetpatch restarts it with) would run another, or not start:
    the next deploy or rollback would then leave a patch on the running path unexecuted, or the
    server down."""
    change = restart_change(view, profile, version, probe_reply)
    if change is None:
        return None
    running, planned = change
    now = would_run(running, profile, why=False)
    where = "the inventory's start and env, which fleetpatch restarts it with"
    said = (f"a restart would run {would_run(planned, profile)}, not {now} as now: in {where}, {planned.cause}"
            if planned.starts else
            f"a restart would not start the server, which now runs {now}: with {where}, it would stop with "
            f"\"{planned.error}\"")
    return said + "; bring hosts.yaml and the running server in line before the next deploy or rollback"


def restart_switched(host: Host, profile, version: str | None, probe_reply: dict, ran: str | None) -> str | None:
    """For deploy-patch: its restart, with the inventory's start and env, moved the server to another
    path than it ran before (the patch changes both, so the pre-flight let it through): said, so a
    switch of the fleet's code path is never silent. Only where the verdict's path (`ran`) is the
    one predicted: the log, not the prediction, says what ran."""
    change = restart_change(host, profile, version, probe_reply)
    if change is None or not change[1].starts or change[1].path != ran:
        return None
    running, planned = change
    return (f"the restart moved the server from {would_run(running, profile)} to "
            f"{would_run(planned, profile)}: in the inventory's start and env, which fleetpatch restarted it with, "
            f"{planned.cause}; the server had been started otherwise")


def restart_predictions(host: Host, profile, version: str, session: dict) -> list:
    """(server, what its restart would run) for each server of the host that a `command` restart
    starts with the inventory's start and env (over `session`, the agent's SSH session's): the
    host's one server, or each of `servers:`."""
    return [(view, planned) for view in host.server_views()
            if (planned := restart_prediction(view, profile, version, session)) is not None]


def launch_note(host: Host, profile, version: str, launch: LaunchConfig, prediction, session: dict) -> str:
    """Say whose launch configuration the prediction read, and when the inventory
    (which a `command` restart will use) disagrees with the running process."""
    if launch.source != "process":
        return "\n  (launch configuration from the inventory's start and env: the server is not running)"
    note = "\n  (launch configuration read from the running server's /proc cmdline and environ)"
    planned = restart_would_differ(host, profile, version, prediction, session)
    if planned is not None:
        note += (f"\n  note: the inventory's start and env would run {would_run(planned, profile)} "
                 f"({planned.cause}); fleetpatch restarts with the inventory's settings, so bring hosts.yaml and the "
                 "running server in line, or rerun with --force")
    return note


def preflight_verdict(host, profile, revision, prediction, label) -> evidence.Verdict | None:
    """Fails a host whose running configuration routes around every patched file."""
    if not getattr(prediction, "known_version", True):
        return None  # said in the plan's message; the log decides
    changed_paths = set()
    for fd in revision.files:
        # the classes the file defines in the host's release (a class may move between files)
        changed_paths.update(profile.paths_of_file(fd.path, prediction_version(prediction) or None))
    if not changed_paths:
        return None  # patches no path-bearing file: nothing to route around
    # Code in a base class's file runs on its subclasses too (StandaloneWorker is an EAGLEWorker).
    running = [prediction.path] + profile.ancestors(prediction.path, prediction_version(prediction))
    if prediction.starts and changed_paths.intersection(running):
        return None
    if prediction.starts:
        runs = prediction.path or "no speculative worker"
        where = f" ({prediction.file})" if prediction.file else ""
        need = profile.file_of_path(prediction.path, prediction_version(prediction)) if prediction.path else None
        text = (f"FAIL {host.name}  {label} would never execute (pre-flight)\n"
                f"  the server will run {runs}{where}\n"
                f"    cause: {prediction.cause}\n"
                f"  {label} changes only {', '.join(sorted(changed_paths))}"
                + (f"; it would need a change in {need} too (with the probe off, a marker there)" if need else "")
                + "\n  nothing was written; fix the launch configuration or the patch, or rerun with --force")
    else:
        # the profile's cause ends as the line above begins: said once
        cause = prediction.cause.removesuffix(": the server would not start")
        text = (f"FAIL {host.name}  {label} would never execute (pre-flight)\n"
                f"  the server would not start: {prediction.error}\n"
                f"    cause: {cause}\n"
                "  nothing was written; fix the launch configuration, or rerun with --force")
    from .. import evidence
    return evidence.Verdict(status=Status.NOT_EXECUTED, final=True, executed_path=prediction.path, evidence=[],
                            cause=prediction.cause, markers_seen=[], missing=[], message=text)


def prediction_version(prediction) -> str:
    return getattr(prediction, "version", "") or ""


def describe_states(plan: Plan) -> str:
    parts = []
    for path, r in sorted(plan.states.items()):
        if r.state == "applies":
            moved = [o for o in r.offsets if o]
            parts.append(f"{path}: applies" + (f" (offsets {', '.join(f'{o:+d}' for o in r.offsets)})" if moved else ""))
        elif r.state == "creates":
            parts.append(f"{path}: will create {path} ({len(r.new)} bytes)")
        elif r.state == "deletes":
            parts.append(f"{path}: will delete {path}")
        elif r.state == "already-applied":
            parts.append(f"{path}: already applied")
        else:
            parts.append(f"{path}: conflict: {r.detail}")
    return "\n".join("  " + p for p in parts)


def clashes(states: dict, reply: dict, name: str) -> dict[str, str]:
    """path -> the other patch (name@rev) of each file that `states` cannot apply to because it
    holds what another fleetpatch patch wrote there: its bytes are the `after` sha256 that
    patch's ledger entry records (None: a file it deleted). Pure: the probe reply judged."""
    out: dict[str, str] = {}
    files = reply.get("files") or {}
    for path, state in states.items():
        if state.state in CHANGE_STATES or state.state == "already-applied":
            continue
        now = (files.get(path) or {}).get("sha256")
        for other, entry in sorted((reply.get("ledger") or {}).get("patches", {}).items(),
                                   key=lambda kv: -int(kv[1].get("seq") or 0)):   # the latest writer first
            rec = (entry.get("files") or {}).get(path)
            if other != name and rec is not None and "after" in rec and rec["after"] == now:
                out[path] = entry.get("label") or f"{other}@{entry.get('rev')}"
                break
    return out


def clash_message(host: str, label: str, clash: dict[str, str], inventory: str | None, refused: str = "") -> str:
    """check-patch's and deploy-patch's one wording for a patch whose files another patch holds
    (`refused`: what deploy-patch did instead, said first)."""
    import shlex
    where = f" --inventory {shlex.quote(str(inventory))}" if inventory else ""
    name = label.rsplit("@", 1)[0]
    lines = [f"{host}: {refused}{label} clashes with "
             f"{', '.join(sorted(set(clash.values())))}, which fleetpatch deployed on this host"]
    lines += [f"  {path}: holds what {other} wrote (the sha256 its ledger records), not {label}'s pre-image"
              for path, other in sorted(clash.items())]
    lines.append(f"  to stack {name} on it: write {name}'s diff against the host's current files "
                 f"(fetch them first: fleetpatch fetch --hosts {host}{where})")
    lines += [f"  or roll {other} back first: fleetpatch rollback --patch {other.rsplit('@', 1)[0]} "
              f"--hosts {host}{where}" for other in sorted(set(clash.values()))]
    return "\n".join(lines)


@dataclass
class Proof:
    """Whether a deploy could prove its result on one host, and how (or what is missing)."""

    ok: bool
    how: str


def can_prove(run: HostRun, plan: Plan) -> Proof:
    """Whether deploying `plan` could prove that the patched code ran on this host.

    A release the profile knows: its routing says which path runs, and the pre-flight
    judged the patch against it. A release it does not know is never guessed: the
    result must be provable from what runs. The proofs, in order: the execution probe
    (`probe_proves`, the hook its wiring fills in), then a marker for every code path
    that the patch changes (the marker that appears names the path that ran)."""
    profile = run.profile
    if profile.knows(plan.version):
        return Proof(True, "")
    by_probe = probe_proves(run, plan)
    if by_probe is not None:
        return by_probe
    return markers_prove(profile, run.job.patch, plan)


def probe_proves(run: HostRun, plan: Plan) -> Proof | None:
    """The execution probe's proof (None: it cannot prove here): the probe goes into this
    host's server (not --no-probe, not engine.probe: false, not the patch's `executed: off`),
    and the verdict then needs an added line of this revision to run there."""
    from .execution import probe_wanted   # execution needs the plan's types: imported late
    if not probe_wanted(run.job, run.host, run.job.patch):
        return None
    return Proof(True, "by the probe: a line this revision adds must run in the restarted server")


def markers_prove(profile, patch, plan: Plan) -> Proof:
    changed: dict[str, str] = {}   # code path -> the file of the patch that it runs from
    for fd in getattr(plan.revision, "files", None) or []:
        if fd.op == diffapply.DELETE:
            continue   # deleted code logs nothing (the patch rule's reading too)
        for path in profile.paths_of_file(fd.path):
            changed.setdefault(path, fd.path)
    markers = dict(getattr(patch, "markers", None) or {})
    if not changed:
        files = ", ".join(sorted(plan.states)) or "no file"
        return Proof(False, f"{plan.label} changes no file that a {profile.short_noun()} runs from ({files}), so "
                            "no marker can show which path ran")
    missing = [f"{path} ({file})" for path, file in changed.items() if path not in markers]
    if missing:
        return Proof(False, f"{plan.label} has no marker for {', '.join(missing)}, which it changes")
    return Proof(True, f"by the marker of the path that runs (markers for {', '.join(changed)})")


def unprovable_message(run: HostRun, plan: Plan, proof: Proof, doing: str) -> str:
    """A refusal: the release is not known and nothing proves the result. `doing`: what is refused."""
    note = version_note(run.profile, plan.version)
    add = getattr(run.profile, "add_release_command", None)
    fix = (f"add the release to the profile (a fleetpatch maintainer runs `{add(plan.version)}`)"
           if add else "add the release to the engine profile")
    return (f"FAIL {run.name}  {plan.label} {doing}: its result could not be proven\n"
            f"  {note}\n  {proof.how}\n"
            f"  nothing was written; {fix}, or give the patch a marker for every code path it changes")


@host_step
def check_patch(run: HostRun) -> HostResult:
    job, host = run.job, run.host
    run.progress("fetch")
    reply = probe(run.remote, host, job, revision_files(job), content=True, lock=False)
    plan, _ = make_plan(job, host, reply)
    run.version = plan.version
    detail = describe_states(plan)
    base = dict(engine_version=plan.version, patch=plan.label, details={"files_state": {
        p: {"state": r.state, "offsets": r.offsets, "detail": r.detail} for p, r in plan.states.items()}})
    if plan.clashes:
        return HostResult(host.name, False, Status.CONFLICT,
                          clash_message(host.name, plan.label, plan.clashes, job.inventory_arg) + "\n" + detail,
                          **base)
    if plan.conflicts:
        note = version_note(run.profile, plan.version)
        return HostResult(host.name, False, Status.CONFLICT, f"{host.name}: {plan.label} does not apply\n{detail}"
                          + (f"\n  {note}" if note else ""), **base)
    proof = can_prove(run, plan)
    if not proof.ok and not plan.already:
        base["details"]["refused"] = "unprovable"
        return HostResult(host.name, False, Status.ERROR,
                          unprovable_message(run, plan, proof, "would be refused by deploy-patch") + "\n" + detail,
                          **base)
    if plan.preflight is not None and not job.force:
        return HostResult(host.name, False, Status.NOT_EXECUTED, plan.preflight.message + "\n" + detail,
                          executed_path=plan.preflight.executed_path, **base)
    status = Status.ALREADY_APPLIED if plan.already else Status.APPLIES
    # the patch passes under both launches, but deploy-patch's restart would change what runs
    hazard = None if host.servers else restart_hazard(host, run.profile, plan.version, reply)
    return HostResult(host.name, True, status, f"{host.name}: {plan.label} {status}\n{detail}"
                      f"{runs_note(run.profile, plan, proof)}" + (f"\n  note: {hazard}" if hazard else ""), **base,
                      executed_path=getattr(plan.prediction, "path", None))


def runs_note(profile, plan: Plan, proof: Proof) -> str:
    """check-patch's last line: which path the server runs, or why that is not predicted and how it is proven."""
    note = version_note(profile, plan.version)
    if note is not None:
        return f"\n  {note}" + (f"\n  deploy-patch will prove it {proof.how}" if proof.how else "")
    pred = plan.prediction
    if pred is None:
        return ""
    if not pred.starts:
        return f"\n  the server would not start ({plan.launch.source} launch config): {pred.error or pred.cause}"
    runs = pred.path or f"no {profile.path_noun}"
    return f"\n  the server runs {runs} ({plan.launch.source} launch config): {pred.cause}"
