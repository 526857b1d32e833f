"""Per-host operations: the remote seam plus the pure parts, composed.

Each public function takes a `Job` (what the operator asked for) and one
host, and returns a `HostResult`; none raises for a host's failure. The round
trips (requests) of a deploy: probe+lock, apply+restart, follow+record+unlock,
all to one agent process on the host (one remote command per host per step
function: `host_step` opens the Remote and closes it with `bye`).

A host's lock is one `with HostLock(...)` block on this side: taken by the
block's first probe and released when the block ends, however it ends (the
release rides on the last follow when the work ends there). The requests and
replies are the records of `protocol`.
"""
from __future__ import annotations

import dataclasses
import functools
import getpass
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit, urlunsplit

from . import dialer, diffapply, drain, lockview, protocol
from .engines import get as get_profile
from .engines import LaunchConfig
from .errors import HostFailure, Status
from .hostcalls import HostResult, base_request  # noqa: F401  (steps.HostResult is the API)
from .hostcalls import split_command
from .inventory import Host
from .patchset import NoRevisionFits, Patch
from .remote import Remote, Transport

if TYPE_CHECKING:  # imported where a verdict is made, not on the way to the first connect
    from . import evidence


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
    # uuid4's randomness without importing uuid (which imports platform: ~5 ms at every start)
    token: str = field(default_factory=lambda: os.urandom(16).hex())
    patch_dirs: list = field(default_factory=list)
    settle_s: float = 2.0
    lock_renew_s: float = protocol.LOCK_RENEW_S   # how often the agent holding a lock renews it
    # How to reach a host's agent; None: SSH. Tests pass transport_local.LocalTransport.
    transport: Callable[[Host], Transport] | None = None
    # drain.Drainer when a router section applies (router-aware restarts); None: plain restarts
    drain: object | None = None
    # --inventory as given (None: the default), for the commands fleetpatch tells the operator to run
    inventory_arg: str | None = None


# How long a decided failure waits for the rest of the server's last words
# (the agent reports every 50 ms; a dying process's traceback lands within that).
FAILURE_GRACE_S = 0.5


# ----------------------------------------------------------------- helpers

def inventory_launch(host: Host) -> LaunchConfig:
    r = host.server.restart
    argv = [tok.replace("{python}", host.engine.python) for tok in split_command(r.start or "")]
    return LaunchConfig(argv=argv, env=dict(r.env or {}), source="inventory")


def running_launch(host: Host, probe: dict) -> LaunchConfig:
    server = probe.get("server") or {}
    if server.get("alive") and server.get("argv"):
        return LaunchConfig(argv=server["argv"], env=server.get("env") or {}, source="process")
    return inventory_launch(host)


def server_info_url(health_url: str | None) -> str | None:
    if not health_url:
        return None
    parts = urlsplit(health_url)
    return urlunsplit((parts.scheme, parts.netloc, "/server_info", "", ""))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def probe(remote: Remote, host: Host, job: Job, files: list[str], content: bool,
          lock: str | None = None) -> protocol.ProbeReply:
    """Read the host; with `lock` (the command the lock is for) take its lock first."""
    req = protocol.ProbeRequest(**base_request(host, job), files=files, content=content)
    if lock:
        req["lock"] = protocol.LockClaim(token=job.token, holder=job.holder, force=job.break_lock, command=lock,
                                         laptop=socket.gethostname(), pid=os.getpid(),
                                         pid_start=lockview.process_start(os.getpid()), boot_id=lockview.boot_id(),
                                         renew_s=job.lock_renew_s)
    return remote.call("probe", req)


def deploy_command(job: Job) -> str:
    """What a deploy does to one host, as the command line that does it again."""
    rev = f"@{job.rev}" if job.rev is not None else ""
    return f"deploy-patch --patch {job.patch.name}{rev}"


def rollback_command(job: Job) -> str:
    return "rollback" + (f" --patch {job.patch.name}" if job.patch else "")


