"""The follow: the log after a restart streamed from the host and judged as it
arrives; the decision (record the verdict, maybe release the lock) goes back on
the same channel."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .. import protocol
from ..engines import LaunchConfig
from ..engines import get as get_profile
from ..errors import Status
from ..hostcalls import HostResult, base_request
from ..inventory import Host
from .context import HostRun, Job, server_info_url

if TYPE_CHECKING:  # imported where a verdict is made, not on the way to the first connect
    from .. import evidence

SUCCESS = (Status.VERIFIED, Status.ROLLED_BACK)

# How long a decided failure waits for the rest of the server's last words
# (the agent reports every 50 ms; a dying process's traceback lands within that).
FAILURE_GRACE_S = 0.5


@dataclass
class Watch:
    """What one follow looks for, from where, and what it records."""

    start: dict                 # the log window: inode, offset, pid (or protocol.AFTER_RESTART)
    launch: LaunchConfig        # how the server was launched, as best known before it runs
    patches: list
    labels: list
    want_markers: bool = True   # False: a rollback's check (no marker may appear)
    check: str | None = None    # which check the ledger records (deploy, rollback, verify-logs)
    # whether nothing follows under the lock once the verdict is `ok`: then the release rides on it
    ends_work: Callable[[bool], bool] = lambda ok: True
    # execution.ExecutionView while the probe judges execution too (None: markers alone)
    execution: object | None = None

    @property
    def recorded_as(self) -> str:
        return self.check or ("deploy" if self.want_markers else "rollback")


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
        from .. import evidence
        since_ready = None if self.ready_at is None else time.monotonic() - self.ready_at
        return evidence.Observation(lines=list(self.lines), first_line_no=self.first_line_no or 1,
                                    server_info=self.server_info, alive=self.alive, healthy=self.healthy,
                                    since_ready_s=since_ready, timed_out=timed_out)

    def arrival_of(self, line_no: int) -> float | None:
        idx = line_no - (self.first_line_no or 1)
        return self.arrived[idx] if 0 <= idx < len(self.arrived) else None

    def facts(self) -> dict:
        """The server facts a verdict read: how it was launched, and its /server_info."""
        return {"launch": {"source": self.launch.source, "argv": list(self.launch.argv or []),
                           "env": dict(self.launch.env or {})},
                "server_info": self.server_info}


def _marker_matches(marker, line: str) -> bool:
    try:
        return bool(marker.matches(line))
    except Exception:  # a broken marker never matches (evidence does the same)
        return False


@dataclass
class Judging:
    """Judges one follow stream as it arrives and says when the verdict is final."""

    run: HostRun
    watch: Watch
    events: EventLog
    t0: float = field(default_factory=time.monotonic)
    failed_at: float | None = None
    last_judged: float | None = None
    judge_s: float = 0.0     # how long the last judgement took
    verdicts: list | None = None
    timings: dict = field(default_factory=dict)

    def judge(self, timed_out: bool) -> list[evidence.Verdict]:
        from .. import evidence
        obs = self.events.observation(timed_out)
        subject = evidence.Subject(self.run.profile, self.run.version, self.events.launch, self.run.name,
                                   self.run.job.settle_s)
        view = self.watch.execution
        vs = [evidence.judge(obs, subject, evidence.Check.of(p, label, self.watch.want_markers, view is not None))
              for p, label in zip(self.watch.patches, self.watch.labels)]
        return vs if view is None else [self._with_execution(v, label, obs) for v, label in zip(vs, self.watch.labels)]

    def _with_execution(self, v: evidence.Verdict, label: str, obs: evidence.Observation) -> evidence.Verdict:
        """The markers' verdict with what the probe saw (steps/execution.py)."""
        from . import execution
        view = self.watch.execution
        block = execution.exe_note(view.block(label), view)
        self.timings["execution"] = {k: block[k] for k in ("mode", "pids", "ran", "imported", "not_run", "traced",
                                                           "message")}
        settled = obs.since_ready_s is not None and obs.since_ready_s >= self.run.job.settle_s
        ctx = execution.Context(self.run.name, label, self.run.profile, self.run.version, settled, obs.timed_out,
                                time.monotonic() - self.t0)
        return execution.fold(v, block, ctx, marker_seen=bool(v.markers_seen))

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
        patches = self.watch.patches
        texts = [self.events.ready_line] + [t for p in patches for t in list(p.expect or []) + list(p.forbid or [])
                                            if t]
        markers = [m for p in patches for m in (p.markers or {}).values()]
        for line in ev.get("lines") or ():
            if any(t in line for t in texts) or any(_marker_matches(m, line) for m in markers):
                return True
        return False

    def on_event(self, ev: dict) -> list[evidence.Verdict] | None:
        """The final verdicts once decided, else None (keep listening)."""
        if ev.get("t") == "probe" and self.watch.execution is not None:
            self.watch.execution.add(ev)
        self.events.add(ev)
        elapsed = time.monotonic() - self.t0
        timed_out = elapsed >= self.run.timeout or ev.get("t") == "deadline"
        if not self._worth_judging(ev, timed_out):
            return None
        vs = self.judge(timed_out)
        self.last_judged = time.monotonic()
        self.judge_s = self.last_judged - (self.t0 + elapsed)
        waiting = [v for v in vs if not v.final]
        self.run.progress("verify", f"{elapsed:4.1f}s " + (
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
        at=at, status=str(Status.VERIFIED if judging.ok else vs[0].status), labels=list(judging.watch.labels),
        check=check))
    if judging.watch.want_markers:
        for p, v in zip(judging.watch.patches, vs):
            update["verification"][p.name] = protocol.Verification(status=str(v.status),
                                                                   executed_path=v.executed_path, at=at)
    return update


