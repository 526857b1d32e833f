"""Per-host operations: the remote seam plus the pure parts, composed.

Each public function takes a `Job` (what the operator asked for) and one
host, and returns a `HostResult`; none raises for a host's failure. The round
trips of a deploy: probe+lock, apply+restart, follow+record+unlock.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import shlex
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from . import diffapply, evidence, hostagent
from .engines import get as get_profile
from .engines.sglang import LaunchConfig
from .inventory import Host
from .patchset import NoRevisionFits, Patch
from .remote import HostFailure, Remote


@dataclass
class HostResult:
    host: str
    ok: bool
    status: str
    message: str = ""
    engine_version: str | None = None
    patch: str | None = None
    executed_path: str | None = None
    markers: list = field(default_factory=list)
    duration_s: float = 0.0
    round_trips: int = 0
    files: dict | None = None
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {"ok": self.ok, "status": self.status, "message": self.message,
               "engine_version": self.engine_version, "patch": self.patch,
               "executed_path": self.executed_path, "markers": self.markers,
               "duration_s": round(self.duration_s, 3), "round_trips": self.round_trips}
        if self.files is not None:
            out["files"] = self.files
        out.update(self.details)
        return out


Progress = Callable[[str, str, str], None]


@dataclass
class Job:
    """What the operator asked for, shared by every host of one command."""

    hosts_by_name: dict
    patch: Patch | None = None
    rev: int | None = None
    timeout: float | None = None
    no_restart: bool = False
    on_failure: str = "keep"
    force: bool = False
    break_lock: bool = False
    accept_new_host_keys: bool = False
    dest: Path = Path(".fleetpatch/sources")
    progress: Progress = lambda host, phase, detail="": None
    holder: str = field(default_factory=lambda: f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}")
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    patch_dirs: list = field(default_factory=list)
    settle_s: float = 2.0


# How long a decided failure waits for the rest of the server's last words
# (the agent reports every 50 ms; a dying process's traceback lands within that).
FAILURE_GRACE_S = 0.5


# ----------------------------------------------------------------- helpers

def agent_restart(host: Host) -> dict:
    """The restart settings as the agent needs them, start already split:
    the operator's command line is tokenised here, never passed to a shell."""
    r = host.server.restart
    out = {"kind": r.kind, "env": dict(r.env or {}), "workdir": r.workdir, "pidfile": r.pidfile,
           "stop_grace": r.stop_grace, "unit": r.unit, "program": r.program, "config": r.config}
    if r.kind == "command":
        out["argv"] = [tok.replace("{python}", host.engine.python) for tok in shlex.split(r.start)]
    return out


def inventory_launch(host: Host) -> LaunchConfig:
    r = host.server.restart
    argv = [tok.replace("{python}", host.engine.python) for tok in shlex.split(r.start or "")]
    return LaunchConfig(argv=argv, env=dict(r.env or {}), source="inventory")


def running_launch(host: Host, probe: dict) -> LaunchConfig:
    server = probe.get("server") or {}
    if server.get("alive") and server.get("argv"):
        return LaunchConfig(argv=server["argv"], env=server.get("env") or {}, source="process")
    return inventory_launch(host)


def base_request(host: Host, job: Job) -> dict:
    return {"state_dir": host.engine.state_dir, "package": get_profile(host.engine.kind).package,
            "log": host.server.log, "restart": agent_restart(host), "health_url": host.server.health_url,
            "lock_token": job.token}


def server_info_url(health_url: str | None) -> str | None:
    if not health_url:
        return None
    parts = urlsplit(health_url)
    return urlunsplit((parts.scheme, parts.netloc, "/server_info", "", ""))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def probe(remote: Remote, host: Host, job: Job, files: list[str], content: bool, lock: bool) -> dict:
    req = dict(base_request(host, job), files=files, content=content)
    if lock:
        req["lock"] = {"token": job.token, "holder": job.holder, "break": job.break_lock}
    return remote.call("probe", req)


def unlock(remote: Remote, host: Host, job: Job, ledger_update: dict | None = None) -> None:
    try:
        remote.call("unlock", dict(base_request(host, job), ledger_update=ledger_update))
    except HostFailure:
        pass  # the run's own failure is what the operator needs to see