class HostLock:
    """The host's lock for one `with` block, released when the block ends however
    it ends: a refusal, a HostFailure, a bug in this process. A rollback that
    follows a failure runs inside the same block, so it keeps the lock.

    The release costs no round trip when the block's work ends with an agent
    request: it is chained onto that request (`release_followup`). Otherwise
    `__exit__` sends it."""

    def __init__(self, remote: Remote, host: Host, job: Job, command: str):
        self.remote, self.host, self.job = remote, host, job
        self.command = command  # recorded in the lock, and how a refusal says to clear one left by a dead run
        self.held = False       # this run may hold the lock: release it at the end
        self._riding = False    # the release was chained onto the running request

    def __enter__(self) -> "HostLock":
        return self

    def probe(self, files: list[str], content: bool) -> protocol.ProbeReply:
        """The locking probe (again, inside the block: the lock is re-entrant for this run).
        A lock whose holder is provably dead (a run on this machine whose pid is gone,
        e.g. killed with -9) is taken over: only a live holder, or one elsewhere, needs a human."""
        self.held = True  # from the moment the request leaves, the lock may be ours
        reply = probe(self.remote, self.host, self.job, files, content, lock=self.command)
        if reply.get("locked"):
            return reply
        held = reply.get("lock") or {}
        if self.job.break_lock or not lockview.provably_dead_here(held):
            self.held = False  # another run's lock: not ours to release
            raise HostFailure(Status.LOCKED, lockview.refusal(self.host.name, held, self.command, self.job.inventory_arg))
        dead = held.get("holder", "a dead run")
        self.job.progress(self.host.name, "fetch", f"taking over the lock of {dead} (that process is gone)")
        took = probe(self.remote, self.host, dataclasses.replace(self.job, break_lock=True), files, content,
                     lock=self.command)
        took["lock_taken_over"] = dead
        self.taken_over = (f"\n  took over the lock left by {dead}: "
                           f"{lockview.assess(held).why}")
        return took

    def release_followup(self) -> list[protocol.Request]:
        """The unlock request to chain onto the request (or follow) that ends the work."""
        if not self.held:
            return []
        self._riding = True
        return [dict(base_request(self.host, self.job), op="unlock")]

    def chained_done(self, reply: dict) -> None:
        """The request answered: if the release rode on it and the agent ran it, the lock is free.
        (A follow that ended at its deadline before the decision arrived ran nothing.)"""
        if self._riding and any(r.get("unlocked") for r in reply.get("then") or []):
            self.held = False
        self._riding = False

    # The release after a failure gets a short wait of its own: after a stalled call the
    # connection is likely stalled too, and the operator must not wait minutes for it.
    RELEASE_TIMEOUT_S = 20.0

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._riding = False
        if self.held:
            self.held = False
            try:
                self.remote.call("unlock", base_request(self.host, self.job), timeout=self.RELEASE_TIMEOUT_S)
            except Exception as e:  # the run's own failure comes first; this is said after it
                note = (f"\n  the lock {self.host.engine.state_dir}/{protocol.LOCK_FILE} was NOT released "
                        f"({getattr(e, 'message', e)}); once this run (and any agent of it still at work on "
                        "the host) has ended, a plain rerun from this machine takes it over; from another "
                        "machine, rerun with --break-lock")
                if isinstance(exc, HostFailure):
                    exc.message += note
                else:
                    self.release_note = note
        return False

    release_note = ""
    taken_over = ""

    def annotate(self, result: "HostResult") -> "HostResult":
        """The result, with the lock it took over from a dead run and the release's failure, if any."""
        result.message += self.taken_over + self.release_note
        return result


def load_named(job: Job, host: Host, name: str) -> Patch:
    """A patch the host's ledger names, from the same patch directories."""
    return load_all_named(job, host, [name])[0]


def load_all_named(job: Job, host: Host, names: list[str]) -> list[Patch]:
    """The patches the host's ledger names, or one HostFailure naming the host once
    and every patch that cannot be loaded here, with the flag that finds them."""
    from .patchset import PatchError, load_patch
    out, missing, why = [], [], []
    for name in names:
        try:
            out.append(load_patch(name, job.patch_dirs, get_profile(host.engine.kind))[0])
        except PatchError as e:
            missing.append(name)
            why.append(str(e))
    if missing:
        raise HostFailure(Status.ERROR, f"{host.name}: the ledger records {', '.join(missing)} as applied, but "
                                        f"{'it' if len(missing) == 1 else 'they'} cannot be loaded here: "
                                        f"{'; '.join(why)}; nothing was changed; rerun with --patches DIR, the "
                                        "folder that holds <name>/patch.yaml")
    return out


# The hosts of a fleet mostly hold the same engine files, so the same bytes arrive from
# each (zlib is deterministic) and the same patched bytes go back: each distinct file is
# unpacked, patched and packed once per run, not once per host.
_MEMO_MOST = 64
_unpack = functools.lru_cache(maxsize=_MEMO_MOST)(protocol.unpack)
packed = functools.lru_cache(maxsize=_MEMO_MOST)(protocol.pack)
_applied: dict[tuple, tuple] = {}   # (id(diff), original) -> (diff, result): a FileDiff is no dict key


def file_bytes(probe_reply: protocol.ProbeReply, path: str) -> bytes | None:
    rec = (probe_reply.get("files") or {}).get(path)
    return None if rec is None else _unpack(rec["content"])


def apply_file(fd: diffapply.FileDiff, original: bytes | None) -> diffapply.FileResult:
    """diffapply.apply_file, once per diff and original; each caller gets its own copy
    (make_plan rewrites a conflict's detail). Shared by the host threads: a lost race
    only computes the same result twice."""
    hit = _applied.get((id(fd), original))
    if hit is None or hit[0] is not fd:   # the diff itself is kept, so its id is not reused
        if len(_applied) >= _MEMO_MOST:
            _applied.clear()
        hit = _applied[(id(fd), original)] = (fd, diffapply.apply_file(fd, original))
    return dataclasses.replace(hit[1])