def follow_request(host: Host, job: Job, start: dict, timeout: float, probe: bool = False) -> protocol.FollowRequest:
    """The follow of the log window `start` (or protocol.AFTER_RESTART); `probe`: stream the probe's records too."""
    req = protocol.FollowRequest(**base_request(host, job), inode=start.get("inode"), offset=start.get("offset", 0),
                                 pid=start.get("pid"), timeout=timeout, ready_line=get_profile(host.engine.kind).ready_line,
                                 server_info_url=server_info_url(host.server.health_url))
    if start.get("after_restart"):
        req["after_restart"] = True
    if probe:
        req["probe"] = True
    return req


def follow_ahead(job: Job, host: Host, probe: bool = False) -> dict:
    """The follow to send with a request that restarts: the agent runs it on that
    restart's window as soon as the restart is done, without waiting for the laptop
    to read the answer and ask (a round trip). A Watch from protocol.AFTER_RESTART takes it up."""
    timeout = job.timeout if job.timeout is not None else float(host.server.ready_timeout)
    return dict(follow_request(host, job, protocol.AFTER_RESTART, timeout, probe), op="follow")


def follow_and_judge(run: HostRun, watch: Watch) -> tuple[list[evidence.Verdict], dict]:
    """Stream the log from `watch.start` and judge as lines arrive. The decision goes
    back on the same channel as follow-ups: record the verdict, and release the run's
    lock when `watch.ends_work(ok)` says nothing follows under it, so verification
    costs one round trip. The timings carry the events seen (for -v)."""
    judging = Judging(run, watch, EventLog(run.profile.ready_line, watch.launch))
    lock = run.lock
    req = follow_request(run.host, run.job, watch.start, run.timeout, probe=watch.execution is not None)

    def on_event(ev: dict) -> list | None:
        decided = judging.on_event(ev)
        # The window holds what it keeps; Remote keeps every event until the result,
        # so a chatty log must not stay in memory twice.
        ev.pop("lines", None)
        if decided is None:
            return None
        # the verdict is in: the probe comes out first (the server keeps running, unwatched)
        followups = [run.request(op="probe_off")] if watch.execution is not None else []
        followups.append(run.request(op="record", ledger_update=ledger_update(judging, watch.recorded_as)))
        if lock is not None and watch.ends_work(judging.ok):
            followups += lock.release_followup()
        return followups

    reply = run.remote.stream("follow", req, on_event, timeout=run.timeout)
    if lock is not None:
        lock.chained_done(reply)
    if judging.verdicts is None:  # the stream ended before a decision (the server host went away)
        judging.verdicts = judging.judge(True)
    judging.timings["server_facts"] = judging.events.facts()
    if judging.events.dropped:
        judging.timings["log_lines_not_kept"] = judging.events.dropped
        if not judging.ok:
            for v in judging.verdicts:
                v.message += (f"\n  note: the log grew by {judging.events.dropped} more lines after the first "
                              f"{EventLog.MAX_LINES} since the restart; only those first lines were judged")
    return judging.verdicts, judging.timings


def verdict_result(run: HostRun, verdicts: list[evidence.Verdict], labels: list[str], timings: dict) -> HostResult:
    bad = [v for v in verdicts if v.status not in SUCCESS]
    main = bad[0] if bad else verdicts[0]
    markers = [m for v in verdicts for m in v.markers_seen]
    message = "\n".join(v.message for v in (bad or verdicts))
    return run.result(not bad, Status(main.status), message, patch=",".join(labels),
                      executed_path=main.executed_path, markers=markers,
                      details={"cause": main.cause, "evidence": [e.__dict__ for e in main.evidence], **timings})