def load_named(job: Job, name: str) -> Patch:
    """A patch the host's ledger names, from the same patch directories."""
    from .engines import sglang
    from .patchset import PatchError, load_patch
    try:
        return load_patch(name, job.patch_dirs, sglang.PROFILE)[0]
    except PatchError as e:
        raise HostFailure("error", f"the host records {name} as applied, but it cannot be loaded here: {e}") from None


def file_bytes(probe_reply: dict, path: str) -> bytes | None:
    rec = (probe_reply.get("files") or {}).get(path)
    if rec is None:
        return None
    return hostagent.unpack(rec["content"])


def host_step(fn):
    """Time a host operation, open/close its connection, turn failures into results."""

    def run(job: Job, host: Host) -> HostResult:
        started = time.monotonic()
        remote = Remote(host, hosts_by_name=job.hosts_by_name, accept_new_host_keys=job.accept_new_host_keys)
        try:
            job.progress(host.name, "connect", "")
            remote.open()
            result = fn(job, host, remote)
        except HostFailure as f:
            result = HostResult(host.name, False, f.status, f.message)
        except Exception as e:  # a bug must not take the other hosts down with it
            result = HostResult(host.name, False, "error", f"{host.name}: {type(e).__name__}: {e}")
        finally:
            remote.close()
        result.duration_s = time.monotonic() - started
        result.round_trips = remote.round_trips
        job.progress(host.name, "done", result.status)
        return result

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


# ----------------------------------------------------------------- fetch

@host_step
def fetch(job: Job, host: Host, remote: Remote) -> HostResult:
    profile = get_profile(host.engine.kind)
    job.progress(host.name, "fetch", "")
    reply = probe(remote, host, job, profile.fetch_files(None), content=True, lock=False)
    version = reply.get("version")
    wanted = profile.fetch_files(version)
    dest = Path(job.dest) / host.name
    files = {}
    for path in wanted:
        data = file_bytes(reply, path)
        if data is None:
            continue
        if sha256(data) != reply["files"][path]["sha256"]:
            raise HostFailure("error", f"{host.name}: {path} arrived damaged (sha256 differs from the host's); "
                                       "nothing was written locally for it; rerun fetch")
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files[path] = sha256(data)
    missing = [p for p in wanted if p not in files]
    meta = {"host": host.name, "engine": profile.kind, "version": version,
            "package_dir": reply.get("package_dir"), "python": host.engine.python, "files": files,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "fetch.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    msg = f"{len(files)} files to {dest}"
    if missing:
        msg += f" ({len(missing)} not present on the host: {', '.join(missing)})"
    return HostResult(host.name, True, "fetched", msg, engine_version=version, files=files)


# ----------------------------------------------------------- check / plan

@dataclass
class Plan:
    """What applying one revision to one host would do; computed, not done."""

    version: str | None
    label: str
    states: dict            # path -> FileResult
    preflight: evidence.Verdict | None
    prediction: object | None
    launch: LaunchConfig

    @property
    def changes(self):
        return [r for r in self.states.values() if r.state == "applies"]

    @property
    def conflicts(self):
        return [r for r in self.states.values() if r.state == "conflict"]

    @property
    def already(self) -> bool:
        return all(r.state == "already-applied" for r in self.states.values())


def make_plan(job: Job, host: Host, reply: dict) -> tuple[Plan, object]:
    profile = get_profile(host.engine.kind)
    version = reply.get("version")
    if not version:
        raise HostFailure("error", f"{host.name}: cannot read the {profile.package} version with "
                                   f"{host.engine.python} (importlib.metadata found no distribution)")
    try:
        revision = job.patch.choose(job.rev, version)
    except NoRevisionFits as e:
        raise HostFailure("error", f"{host.name}: {e}") from None
    label = f"{job.patch.name}@{revision.rev}"
    states = {}
    for fd in revision.files:
        original = file_bytes(reply, fd.path)
        if original is None:
            raise HostFailure("conflict", f"{host.name}: {label} changes {fd.path}, which does not exist in "
                                          f"{reply.get('package_dir')} (sglang {version})")
        states[fd.path] = diffapply.apply_file(fd, original)
    launch = running_launch(host, reply)
    if not launch.argv:
        # systemd/supervisor with the server down: nothing says how it will be launched,
        # so the pre-flight cannot predict; the log after the restart decides.
        return Plan(version, label, states, None, None, launch), revision
    prediction = profile.predict(version, launch)
    verdict = preflight_verdict(job, host, profile, revision, prediction, label)
    if verdict is not None:
        verdict.message += launch_note(host, profile, version, launch, prediction)
    return Plan(version, label, states, verdict, prediction, launch), revision


def launch_note(host: Host, profile, version: str, launch: LaunchConfig, prediction) -> str:
    """Say whose launch configuration the prediction read, and when the inventory
    (which a `command` restart will use) disagrees with the running process."""
    if launch.source != "process":
        return "\n  (launch configuration from the inventory's start and env: the server is not running)"
    note = "\n  (launch configuration read from the running server's /proc cmdline and environ)"
    if host.server.restart.kind == "command":
        planned = profile.predict(version, inventory_launch(host))
        if (planned.path, planned.starts) != (prediction.path, prediction.starts):
            what = planned.path if planned.starts else f"nothing: {planned.error}"
            note += (f"\n  note: the inventory's start and env would run {what} ({planned.cause}); "
                     "fleetpatch restarts with the inventory's settings, so bring hosts.yaml and the running "
                     "server in line, or rerun with --force")
    return note


def preflight_verdict(job, host, profile, revision, prediction, label) -> evidence.Verdict | None:
    """Fails a host whose running configuration routes around every patched file."""
    if not getattr(prediction, "known_version", True):
        return None  # said in the plan's message; the log decides
    changed_paths = set()
    for fd in revision.files:
        changed_paths.update(profile.paths_of_file(fd.path))
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
                + (f"; it would need a change and a marker in {need}" if need else "")
                + "\n  nothing was written; fix the launch configuration or the patch, or rerun with --force")
    else:
        text = (f"FAIL {host.name}  {label} would never execute (pre-flight)\n"
                f"  the server would not start: {prediction.error}\n"
                f"    cause: {prediction.cause}\n"
                "  nothing was written; fix the launch configuration, or rerun with --force")
    return evidence.Verdict(status="not-executed", final=True, executed_path=prediction.path, evidence=[],
                            cause=prediction.cause, markers_seen=[], missing=[], message=text)