def host_step(fn):
    """Time a host operation, open/close its connection, turn failures into results."""

    def run(job: Job, host: Host) -> HostResult:
        started = time.monotonic()
        transport = job.transport(host) if job.transport else None
        remote = Remote(host, hosts_by_name=job.hosts_by_name, accept_new_host_keys=job.accept_new_host_keys,
                        transport=transport)
        try:
            job.progress(host.name, "connect", "")
            with dialer.first_contact():   # Ctrl-C drops it: nothing has been sent to the host yet
                remote.open()
            result = fn(job, host, remote)
        except HostFailure as f:
            result = HostResult(host.name, False, f.status, f.message)
        except Exception as e:  # a bug must not take the other hosts down with it
            result = HostResult(host.name, False, Status.ERROR, f"{host.name}: {type(e).__name__}: {e}")
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
            raise HostFailure(Status.ERROR, f"{host.name}: {path} arrived damaged (sha256 differs from the host's); "
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
    return HostResult(host.name, True, Status.FETCHED, msg, engine_version=version, files=files)


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
    misfits: list = field(default_factory=list)   # conflicts of layout: a changed file or a created one's folder is missing

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


CHANGE_STATES = ("applies", "creates", "deletes")


def make_plan(job: Job, host: Host, reply: dict) -> tuple[Plan, object]:
    profile = get_profile(host.engine.kind)
    version = reply.get("version")
    if not version:
        raise HostFailure(Status.ERROR, f"{host.name}: cannot read the {profile.package} version with "
                                   f"{host.engine.python} (importlib.metadata found no distribution)")
    try:
        revision = job.patch.choose(job.rev, version)
    except NoRevisionFits as e:
        raise HostFailure(Status.ERROR, f"{host.name}: {e}") from None
    label = f"{job.patch.name}@{revision.rev}"
    states = {}
    missing_folders = set(reply.get("absent_folders") or [])
    misfits = []
    for fd in revision.files:
        # None: the file does not exist (a diff that creates it needs exactly that)
        state = apply_file(fd, file_bytes(reply, fd.path))
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
    launch = running_launch(host, reply)
    if not launch.argv:
        # systemd/supervisor with the server down: nothing says how it will be launched,
        # so the pre-flight cannot predict; the log after the restart decides.
        return Plan(version, label, states, None, None, launch, misfits), revision
    prediction = profile.predict(version, launch)
    verdict = preflight_verdict(job, host, profile, revision, prediction, label)
    if verdict is not None:
        verdict.message += launch_note(host, profile, version, launch, prediction)
    return Plan(version, label, states, verdict, prediction, launch, misfits), revision


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
    from . import evidence
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


@host_step
def check_patch(job: Job, host: Host, remote: Remote) -> HostResult:
    job.progress(host.name, "fetch", "")
    reply = probe(remote, host, job, revision_files(job), content=True, lock=False)
    plan, _ = make_plan(job, host, reply)
    detail = describe_states(plan)
    base = dict(engine_version=plan.version, patch=plan.label, details={"files_state": {
        p: {"state": r.state, "offsets": r.offsets, "detail": r.detail} for p, r in plan.states.items()}})
    if plan.conflicts:
        return HostResult(host.name, False, Status.CONFLICT, f"{host.name}: {plan.label} does not apply\n{detail}", **base)
    if plan.preflight is not None and not job.force:
        return HostResult(host.name, False, Status.NOT_EXECUTED, plan.preflight.message + "\n" + detail,
                          executed_path=plan.preflight.executed_path, **base)
    status = Status.ALREADY_APPLIED if plan.already else Status.APPLIES
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

SUCCESS = (Status.VERIFIED, Status.ROLLED_BACK)


class EventLog:
    """What the follow stream has told so far: the log window, the server's
    state, its /server_info and how it was launched.

    The window is bounded: a chatty server may write hundreds of MB after its
    restart, while what decides (the settings dump, the markers, the ready line,
    a traceback) comes at start. The first MAX_LINES lines are kept; later lines
    are counted (`dropped`) and still seen for the ready line, not judged."""

    MAX_LINES = 50_000   # a judgement of this many lines takes about half a second

    def __init__(self, ready_line: str, launch: LaunchConfig):
        self.ready_line = ready_line
        self.lines: list[str] = []
        self.arrived: list[float] = []   # when each line reached the laptop
        self.first_line_no: int | None = None
        self.alive: bool | None = None
        self.healthy: bool | None = None
        self.server_info: dict | None = None
        self.ready_at: float | None = None
        self.launch = launch
        self.dropped = 0

    def add(self, ev: dict) -> None:
        kind = ev.get("t")
        if kind == "lines":
            self._add_lines(ev)
        elif kind == "state":
            self.alive, self.healthy = ev.get("alive"), ev.get("healthy")
        elif kind == "server_info":
            self.server_info = ev.get("data")
        elif kind == "launch" and ev.get("argv"):
            # After a restart the running process is the one to read, not what it was before.
            self.launch = LaunchConfig(argv=ev["argv"], env=ev.get("env") or {}, source="process")

    def _add_lines(self, ev: dict) -> None:
        if self.first_line_no is None:
            self.first_line_no = ev["first_line_no"]
        now = time.monotonic()
        lines = ev["lines"]
        room = max(0, self.MAX_LINES - len(self.lines))
        self.lines.extend(lines[:room])
        self.arrived.extend([now] * min(room, len(lines)))
        self.dropped += max(0, len(lines) - room)
        if self.ready_at is None and any(self.ready_line in line for line in lines):
            self.ready_at = now

    def observation(self, timed_out: bool) -> evidence.Observation:
        from . import evidence
        since_ready = None if self.ready_at is None else time.monotonic() - self.ready_at
        return evidence.Observation(lines=list(self.lines), first_line_no=self.first_line_no or 1,
                                    server_info=self.server_info, alive=self.alive, healthy=self.healthy,
                                    since_ready_s=since_ready, timed_out=timed_out)

    def arrival_of(self, line_no: int) -> float | None:
        idx = line_no - (self.first_line_no or 1)
        return self.arrived[idx] if 0 <= idx < len(self.arrived) else None


def _marker_matches(marker, line: str) -> bool:
    try:
        return bool(marker.matches(line))
    except Exception:  # a broken marker never matches (evidence does the same)
        return False


@dataclass
class Judging:
    """Judges one follow stream as it arrives and says when the verdict is final."""

    host: Host
    job: Job
    version: str
    patches: list
    labels: list
    want_markers: bool
    timeout: float
    events: EventLog
    t0: float = field(default_factory=time.monotonic)
    failed_at: float | None = None
    last_judged: float | None = None
    judge_s: float = 0.0     # how long the last judgement took
    verdicts: list | None = None
    timings: dict = field(default_factory=dict)

    def judge(self, timed_out: bool) -> list[evidence.Verdict]:
        from . import evidence
        profile = get_profile(self.host.engine.kind)
        obs = self.events.observation(timed_out)
        return [evidence.judge(obs, profile, self.version, self.events.launch, p.markers, p.expect, p.forbid,
                               label, self.host.name, want_markers=self.want_markers, settle_s=self.job.settle_s)
                for p, label in zip(self.patches, self.labels)]

    # Lines are judged at most this often (other events at once): the whole window is
    # read on every judgement, so judging every batch of a chatty log would be quadratic.
    JUDGE_EVERY_S = 0.25
    SCAN_LINES = 1000

    def _worth_judging(self, ev: dict, timed_out: bool) -> bool:
        """A batch of lines is judged at once when it holds a line that can decide (the ready
        line, a marker, an expect or forbid text); else at most every JUDGE_EVERY_S."""
        if ev.get("t") != "lines" or timed_out or self.last_judged is None:
            return True
        if time.monotonic() - self.last_judged >= max(self.JUDGE_EVERY_S, 2 * self.judge_s):
            return True  # at most half of the laptop's time goes to judging, however big the window
        if len(ev.get("lines") or ()) > self.SCAN_LINES:
            return False  # a burst: the next judgement is at most JUDGE_EVERY_S away
        texts = [self.events.ready_line] + [t for p in self.patches for t in list(p.expect or []) + list(p.forbid or [])
                                            if t]
        markers = [m for p in self.patches for m in (p.markers or {}).values()]
        for line in ev.get("lines") or ():
            if any(t in line for t in texts) or any(_marker_matches(m, line) for m in markers):
                return True
        return False

    def on_event(self, ev: dict) -> list[evidence.Verdict] | None:
        """The final verdicts once decided, else None (keep listening)."""
        self.events.add(ev)
        elapsed = time.monotonic() - self.t0
        timed_out = elapsed >= self.timeout or ev.get("t") == "deadline"
        if not self._worth_judging(ev, timed_out):
            return None
        vs = self.judge(timed_out)
        self.last_judged = time.monotonic()
        self.judge_s = self.last_judged - (self.t0 + elapsed)
        waiting = [v for v in vs if not v.final]
        self.job.progress(self.host.name, "verify", f"{elapsed:4.1f}s " + (
            "waiting for " + ", ".join(v.missing[0] if v.missing else "the server" for v in waiting) if waiting
            else "decided"))
        if waiting or self._in_failure_grace(vs, timed_out):  # a host in flight always finishes its verdict
            return None
        self.decided(vs, elapsed)
        return vs

    def _in_failure_grace(self, vs: list[evidence.Verdict], timed_out: bool) -> bool:
        """A decided restart failure waits a moment for the rest of the traceback (the
        error itself), unless the process is already dead or time is up."""
        if timed_out or self.events.alive is False or not any(v.status == Status.RESTART_FAILED for v in vs):
            return False
        self.failed_at = self.failed_at or time.monotonic()
        return time.monotonic() - self.failed_at < FAILURE_GRACE_S

    def decided(self, vs: list[evidence.Verdict], elapsed: float) -> None:
        self.verdicts = vs
        self.timings["verdict_after_s"] = round(elapsed, 3)
        seen = [m["line_no"] for v in vs for m in v.markers_seen if m.get("line_no")]
        arrived = self.events.arrival_of(min(seen)) if seen else None
        if arrived is not None:
            # from the marker line reaching us (the agent polls every 50 ms) to the verdict
            self.timings["marker_to_verdict_s"] = round(time.monotonic() - arrived, 3)

    @property
    def ok(self) -> bool:
        return all(v.status in SUCCESS for v in self.verdicts or [])


def ledger_update(judging: Judging, check: str = "deploy") -> protocol.LedgerUpdate:
    """The verdict as the ledger records it; `check` is which one it was (deploy, rollback, verify-logs)."""
    vs = judging.verdicts
    at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    update = protocol.LedgerUpdate(verification={}, last_verification=protocol.LastVerification(
        at=at, status=str(Status.VERIFIED if judging.ok else vs[0].status), labels=list(judging.labels), check=check))
    if judging.want_markers:
        for p, v in zip(judging.patches, vs):
            update["verification"][p.name] = protocol.Verification(status=str(v.status),
                                                                   executed_path=v.executed_path, at=at)
    return update


def follow_request(host: Host, job: Job, start: dict, timeout: float) -> protocol.FollowRequest:
    """The follow of the log window `start` (or protocol.AFTER_RESTART)."""
    req = protocol.FollowRequest(**base_request(host, job), inode=start.get("inode"), offset=start.get("offset", 0),
                                 pid=start.get("pid"), timeout=timeout, ready_line=get_profile(host.engine.kind).ready_line,
                                 server_info_url=server_info_url(host.server.health_url))
    if start.get("after_restart"):
        req["after_restart"] = True
    return req


def follow_ahead(job: Job, host: Host) -> dict:
    """The follow to send with a request that restarts: the agent runs it on that
    restart's window as soon as the restart is done, without waiting for the laptop
    to read the answer and ask (a round trip). `_verify(start=AFTER_RESTART)` takes it up."""
    return dict(follow_request(host, job, protocol.AFTER_RESTART, _timeout(job, host)), op="follow")


def follow_and_judge(remote: Remote, host: Host, job: Job, *, start: dict, version: str,
                     launch: LaunchConfig, patches: list[Patch], labels: list[str], want_markers: bool,
                     timeout: float, lock: HostLock | None = None,
                     ends_work: Callable[[bool], bool] = lambda ok: True,
                     check: str | None = None) -> tuple[list[evidence.Verdict], dict]:
    """Stream the log from `start` (inode, offset, pid) and judge as lines arrive.
    The decision goes back on the same channel as follow-ups: record the verdict,
    and release `lock` when `ends_work(ok)` says nothing follows under it, so
    verification costs one round trip."""
    profile = get_profile(host.engine.kind)
    ready_line = profile.ready_line
    judging = Judging(host, job, version, patches, labels, want_markers, timeout, EventLog(ready_line, launch))
    req = follow_request(host, job, start, timeout)

    def on_event(ev: dict) -> list | None:
        decided = judging.on_event(ev)
        # The window holds what it keeps; Remote keeps every event until the result,
        # so a chatty log must not stay in memory twice.
        ev.pop("lines", None)
        if decided is None:
            return None
        followups = [dict(base_request(host, job), op="record", ledger_update=ledger_update(
            judging, check or ("deploy" if want_markers else "rollback")))]
        if lock is not None and ends_work(judging.ok):
            followups += lock.release_followup()
        return followups

    reply = remote.stream("follow", req, on_event, timeout=timeout)
    if lock is not None:
        lock.chained_done(reply)
    if judging.verdicts is None:  # the stream ended before a decision (the server host went away)
        judging.verdicts = judging.judge(True)
    if judging.events.dropped:
        judging.timings["log_lines_not_kept"] = judging.events.dropped
        if not judging.ok:
            for v in judging.verdicts:
                v.message += (f"\n  note: the log grew by {judging.events.dropped} more lines after the first "
                              f"{EventLog.MAX_LINES} since the restart; only those first lines were judged")
    return judging.verdicts, judging.timings


def verdict_result(host: Host, version: str, verdicts: list[evidence.Verdict], labels: list[str],
                   timings: dict) -> HostResult:
    bad = [v for v in verdicts if v.status not in SUCCESS]
    main = bad[0] if bad else verdicts[0]
    markers = [m for v in verdicts for m in v.markers_seen]
    message = "\n".join(v.message for v in (bad or verdicts))
    return HostResult(host.name, not bad, Status(main.status), message, engine_version=version,
                      patch=",".join(labels), executed_path=main.executed_path, markers=markers,
                      details={"cause": main.cause, "evidence": [e.__dict__ for e in main.evidence], **timings})


# ---------------------------------------------------------------- deploy

@host_step
def deploy(job: Job, host: Host, remote: Remote) -> HostResult:
    with HostLock(remote, host, job, deploy_command(job)) as lock:
        job.progress(host.name, "fetch", "lock + read files")
        reply = lock.probe(revision_files(job), content=True)
        result = _deploy_locked(job, host, remote, lock, reply)
    return lock.annotate(result)


def _refusal(job: Job, host: Host, plan: Plan) -> HostResult | None:
    """Why this host's files are left untouched, if they are."""
    if plan.misfits:   # not a hand edit: the patch was made for another layout of the package
        return HostResult(host.name, False, Status.CONFLICT,
                          f"{host.name}: refused, left untouched and not restarted: {plan.label} does not fit this "
                          f"host's package\n{describe_states(plan)}\n  check that the patch's engine_versions admit "
                          "only versions with these files", engine_version=plan.version, patch=plan.label)
    if plan.conflicts or (not plan.already and len(plan.changes) != len(plan.states)):
        return HostResult(host.name, False, Status.DRIFT,
                          f"{host.name}: refused, left untouched and not restarted: the files match neither "
                          f"{plan.label}'s pre-image nor its post-image\n{describe_states(plan)}\n"
                          "  inspect the hand edits (fleetpatch fetch), restore the originals, then rerun",
                          engine_version=plan.version, patch=plan.label)
    if plan.preflight is not None and not job.force:
        return HostResult(host.name, False, Status.NOT_EXECUTED, plan.preflight.message,
                          engine_version=plan.version, patch=plan.label, executed_path=plan.preflight.executed_path)
    return None


def _deploy_locked(job: Job, host: Host, remote: Remote, lock: HostLock, reply: protocol.ProbeReply) -> HostResult:
    job.progress(host.name, "pre-flight", "")
    plan, revision = make_plan(job, host, reply)
    refused = _refusal(job, host, plan)
    if refused is not None:
        return refused
    if plan.already:
        return _already_applied(job, host, remote, lock, plan, reply.get("ledger") or {}, reply.get("server") or {},
                                reply.get("window_intact"))
    job.progress(host.name, "apply", f"{len(plan.changes)} files")
    files = apply_files(reply, plan)
    apply_req = protocol.ApplyRequest(**base_request(host, job), package_dir=reply["package_dir"],
                                      name=job.patch.name, rev=revision.rev, label=plan.label,
                                      diff_sha256=revision.diff_sha256, files=files)
    if job.no_restart:
        lock.chained_done(remote.call("apply", dict(apply_req, restart=None, then=lock.release_followup())))
        return HostResult(host.name, True, Status.APPLIED,
                          f"{host.name}: {plan.label} applied; restart pending (--no-restart): the next deploy or "
                          "`fleetpatch verify-logs` after a restart proves it", engine_version=plan.version,
                          patch=plan.label)
    job.progress(host.name, "restart", "")
    return _restart_and_verify(job, host, remote, lock, plan, "apply", apply_req)


def apply_files(reply: protocol.ProbeReply, plan: Plan) -> list[protocol.ApplyFile]:
    """The apply request's files: what each must hold now (sha256; None: absent) and after."""
    files = []
    for r in plan.changes:
        if r.state == "creates":
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_CREATE, before=None, after=sha256(r.new),
                                            content=packed(r.new)))
        elif r.state == "deletes":
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_DELETE,
                                            before=sha256(file_bytes(reply, r.path)), after=None))
        else:
            files.append(protocol.ApplyFile(path=r.path, op=protocol.OP_MODIFY,
                                            before=sha256(file_bytes(reply, r.path)), after=sha256(r.new),
                                            content=packed(r.new)))
    return files


# A last restart that ended so is retried by the next deploy: the operator fixed the cause.
RETRY_AFTER = (Status.RESTART_FAILED, Status.TIMEOUT)


def restart_reason(ledger: protocol.Ledger, server: dict, name: str) -> str | None:
    """Why a deploy that has nothing to write must still restart, if it must: a restart
    left pending, a server that is down, or a last restart that failed or never got ready.
    Re-reading that restart's window would only repeat its failure."""
    if ledger.get("restart_pending"):
        return "restart pending from an earlier run"
    if not ledger.get("last_restart"):
        return None
    if server.get("alive") is False:
        return "the server is not running"
    verification = (ledger.get("patches", {}).get(name) or {}).get("verification") or {}
    if verification.get("status") in RETRY_AFTER:
        return f"the last restart ended {verification['status']}"
    return None


def _already_applied(job: Job, host: Host, remote: Remote, lock: HostLock, plan: Plan,
                     ledger: protocol.Ledger, server: dict, window_intact: bool | None = None) -> HostResult:
    reason = restart_reason(ledger, server, job.patch.name)
    if reason and not job.no_restart:
        job.progress(host.name, "restart", reason)
        return _restart_and_verify(job, host, remote, lock, plan, "restart",
                                   protocol.RestartRequest(**base_request(host, job),
                                                           reason=f"{reason}: restart for {plan.label}"))
    # Nothing to write: prove it still runs from the window of the last restart.
    last = ledger.get("last_restart")
    if job.no_restart or not last:
        return HostResult(host.name, True, Status.ALREADY_APPLIED,
                          f"{host.name}: {plan.label} already applied; nothing changed", engine_version=plan.version,
                          patch=plan.label)
    verification = (ledger.get("patches", {}).get(job.patch.name) or {}).get("verification") or {}
    if window_intact is False and verification.get("status") == Status.VERIFIED and server.get("pid") == last.get("pid"):
        # The log since that restart was rotated, truncated or deleted away: re-reading it
        # would wait for lines that are gone. The process fleetpatch verified still runs.
        return HostResult(host.name, True, Status.ALREADY_APPLIED,
                          f"{host.name}: {plan.label} already applied; nothing changed; the server fleetpatch verified "
                          f"at {verification.get('at')} (pid {last.get('pid')}, {verification.get('executed_path')}) "
                          "still runs; its log since that restart is no longer there to re-read",
                          engine_version=plan.version, patch=plan.label,
                          executed_path=verification.get("executed_path"))
    return _verify(job, host, remote, plan.version, plan.launch, [job.patch], [plan.label],
                   protocol.log_window(last), lock=lock, already=True)