def prediction_version(prediction) -> str:
    return getattr(prediction, "version", "") or ""


def describe_states(plan: Plan) -> str:
    parts = []
    for path, r in sorted(plan.states.items()):
        if r.state == "applies":
            moved = [o for o in r.offsets if o]
            parts.append(f"{path}: applies" + (f" (offsets {', '.join(f'{o:+d}' for o in r.offsets)})" if moved else ""))
        elif r.state == "already-applied":
            parts.append(f"{path}: already applied")
        else:
            parts.append(f"{path}: conflict: {r.detail}")
    return "\n".join("  " + p for p in parts)


@host_step
def check_patch(job: Job, host: Host, remote: Remote) -> HostResult:
    job.progress(host.name, "fetch", "")
    reply = probe(remote, host, job, revision_files(job), content=True, lock=False)
    plan, _ = make_plan(job, host, reply)
    detail = describe_states(plan)
    base = dict(engine_version=plan.version, patch=plan.label, details={"files_state": {
        p: {"state": r.state, "offsets": r.offsets, "detail": r.detail} for p, r in plan.states.items()}})
    if plan.conflicts:
        return HostResult(host.name, False, "conflict", f"{host.name}: {plan.label} does not apply\n{detail}", **base)
    if plan.preflight is not None and not job.force:
        return HostResult(host.name, False, "not-executed", plan.preflight.message + "\n" + detail,
                          executed_path=plan.preflight.executed_path, **base)
    status = "already-applied" if plan.already else "applies"
    note = ""
    if plan.prediction is not None:
        note = f"\n  the server runs {plan.prediction.path} ({plan.launch.source} launch config): {plan.prediction.cause}"
    return HostResult(host.name, True, status, f"{host.name}: {plan.label} {status}\n{detail}{note}", **base,
                      executed_path=getattr(plan.prediction, "path", None))


def revision_files(job: Job) -> list[str]:
    """Every file any revision touches: one probe serves whichever revision the host's version picks."""
    paths = []
    for rev in job.patch.revisions:
        for fd in rev.files:
            if fd.path not in paths:
                paths.append(fd.path)
    return paths


# ---------------------------------------------------------------- verify