def _restart_and_verify(job: Job, host: Host, remote: Remote, lock: HostLock, plan: Plan, op: str,
                        request: dict) -> HostResult:
    """The restart, inside the drain when a router is in front of the host."""
    undo = (lambda failed: _rollback_after_failure(job, host, remote, lock, failed)) \
        if job.on_failure == "rollback" else None
    return drain.around_restart(job, host, remote,
                                lambda: _restart_and_verify_now(job, host, remote, lock, plan, op, request),
                                rollback=undo, expect=list(getattr(job.patch, "smoke_expect", None) or []))


def _restart_and_verify_now(job: Job, host: Host, remote: Remote, lock: HostLock, plan: Plan, op: str,
                            request: dict) -> HostResult:
    """Run the agent operation that restarts (apply+restart, or a pending restart),
    verify, and with --on-failure rollback undo a host that failed either way
    (under the same lock: the rollback is part of the block)."""
    rollback = job.on_failure == "rollback"
    try:
        out = remote.call(op, request, ahead=follow_ahead(job, host))
    except HostFailure as f:
        if f.status != Status.RESTART_FAILED:
            return _cut_off(host, plan, f, "write and restart" if op == "apply" else "restart")
        # The files are written (the ledger says so, restart pending) but the server did not start.
        failed = HostResult(host.name, False, Status.RESTART_FAILED, f.message, engine_version=plan.version,
                            patch=plan.label)
        if rollback:
            return _rollback_after_failure(job, host, remote, lock, failed)
        failed.message += "\n  the files are written and a restart is pending; fix the start, then rerun or roll back"
        return failed
    # With a rollback to follow a failure, the lock stays held until the rollback ends.
    try:
        result = _verify(job, host, remote, plan.version, launch_after_restart(host, plan), [job.patch],
                         [plan.label], protocol.AFTER_RESTART, lock=lock,
                         ends_work=(lambda ok: ok) if rollback else (lambda ok: True))
    except HostFailure as f:
        return _cut_off(host, plan, f, "verification")
    if not result.ok and rollback:
        result = _rollback_after_failure(job, host, remote, lock, result)
    return result


# What Remote says when the agent's answer never came: the connection (or the agent) died.
NO_ANSWER = ("without an answer", "did not answer within", "connection dropped")


def _cut_off(host: Host, plan: Plan, f: HostFailure, phase: str) -> HostResult:
    """A failure of the call that writes, restarts or verifies, with what the host was
    being asked to do. When no answer came, say what that means for the host."""
    return _cut_off_at(host, plan.label, plan.version, f, phase)


def no_answer(f: HostFailure) -> bool:
    """The host's answer never came: the connection (or the agent) died or stalled."""
    return f.status in (Status.TIMEOUT, Status.UNREACHABLE) or any(s in f.message for s in NO_ANSWER)


def _cut_off_at(host: Host, label: str, version: str | None, f: HostFailure, phase: str) -> HostResult:
    message = f.message
    undoing = phase.startswith("rollback")
    if no_answer(f):
        detail = f.message.removeprefix(host.name + ": ")
        if "without an answer" in detail:   # the channel closed under the agent: nothing more to say
            detail = "the session ended before the agent's reply" + (
                "" if detail.endswith("no output") else ": " + detail.split("without an answer: ", 1)[-1])
        message = (f"{host.name}: the connection was lost during the {phase} of {label}, before the host "
                   f"answered ({detail})\n" + (
                       "  the host may be rolled back and restarted: its ledger says what was done; `fleetpatch "
                       "status` shows it, and a plain rerun of rollback finishes it (a restore cut half-way is "
                       "completed, a pending restart done)" if undoing else
                       "  the host may be patched and restarted: its ledger says what was done; `fleetpatch status` "
                       "shows it, and a plain rerun of deploy finishes it (a write cut half-way is undone, a pending "
                       "restart done) or rollback undoes it"))
    return HostResult(host.name, False, f.status, message, engine_version=version, patch=label)