def follow_and_judge(remote: Remote, host: Host, job: Job, *, start: dict, version: str,
                     launch: LaunchConfig, patches: list[Patch], labels: list[str], want_markers: bool,
                     timeout: float, keep_lock_on_failure: bool = False) -> tuple[list[evidence.Verdict], dict]:
    """Stream the log from `start` (inode, offset, pid) and judge as lines arrive.
    The decision goes back on the same channel with the ledger update and the
    unlock, so verification costs one round trip."""
    profile = get_profile(host.engine.kind)
    ready_line = getattr(profile, "ready_line", "The server is fired up and ready to roll!")
    req = dict(base_request(host, job), inode=start.get("inode"), offset=start.get("offset", 0),
               pid=start.get("pid"), timeout=timeout, ready_line=ready_line,
               server_info_url=server_info_url(host.server.health_url))
    lines: list[str] = []
    first_line_no = [None]
    state = {"alive": None, "healthy": None, "server_info": None, "ready_at": None}
    t0 = time.monotonic()
    launch_now = [launch]
    failed_at = [0.0]
    arrived: list[float] = []  # when each log line reached the laptop
    verdicts: list[evidence.Verdict] = []
    timings = {}

    def judge_all(timed_out: bool) -> list[evidence.Verdict]:
        now = time.monotonic()
        obs = evidence.Observation(
            lines=list(lines), first_line_no=first_line_no[0] or 1, server_info=state["server_info"],
            alive=state["alive"], healthy=state["healthy"],
            since_ready_s=None if state["ready_at"] is None else now - state["ready_at"], timed_out=timed_out)
        return [evidence.judge(obs, profile, version, launch_now[0], p.markers, p.expect, p.forbid, label, host.name,
                               want_markers=want_markers, settle_s=job.settle_s)
                for p, label in zip(patches, labels)]

    def on_event(ev: dict) -> str | None:
        kind = ev.get("t")
        if kind == "lines":
            if first_line_no[0] is None:
                first_line_no[0] = ev["first_line_no"]
            lines.extend(ev["lines"])
            arrived.extend([time.monotonic()] * len(ev["lines"]))
            if state["ready_at"] is None and any(ready_line in l for l in ev["lines"]):
                state["ready_at"] = time.monotonic()
        elif kind == "state":
            state["alive"], state["healthy"] = ev.get("alive"), ev.get("healthy")
        elif kind == "server_info":
            state["server_info"] = ev.get("data")
        elif kind == "launch" and ev.get("argv"):
            launch_now[0] = LaunchConfig(argv=ev["argv"], env=ev.get("env") or {}, source="process")
        elapsed = time.monotonic() - t0
        timed_out = elapsed >= timeout or kind == "deadline"
        vs = judge_all(timed_out)
        waiting = [v for v in vs if not v.final]
        job.progress(host.name, "verify", f"{elapsed:4.1f}s " + (
            "waiting for " + ", ".join(v.missing[0] if v.missing else "the server" for v in waiting) if waiting
            else "decided"))
        if waiting:  # a host in flight always finishes its verdict, Ctrl-C or not
            return None
        if any(v.status == "restart-failed" for v in vs) and state["alive"] is not False and not timed_out:
            # The failure is decided, but the rest of the traceback (the error itself) is
            # still being written: let the process die or a moment pass, so the message shows it.
            failed_at[0] = failed_at[0] or time.monotonic()
            if time.monotonic() - failed_at[0] < FAILURE_GRACE_S:
                return None
        verdicts[:] = vs
        timings["verdict_after_s"] = round(elapsed, 3)
        seen = [m["line_no"] for v in vs for m in v.markers_seen if m.get("line_no")]
        if seen and first_line_no[0] is not None:
            idx = min(seen) - first_line_no[0]
            if 0 <= idx < len(arrived):
                # from the marker line reaching us (the agent polls every 50 ms) to the verdict
                timings["marker_to_verdict_s"] = round(time.monotonic() - arrived[idx], 3)
        update = {"verification": {}, "last_verification": {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "status": "verified" if all(v.status in ("verified", "rolled-back") for v in vs) else vs[0].status,
            "labels": labels}}
        if want_markers:
            for p, v in zip(patches, vs):
                update["verification"][p.name] = {"status": v.status, "executed_path": v.executed_path,
                                                  "at": update["last_verification"]["at"]}
        failed = any(v.status not in ("verified", "rolled-back") for v in vs)
        # A rollback that follows keeps the lock, so no other run can slip in between.
        return json.dumps({"ledger_update": update, "unlock": not (failed and keep_lock_on_failure)})

    remote.stream("follow", req, on_event, timeout=timeout)
    if not verdicts:  # the stream ended before a decision (server host went away)
        verdicts[:] = judge_all(True)
        unlock(remote, host, job)
    return verdicts, timings