def launch_after_restart(host: Host, plan: Plan) -> LaunchConfig:
    """Until the new process can be read from /proc (it may die first), the best
    account of it is what fleetpatch started: the inventory's command, or for
    systemd/supervisor the unit, which the old process reflects."""
    return inventory_launch(host) if host.server.restart.kind == "command" else plan.launch


def _timeout(job: Job, host: Host) -> float:
    return job.timeout if job.timeout is not None else float(host.server.ready_timeout)


def _verify(job, host, remote, version, launch, patches, labels, start, *, lock=None, already=False,
            ends_work=lambda ok: True, check="deploy") -> HostResult:
    job.progress(host.name, "verify", "waiting for markers")
    verdicts, timings = follow_and_judge(remote, host, job, start=start, version=version, launch=launch,
                                         patches=patches, labels=labels, want_markers=True,
                                         timeout=_timeout(job, host), lock=lock, ends_work=ends_work, check=check)
    result = verdict_result(host, version, verdicts, labels, timings)
    if already and result.ok:
        result.status = Status.ALREADY_APPLIED
        result.message = f"{host.name}: {labels[0]} already applied; nothing changed; still verified\n" + result.message
    return result


def _rollback_after_failure(job, host, remote, lock: HostLock, failed: HostResult) -> HostResult:
    job.progress(host.name, "rollback", failed.status)
    try:
        reply = lock.probe([], content=False)
        rb = _rollback_locked(job, host, remote, lock, reply, job.patch.name, last=True)
    except HostFailure as f:
        failed.message += f"\n  rollback FAILED: {f.message}"
        failed.details["rollback"] = {"status": f.status, "message": f.message}
        return failed
    return fold_rollback(failed, rb)


def fold_rollback(failed: HostResult, rb: HostResult) -> HostResult:
    """The failed host's result, with the rollback that undid it."""
    failed.details["rollback"] = {"status": rb.status, "ok": rb.ok, "message": rb.message}
    if rb.ok:
        failed.status = Status.ROLLED_BACK
        failed.message += "\n  rolled back: originals restored byte for byte, server restarted without the patch"
    else:
        failed.message += f"\n  rollback did not verify: {rb.message}"
    failed.ok = False
    return failed


# -------------------------------------------------------------- rollback

@host_step
def rollback(job: Job, host: Host, remote: Remote) -> HostResult:
    with HostLock(remote, host, job, rollback_command(job)) as lock:
        job.progress(host.name, "fetch", "lock + read ledger")
        reply = lock.probe([], content=False)
        ledger = reply.get("ledger") or {}
        names = [job.patch.name] if job.patch else newest_first(ledger)
        if not names and ledger.get("restart_pending") and ledger.get("rolled_back"):
            # an earlier rollback restored the files (or the next run finished it for a
            # killed one) but the server still runs the patched code: restart and check it
            return lock.annotate(_pending_rollback_restart(job, host, remote, lock, reply))
        if not names:
            return HostResult(host.name, True, Status.OK,
                              f"{host.name}: no patch recorded as applied; nothing to roll back",
                              engine_version=reply.get("version"))
        # Every patch's markers are needed for the checks: refuse before the first restore, not between two.
        load_all_named(job, host, [n for n in names if not (job.patch and job.patch.name == n)])
        def undo_all() -> HostResult:
            result = None
            for i, name in enumerate(names):
                result = _rollback_locked(job, host, remote, lock, reply, name, last=i == len(names) - 1)
                if not result.ok:
                    break
            return result
        result = drain.around_restart(job, host, remote, undo_all)
    return lock.annotate(result)


def _pending_rollback_restart(job: Job, host: Host, remote: Remote, lock: HostLock,
                              reply: protocol.ProbeReply) -> HostResult:
    rolled = reply["ledger"]["rolled_back"]
    name = max(rolled, key=lambda n: rolled[n].get("at", ""))
    label = rolled[name]["label"]
    version = reply.get("version")
    job.progress(host.name, "restart", f"pending restart after rolling back {label}")
    out = remote.call("restart", protocol.RestartRequest(**base_request(host, job),
                                                         reason=f"pending restart after rollback {label}"))
    patch = job.patch if job.patch and job.patch.name == name else load_named(job, host, name)
    verdicts, timings = follow_and_judge(remote, host, job, start=protocol.log_window(out["restart"]),
                                         version=version, launch=running_launch(host, {}), patches=[patch],
                                         labels=[label], want_markers=False, timeout=_timeout(job, host), lock=lock)
    result = verdict_result(host, version, verdicts, [label], timings)
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = (f"{host.name}: {label} was rolled back with its restart pending; restarted, the server "
                          "runs without the patch's markers")
    return result


def newest_first(ledger: protocol.Ledger) -> list[str]:
    """Patches stack: the last one applied is undone first, so each restores what the next expects."""
    patches = ledger.get("patches", {})
    return sorted(patches, key=lambda n: (patches[n].get("seq", 0), patches[n].get("applied_at", ""), n),
                  reverse=True)


def _rollback_locked(job: Job, host: Host, remote: Remote, lock: HostLock, reply: protocol.ProbeReply, name: str,
                     last: bool) -> HostResult:
    entry = (reply.get("ledger") or {}).get("patches", {}).get(name)
    version = reply.get("version")
    if entry is None:
        return HostResult(host.name, False, Status.ERROR, f"{host.name}: {name} is not recorded as applied on this "
                                                          "host; `fleetpatch status` shows what is",
                          engine_version=version)
    # The patch's markers are what the check after the restore looks for: load it before anything changes.
    patch = job.patch if job.patch and job.patch.name == name else load_named(job, host, name)
    job.progress(host.name, "rollback", entry["label"])
    try:
        out = remote.call("rollback", protocol.RollbackRequest(**base_request(host, job),
                                                               package_dir=reply["package_dir"], name=name,
                                                               force=job.force), ahead=follow_ahead(job, host))
    except HostFailure as f:   # a cut or stalled channel: say which patch and what the host may be in
        if not no_answer(f):
            raise
        return _cut_off_at(host, entry["label"], version, f, "rollback (restore and restart)")
    restored = {p: (rec or {}).get("sha256") for p, rec in out["files"].items()}
    bad = [p for p, rec in entry["files"].items() if restored.get(p) != rec["before"]]
    if bad:
        return HostResult(host.name, False, Status.ERROR, f"{host.name}: after restoring, {', '.join(bad)} do not "
                                                          "match the recorded original sha256", engine_version=version,
                          files=restored)
    if "restart" not in out:  # every file already held its original: nothing ran the patch, no restart
        return HostResult(host.name, True, Status.ROLLED_BACK,
                          f"{host.name}: {entry['label']} forgotten: its files already held their original sha256; "
                          "not restarted", engine_version=version, files=restored)
    try:
        verdicts, timings = follow_and_judge(remote, host, job, start=protocol.AFTER_RESTART,
                                             version=version, launch=running_launch(host, {}), patches=[patch],
                                             labels=[entry["label"]], want_markers=False,
                                             timeout=_timeout(job, host), lock=lock,
                                             ends_work=lambda ok: last or not ok)
    except HostFailure as f:
        if not no_answer(f):
            raise
        return _cut_off_at(host, entry["label"], version, f, "rollback's verification")
    result = verdict_result(host, version, verdicts, [entry["label"]], timings)
    result.files = restored
    if result.ok:
        result.status = Status.ROLLED_BACK
        result.message = (f"{host.name}: {entry['label']} rolled back; {len(restored)} files restored to their "
                          f"original sha256; server back without the patch's markers")
    return result


# ---------------------------------------------------------- verify-logs

@host_step
def verify_logs(job: Job, host: Host, remote: Remote) -> HostResult:
    reply = probe(remote, host, job, [], content=False)
    ledger = reply.get("ledger") or {}
    version = reply.get("version")
    last = ledger.get("last_restart")
    if not last:
        return HostResult(host.name, False, Status.ERROR, f"{host.name}: fleetpatch has not restarted this server "
                                                          "yet, so there is no log window to read; deploy first",
                          engine_version=version)
    recorded = ledger.get("patches", {})
    if job.patch:
        patches = [job.patch]
        labels = [f"{job.patch.name}@{recorded.get(job.patch.name, {}).get('rev', '?')}"]
    else:
        names = sorted(recorded)
        if not names:
            return HostResult(host.name, False, Status.ERROR, f"{host.name}: no patch recorded as applied; name one "
                                                              "with --patch", engine_version=version)
        patches = load_all_named(job, host, names)
        labels = [recorded[n]["label"] for n in names]
    # No lock: verify-logs reads, and records only its verdict.
    return _verify(job, host, remote, version, running_launch(host, reply), patches, labels,
                   protocol.log_window(last), check="verify-logs")


# ---------------------------------------------------------------- status

@host_step
def status(job: Job, host: Host, remote: Remote) -> HostResult:
    profile = get_profile(host.engine.kind)
    reply = remote.call("probe", protocol.ProbeRequest(**base_request(host, job), files=[], content=False,
                                                      ledger_files=True))
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
    lock = reply.get("lock")
    view = lockview.assess(lock) if lock else None
    details = {"reachable": True, "applied": applied, "drift": drift,
               "server_up": bool(server.get("alive")) and server.get("healthy") is not False,
               "server_pid": server.get("pid"), "last_verification": last_v,
               "restart_pending": bool(ledger.get("restart_pending")),
               "lock": lock, "known_version": profile.knows(reply.get("version") or "")}
    problems = ["drift in " + ", ".join(drift)] if drift else []
    if view is not None:
        details["lock_state"] = {"holder": view.holder, "command": view.command, "age_s": view.age_s,
                                 "alive": view.alive, "why": view.why, "cell": view.cell()}
        if not view.alive:
            clear = lockview.clear_command(host.name, view.command, job.inventory_arg)
            details["lock_state"]["clear"] = clear
            problems.append(f"the lock is left by a dead run: {view.holder}"
                            + (f" ({view.command})" if view.command else "") + f", since {view.since} "
                            f"({view.age()}): {view.why}; once you have checked the host (restart pending, last "
                            f"verification above), clear it and finish with:\n  {clear}")
    ok = not problems
    status_ = Status.OK if ok else Status.DRIFT if drift else Status.LOCKED
    msg = f"{host.name}: " + ("; ".join(problems) if problems else "ok")
    return HostResult(host.name, ok, status_, msg, engine_version=reply.get("version"), details=details)