def verdict_result(host: Host, version: str, verdicts: list[evidence.Verdict], labels: list[str],
                   timings: dict) -> HostResult:
    bad = [v for v in verdicts if v.status not in ("verified", "rolled-back")]
    main = bad[0] if bad else verdicts[0]
    markers = [m for v in verdicts for m in v.markers_seen]
    message = "\n".join(v.message for v in (bad or verdicts))
    return HostResult(host.name, not bad, main.status, message, engine_version=version,
                      patch=",".join(labels), executed_path=main.executed_path, markers=markers,
                      details={"cause": main.cause, "evidence": [e.__dict__ for e in main.evidence], **timings})


# ---------------------------------------------------------------- deploy

@host_step
def deploy(job: Job, host: Host, remote: Remote) -> HostResult:
    job.progress(host.name, "fetch", "lock + read files")
    reply = probe(remote, host, job, revision_files(job), content=True, lock=True)
    try:
        return _deploy_locked(job, host, remote, reply)
    except HostFailure:
        unlock(remote, host, job)
        raise


def _deploy_locked(job: Job, host: Host, remote: Remote, reply: dict) -> HostResult:
    job.progress(host.name, "pre-flight", "")
    plan, revision = make_plan(job, host, reply)
    version, label = plan.version, plan.label
    ledger = reply.get("ledger") or {}
    if plan.conflicts or (not plan.already and len(plan.changes) != len(plan.states)):
        unlock(remote, host, job)
        return HostResult(host.name, False, "drift",
                          f"{host.name}: refused, left untouched and not restarted: the files match neither "
                          f"{label}'s pre-image nor its post-image\n{describe_states(plan)}\n"
                          "  inspect the hand edits (fleetpatch fetch), restore the originals, then rerun",
                          engine_version=version, patch=label)
    if plan.preflight is not None and not job.force:
        unlock(remote, host, job)
        return HostResult(host.name, False, "not-executed", plan.preflight.message, engine_version=version,
                          patch=label, executed_path=plan.preflight.executed_path)
    req = base_request(host, job)
    if plan.already:
        if not ledger.get("restart_pending") or job.no_restart:
            # Nothing to write: prove it still runs from the window of the last restart.
            last = ledger.get("last_restart")
            if job.no_restart or not last:
                unlock(remote, host, job)
                return HostResult(host.name, True, "already-applied",
                                  f"{host.name}: {label} already applied; nothing changed", engine_version=version,
                                  patch=label)
            return _verify(job, host, remote, version, plan.launch, [job.patch], [label], last,
                           already=True)
        job.progress(host.name, "restart", "restart pending from an earlier run")
        return _restart_and_verify(job, host, remote, plan, "restart",
                                   dict(req, reason=f"pending restart for {label}"))
    job.progress(host.name, "apply", f"{len(plan.changes)} files")
    files = [{"path": r.path, "before": sha256(file_bytes(reply, r.path)), "after": sha256(r.new),
              "content": hostagent.pack(r.new)} for r in plan.changes]
    apply_req = dict(req, package_dir=reply["package_dir"], name=job.patch.name, rev=revision.rev, label=label,
                     diff_sha256=revision.diff_sha256, files=files, unlock_on_error=True)  # a restart resets this
    if job.no_restart:
        apply_req["restart"] = None
        apply_req["unlock_after"] = True
        remote.call("apply", apply_req)
        return HostResult(host.name, True, "applied",
                          f"{host.name}: {label} applied; restart pending (--no-restart): the next deploy or "
                          "`fleetpatch verify-logs` after a restart proves it", engine_version=version, patch=label)
    job.progress(host.name, "restart", "")
    return _restart_and_verify(job, host, remote, plan, "apply", apply_req)


def _restart_and_verify(job: Job, host: Host, remote: Remote, plan: Plan, op: str, request: dict) -> HostResult:
    """Run the agent operation that restarts (apply+restart, or a pending restart),
    verify, and with --on-failure rollback undo a host that failed either way."""
    rollback = job.on_failure == "rollback"
    # With a rollback to follow, the lock is held throughout; deploy() releases it on other errors.
    request = dict(request, unlock_on_error=not rollback)
    try:
        out = remote.call(op, request)
    except HostFailure as f:
        if f.status != "restart-failed":
            raise
        # The files are written (the ledger says so, restart pending) but the server did not start.
        failed = HostResult(host.name, False, "restart-failed", f.message, engine_version=plan.version,
                            patch=plan.label)
        if rollback:
            return _rollback_after_failure(job, host, remote, failed)
        failed.message += "\n  the files are written and a restart is pending; fix the start, then rerun or roll back"
        return failed
    result = _verify(job, host, remote, plan.version, launch_after_restart(host, plan), [job.patch], [plan.label],
                     restart_start(out), keep_lock_on_failure=rollback)
    if not result.ok and rollback:
        result = _rollback_after_failure(job, host, remote, result)
    return result


def launch_after_restart(host: Host, plan: Plan) -> LaunchConfig:
    """Until the new process can be read from /proc (it may die first), the best
    account of it is what fleetpatch started: the inventory's command, or for
    systemd/supervisor the unit, which the old process reflects."""
    return inventory_launch(host) if host.server.restart.kind == "command" else plan.launch


def restart_start(reply: dict) -> dict:
    r = reply["restart"]
    return {"inode": r.get("log_inode"), "offset": r.get("log_offset", 0), "pid": r.get("pid")}


def _verify(job, host, remote, version, launch, patches, labels, start, already=False,
            keep_lock_on_failure=False) -> HostResult:
    timeout = job.timeout if job.timeout is not None else float(host.server.ready_timeout)
    job.progress(host.name, "verify", "waiting for markers")
    # After a restart the running process is the one to read, not what it was before.
    verdicts, timings = follow_and_judge(remote, host, job, start=start, version=version, launch=launch,
                                         patches=patches, labels=labels, want_markers=True, timeout=timeout,
                                         keep_lock_on_failure=keep_lock_on_failure)
    result = verdict_result(host, version, verdicts, labels, timings)
    if already and result.ok:
        result.status = "already-applied"
        result.message = f"{host.name}: {labels[0]} already applied; nothing changed; still verified\n" + result.message
    return result


def _rollback_after_failure(job, host, remote, failed: HostResult) -> HostResult:
    job.progress(host.name, "rollback", failed.status)
    try:
        reply = probe(remote, host, job, [], content=False, lock=True)
        rb = _rollback_locked(job, host, remote, reply, job.patch.name)
    except HostFailure as f:
        failed.message += f"\n  rollback FAILED: {f.message}"
        failed.details["rollback"] = {"status": f.status, "message": f.message}
        return failed
    failed.details["rollback"] = {"status": rb.status, "ok": rb.ok, "message": rb.message}
    if rb.ok:
        failed.status = "rolled-back"
        failed.message += "\n  rolled back: originals restored byte for byte, server restarted without the patch"
    else:
        failed.message += f"\n  rollback did not verify: {rb.message}"
    failed.ok = False
    return failed


# -------------------------------------------------------------- rollback

@host_step
def rollback(job: Job, host: Host, remote: Remote) -> HostResult:
    job.progress(host.name, "fetch", "lock + read ledger")
    reply = probe(remote, host, job, [], content=False, lock=True)
    ledger = reply.get("ledger") or {}
    names = [job.patch.name] if job.patch else sorted(ledger.get("patches", {}))
    if not names:
        unlock(remote, host, job)
        return HostResult(host.name, True, "ok", f"{host.name}: no patch recorded as applied; nothing to roll back",
                          engine_version=reply.get("version"))
    try:
        result = None
        for name in names:
            result = _rollback_locked(job, host, remote, reply, name)
            if not result.ok:
                return result
        return result
    except HostFailure:
        unlock(remote, host, job)
        raise


def _rollback_locked(job: Job, host: Host, remote: Remote, reply: dict, name: str) -> HostResult:
    ledger = reply.get("ledger") or {}
    entry = ledger.get("patches", {}).get(name)
    version = reply.get("version")
    if entry is None:
        unlock(remote, host, job)
        return HostResult(host.name, False, "error", f"{host.name}: {name} is not recorded as applied on this host; "
                                                     "`fleetpatch status` shows what is", engine_version=version)
    job.progress(host.name, "rollback", entry["label"])
    req = dict(base_request(host, job), package_dir=reply["package_dir"], name=name, force=job.force,
               unlock_on_error=True)
    out = remote.call("rollback", req)
    restored = {p: (rec or {}).get("sha256") for p, rec in out["files"].items()}
    bad = [p for p, rec in entry["files"].items() if restored.get(p) != rec["before"]]
    if bad:
        unlock(remote, host, job)
        return HostResult(host.name, False, "error", f"{host.name}: after restoring, {', '.join(bad)} do not match "
                                                     "the recorded original sha256", engine_version=version,
                          files=restored)
    patch = job.patch if job.patch and job.patch.name == name else load_named(job, name)
    launch = running_launch(host, {})
    timeout = job.timeout if job.timeout is not None else float(host.server.ready_timeout)
    verdicts, timings = follow_and_judge(remote, host, job, start=restart_start(out), version=version,
                                         launch=launch, patches=[patch], labels=[entry["label"]],
                                         want_markers=False, timeout=timeout)
    result = verdict_result(host, version, verdicts, [entry["label"]], timings)
    result.files = restored
    if result.ok:
        result.status = "rolled-back"
        result.message = (f"{host.name}: {entry['label']} rolled back; {len(restored)} files restored to their "
                          f"original sha256; server back without the patch's markers")
    return result


# ---------------------------------------------------------- verify-logs

@host_step
def verify_logs(job: Job, host: Host, remote: Remote) -> HostResult:
    reply = probe(remote, host, job, [], content=False, lock=False)
    ledger = reply.get("ledger") or {}
    version = reply.get("version")
    last = ledger.get("last_restart")
    if not last:
        return HostResult(host.name, False, "error", f"{host.name}: fleetpatch has not restarted this server yet, so "
                                                     "there is no log window to read; deploy first",
                          engine_version=version)
    if job.patch:
        patches, labels = [job.patch], [f"{job.patch.name}@{ledger.get('patches', {}).get(job.patch.name, {}).get('rev', '?')}"]
    else:
        names = sorted(ledger.get("patches", {}))
        if not names:
            return HostResult(host.name, False, "error", f"{host.name}: no patch recorded as applied; name one with "
                                                         "--patch", engine_version=version)
        patches = [load_named(job, n) for n in names]
        labels = [ledger["patches"][n]["label"] for n in names]
    launch = running_launch(host, reply)
    start = {"inode": last.get("inode"), "offset": last.get("offset", 0), "pid": last.get("pid")}
    # This run's token matches no lock, so the unlock sent with the verdict is a no-op.
    return _verify(job, host, remote, version, launch, patches, labels, start)


# ---------------------------------------------------------------- status

@host_step
def status(job: Job, host: Host, remote: Remote) -> HostResult:
    profile = get_profile(host.engine.kind)
    reply = remote.call("probe", dict(base_request(host, job), files=[], content=False, ledger_files=True))
    ledger = reply.get("ledger") or {}
    reply_files = reply.get("files") or {}
    # Patches stack: a file is expected to hold what the last patch that wrote it left there.
    expected = {}
    for entry in sorted(ledger.get("patches", {}).values(), key=lambda e: (e.get("seq", 0), e.get("applied_at", ""))):
        for p, rec in entry.get("files", {}).items():
            expected[p] = rec["after"]
    drift = sorted(p for p, sha in expected.items() if (reply_files.get(p) or {}).get("sha256") != sha)
    server = reply.get("server") or {}
    applied = [e["label"] for _, e in sorted(ledger.get("patches", {}).items())]
    last_v = ledger.get("last_verification") or {}
    details = {"reachable": True, "applied": applied, "drift": drift,
               "server_up": bool(server.get("alive")) and server.get("healthy") is not False,
               "server_pid": server.get("pid"), "last_verification": last_v,
               "restart_pending": bool(ledger.get("restart_pending")),
               "lock": reply.get("lock"), "known_version": profile.knows(reply.get("version") or "")}
    ok = not drift
    msg = f"{host.name}: " + ("drift in " + ", ".join(drift) if drift else "ok")
    return HostResult(host.name, ok, "ok" if ok else "drift", msg, engine_version=reply.get("version"),
                      details=details)
