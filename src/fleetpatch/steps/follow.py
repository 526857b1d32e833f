"""The follow: the log after a restart streamed from the host and judged as it
arrives; the decision (record the verdict, maybe release the lock) goes back on
the same channel."""
from __future__ import annotations

import bisect
import collections
import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit, urlunsplit

from .. import lockview, protocol
from ..engines import LaunchConfig
from ..errors import HostFailure, Status
from ..hostcalls import HostResult, base_request, smoke_fields
from ..inventory import Host
from .context import HostRun, Job, lock_claim, profile_of, server_info_url

if TYPE_CHECKING:  # imported where a verdict is made, not on the way to the first connect
    from .. import evidence

SUCCESS = (Status.VERIFIED, Status.ROLLED_BACK)

SMOKE_TIMEOUT_S = 60.0   # one smoke request's answer

# How long a decided failure waits for the rest of the server's last words
# (the agent reports every 50 ms; a dying process's traceback lands within that).
FAILURE_GRACE_S = 0.5


class PeerSmoke:
    """Rank 0's smoke requests, as the other ranks of its node group wait on them: a rank above 0
    serves no HTTP, yet its worker runs every request rank 0 takes, so a line that runs per
    request is proven there only once rank 0's smoke requests were answered (then prove.wait).
    Rank 0's follow says when they were answered, or that it ended without them (`over`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.answered_at: float | None = None   # laptop clock
        self.started_epoch: float | None = None  # rank 0's host clock when they began (proved_by)
        self.over = False

    def started(self, epoch: float | None) -> None:
        with self._lock:
            self.started_epoch = epoch

    def answered(self) -> None:
        with self._lock:
            if self.answered_at is None:
                self.answered_at = time.monotonic()

    def finish(self) -> None:
        with self._lock:
            self.over = True

    def waited_on(self) -> tuple[bool, float | None]:
        """(whether a rank above 0 settles from the answers, when they came): (False, None) once
        rank 0's follow ended without them (it failed: so does the group, and nothing is waited on)."""
        with self._lock:
            return not (self.over and self.answered_at is None), self.answered_at


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
    # a run that holds no lock (verify-logs): the record takes the host's lock, for this command
    record_lock: str | None = None
    # execution.ExecutionView while the probe judges execution too (None: markers alone)
    execution: object | None = None
    # probe.verdict.Timeline (host clock): the ready time, the smoke requests' window, for
    # execution.proved_by; what is None here is filled from the follow (its ready line, its smoke)
    timeline: object | None = None
    # the smoke requests the follow sends once the server is ready (smoke_spec), with patch.yaml's
    # prove.wait: how long, after their answers, a patch none of whose lines ran yet is still watched
    smoke: dict | None = None
    smoke_wait: float = 0.0
    # a node group's rank 0 smoke requests (PeerSmoke): rank 0 says when they were answered, a rank
    # above 0 is judged only after that (and smoke_wait), as rank 0 is after its own
    peer_smoke: PeerSmoke | None = None

    @property
    def recorded_as(self) -> str:
        return self.check or ("deploy" if self.want_markers else "rollback")


class Needles:
    """What makes a log line worth keeping for the verdict: the ready line, the patches'
    markers, expect and forbid lines, and the profile's signatures (the lines that show
    the path, the settings dump, the failure lines). Texts are substrings and patterns
    are compiled with re.M, so a whole batch is searched as one string (at C speed) and
    only the lines that hold a hit are looked at. A profile that does not list its
    signatures is `exhaustive`: each batch goes through its own log_facts/find_failures."""

    def __init__(self, profile, version: str | None, patches: list, ready_line: str):
        self.profile, self.version = profile, version
        texts: list[str] = [ready_line] + [t for p in patches for t in list(p.expect or []) + list(p.forbid or [])
                                           + list(getattr(p, "smoke_expect", None) or []) if t]
        patterns: list[str] = []
        self.odd_markers = []   # markers with neither a literal nor a regex: matched line by line
        for m in (m for p in patches for m in (p.markers or {}).values()):
            if getattr(m, "literal", None):
                texts.append(m.literal)
            elif getattr(m, "regex", None):
                patterns.append(m.regex)
            else:
                self.odd_markers.append(m)
        failures = getattr(profile, "failure_signatures", None)
        range_for = getattr(profile, "range_for", None)
        self.exhaustive = failures is None or range_for is None
        self.failure_texts, self.failure_patterns = self._split(failures(version) if failures else [])
        route_sigs = getattr(range_for(version) if range_for and version else None, "signatures", ()) or ()
        more_texts, more_patterns = self._split(route_sigs)
        texts += more_texts + [w[:-3] for w in getattr(profile, "whole_evidence", ()) if w.endswith("...")]
        texts += [sig.text for sig in getattr(profile, "compiled_cache_lines", ())]   # a cache load, for the verdict
        self.texts = list(dict.fromkeys(t for t in texts + self.failure_texts if t))
        self.patterns = [self._compile(r) for r in dict.fromkeys(patterns + more_patterns + self.failure_patterns)]
        self.patterns = [r for r in self.patterns if r is not None]

    @staticmethod
    def _split(sigs) -> tuple[list, list]:
        texts = [s.text for s in sigs if getattr(s, "regex", None) is None and getattr(s, "text", None)]
        return texts, [s.regex for s in sigs if getattr(s, "regex", None)]

    @staticmethod
    def _compile(regex: str):
        try:
            return re.compile(regex, re.M)
        except re.error:   # a broken marker never matches (evidence does the same)
            return None

    def hits(self, lines: list[str], blob: str, quota: dict) -> tuple[set, int | None]:
        """The indexes of `lines` worth keeping, and the first that holds a failure (None:
        none). `quota` counts the lines kept per needle: a needle stops being looked for
        once it has kept its share (a marker logged at every request keeps its first ones)."""
        out: set[int] = set()
        starts: list[int] = []
        for needle in self.texts:
            at = blob.find(needle) if quota.get(needle, 0) < EventLog.MOST_PER_NEEDLE else -1
            while at >= 0 and quota.get(needle, 0) < EventLog.MOST_PER_NEEDLE:
                i = self._line_at(lines, starts, at)
                out.add(i)
                quota[needle] = quota.get(needle, 0) + 1
                at = blob.find(needle, starts[i + 1])
        for rx in self.patterns:
            m = rx.search(blob) if quota.get(rx.pattern, 0) < EventLog.MOST_PER_NEEDLE else None
            while m is not None and quota.get(rx.pattern, 0) < EventLog.MOST_PER_NEEDLE:
                i = self._line_at(lines, starts, m.start())
                if rx.search(lines[i]):   # not a match that spans lines
                    out.add(i)
                    quota[rx.pattern] = quota.get(rx.pattern, 0) + 1
                m = rx.search(blob, starts[i + 1])
        if self.odd_markers or self.exhaustive:
            out |= self._line_by_line(lines)
        failed = [i for i in sorted(out) if self._is_failure(lines[i])]
        return out, (failed[0] if failed else None)

    @staticmethod
    def _line_at(lines: list[str], starts: list[int], at: int) -> int:
        if not starts:   # where each line starts in the batch's blob (computed once, on the first hit)
            starts.extend(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
        return bisect.bisect_right(starts, at) - 1

    def _line_by_line(self, lines: list[str]) -> set[int]:
        out = {i for i, line in enumerate(lines) if any(_marker_matches(m, line) for m in self.odd_markers)}
        if self.exhaustive:
            facts = self.profile.log_facts(self.version, lines, 0)
            out.update(ev.line_no for ev in list(facts.evidence.values()) + list(facts.notes)
                       if ev.line_no is not None)
            out.update(i for i, _sig in self.profile.find_failures(self.version, lines))
        return out

    def _is_failure(self, line: str) -> bool:
        if self.exhaustive:
            return bool(self.profile.find_failures(self.version, [line]))
        return any(t in line for t in self.failure_texts) or any(
            re.search(r, line) for r in self.failure_patterns)


class EventLog:
    """What the follow stream has told so far: the log window, the server's
    state, its /server_info and how it was launched.

    Every line since the restart is judged, however many, in memory that does not
    grow with the log: a batch is searched for what can decide (`Needles`) as it
    arrives, and only these lines are kept: the first HEAD_LINES (how the server
    started), every line that holds a needle (up to MOST_PER_NEEDLE per needle), the
    AFTER_FAILURE lines after a failure line (its traceback), and the last TAIL_LINES
    (a failure's last words). Each is cut to LINE_MOST characters."""

    HEAD_LINES = 1000
    TAIL_LINES = 200
    MOST_PER_NEEDLE = 200
    AFTER_FAILURE = 100
    LINE_MOST = 1 << 16    # a settings dump is ~20 kB; a line is at most the agent's 1 MB read

    def __init__(self, ready_line: str, launch: LaunchConfig, needles: Needles | None = None):
        self.ready_line = ready_line
        self.needles = needles
        self.kept: dict[int, str] = {}      # line number -> line: what the verdict may need
        self.arrived: dict[int, float] = {}  # when each kept line reached the laptop
        self.tail: collections.deque = collections.deque(maxlen=self.TAIL_LINES)   # (line number, line)
        self.quota: dict = {}
        self.first_line_no: int | None = None
        self.next_no = 0
        self.total = 0                  # lines since the restart, all judged
        self.after_failure = 0          # lines still to keep after a failure line
        self.decisive = False           # the last batch held a line that can decide
        self.alive: bool | None = None
        self.healthy: bool | None = None
        self.server_info: dict | None = None
        self.ready_at: float | None = None
        self.ready_epoch: float | None = None   # the host's clock when the agent saw the ready line
        self.launch = launch
        self.smoke_epoch: float | None = None   # the host's clock when the smoke requests began
        self.smoke: dict | None = None          # the follow's `smoke` event: every answer is in
        self.smoke_at: float | None = None      # when it arrived (laptop clock)

    def add(self, ev: dict) -> None:
        kind = ev.get("t")
        self.decisive = kind != "lines"
        if kind == "lines":
            self._add_lines(ev)
        elif kind == "state":
            self.alive, self.healthy = ev.get("alive"), ev.get("healthy")
        elif kind == "server_info":
            self.server_info = ev.get("data")
        elif kind == "smoke":
            self.smoke, self.smoke_at = ev, time.monotonic()
        elif kind == "smoke_started":
            self.smoke_epoch = ev.get("started")
        elif kind == "ready" and self.ready_epoch is None:
            self.ready_epoch = ev.get("at")
        elif kind == "launch" and ev.get("argv"):
            # After a restart the running process is the one to read, not what it was before.
            self.launch = LaunchConfig(argv=ev["argv"], env=ev.get("env") or {}, source="process")

    def _add_lines(self, ev: dict) -> None:
        if self.first_line_no is None:
            self.first_line_no = self.next_no = ev["first_line_no"]
        now, lines, first = time.monotonic(), ev["lines"], self.next_no
        n = len(lines)
        keep = set(range(min(n, max(0, self.HEAD_LINES - self.total), )))
        keep.update(range(min(n, self.after_failure)))
        self.after_failure = max(0, self.after_failure - n)
        blob = "\n".join(lines)
        if self.needles is not None:
            hits, failed = self.needles.hits(lines, blob, self.quota)
            keep |= hits
            self.decisive = bool(hits)
            if failed is not None:
                keep.update(range(failed, min(n, failed + self.AFTER_FAILURE)))
                self.after_failure = max(self.after_failure, failed + self.AFTER_FAILURE - n)
        for i in sorted(keep):
            self.kept[first + i] = lines[i][:self.LINE_MOST]
            self.arrived[first + i] = now
        self.tail.extend((first + i, lines[i][:self.LINE_MOST]) for i in range(max(0, n - self.TAIL_LINES), n))
        if self.ready_at is None and self.ready_line in blob:
            self.ready_at = now
        self.next_no += n
        self.total += n

    def window(self) -> tuple[list[int], list[str]]:
        """The kept lines in log order: their numbers, and the lines."""
        merged = dict(self.kept)
        merged.update(self.tail)
        nos = sorted(merged)
        return nos, [merged[no] for no in nos]

    def observation(self, timed_out: bool, smoke_sent: bool = False,
                    answered_at: float | None = None) -> evidence.Observation:
        """`smoke_sent`: the server settles from the smoke requests' last answer (`answered_at`,
        laptop clock; None: not yet), not from its ready line."""
        from .. import evidence
        since_ready = None if self.ready_at is None else time.monotonic() - self.ready_at
        if smoke_sent and since_ready is not None:
            since_ready = 0.0 if answered_at is None else time.monotonic() - max(answered_at, self.ready_at)
        nos, lines = self.window()
        return evidence.Observation(lines=lines, first_line_no=self.first_line_no or 1,
                                    server_info=self.server_info, alive=self.alive, healthy=self.healthy,
                                    since_ready_s=since_ready, timed_out=timed_out, line_nos=nos,
                                    total_lines=self.total)

    def arrival_of(self, line_no: int) -> float | None:
        return self.arrived.get(line_no)

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
        smoke_sent, answered_at = self._smoke_answers()
        obs = self.events.observation(timed_out, smoke_sent, answered_at)
        subject = evidence.Subject(self.run.profile, self.run.version, self.events.launch, self.run.name,
                                   self.run.job.settle_s)
        view = self.watch.execution
        vs = [evidence.judge(obs, subject, self._check(p, label)) for p, label in zip(self.watch.patches,
                                                                                       self.watch.labels)]
        if view is not None:
            vs = [self._with_execution(v, label, obs) for v, label in zip(vs, self.watch.labels)]
        failed = smoke_failure(self.events.smoke, self.watch.smoke)
        if failed is not None:
            vs = [_smoke_failed(v, self.run.name, label, failed) for v, label in zip(vs, self.watch.labels)]
        return vs

    def _smoke_answers(self) -> tuple[bool, float | None]:
        """(whether this server settles from smoke answers, when they came: laptop clock): its own,
        or on a rank above 0 of a node group, rank 0's."""
        peer = self.watch.peer_smoke
        if peer is not None and self.run.host.node_rank:
            return peer.waited_on()
        return self.watch.smoke is not None, self.events.smoke_at

    def _smoke_epoch(self) -> float | None:
        """When the smoke requests this server served began (host clock): on a rank above 0, rank 0's."""
        peer = self.watch.peer_smoke
        if peer is not None and self.run.host.node_rank:
            return peer.started_epoch
        return self.events.smoke_epoch

    def _check(self, patch, label: str):
        from .. import evidence
        check = evidence.Check.of(patch, label, self.watch.want_markers, self.watch.execution is not None)
        if self.run.host.node_rank:   # the expect lines are rank 0's to log: it alone runs the HTTP side
            check.expect = []
        elif self.watch.smoke is not None and self.watch.want_markers:
            # with the smoke requests sent, their lines are judged with the rest (not after a rollback: gone)
            check.expect = check.expect + [e for e in getattr(patch, "smoke_expect", None) or [] if e]
        return check

    def _with_execution(self, v: evidence.Verdict, label: str, obs: evidence.Observation) -> evidence.Verdict:
        """The markers' verdict with what the probe saw (steps/execution.py)."""
        from . import execution
        view = self.watch.execution
        block = execution.exe_note(view.block(label), view)
        settle_s = self.run.job.settle_s
        if self._smoke_answers()[0] and waits_for_traffic(block):
            # a patched file ran, none of its added lines yet: their condition may hold for a later
            # request, so they are watched prove.wait after the smoke answers (a proof ends it at once)
            settle_s = max(settle_s, self.watch.smoke_wait)
        settled = obs.since_ready_s is not None and obs.since_ready_s >= settle_s
        ctx = execution.Context(self.run.name, label, self.run.profile, self.run.version, settled, obs.timed_out,
                                time.monotonic() - self.t0, execution.timeline_of(
                                    self.watch.timeline,
                                    # a re-read (verify-logs) sees the ready line now: the ledger's time is the one
                                    None if self.watch.recorded_as == "verify-logs" else self.events.ready_epoch,
                                    self._smoke_epoch()))
        ctx.compiled_cache = self.run.profile.compiled_from_cache(obs.lines, obs.line_nos)
        v = execution.fold(v, block, ctx, marker_seen=bool(v.markers_seen))
        self.timings["execution"] = {k: block[k] for k in ("mode", "pids", "ran", "imported", "not_run", "traced",
                                                           "proved_by", "calls", "message", "pid_namespace",
                                                           "ran_in", "compiled")
                                     if k in block}
        return v

    # A batch of lines that holds nothing that can decide is judged at most this often:
    # the judgement reads the kept window, which a chatty log does not grow.
    JUDGE_EVERY_S = 0.25

    def _worth_judging(self, ev: dict, timed_out: bool) -> bool:
        """Judge at once when the batch held a line that can decide (the ready line, a marker,
        an expect or forbid text, a signature), or any other event; else at most every JUDGE_EVERY_S."""
        if ev.get("t") != "lines" or timed_out or self.last_judged is None or self.events.decisive:
            return True
        return time.monotonic() - self.last_judged >= max(self.JUDGE_EVERY_S, 2 * self.judge_s)

    def on_event(self, ev: dict) -> list[evidence.Verdict] | None:
        """The final verdicts once decided, else None (keep listening)."""
        if ev.get("t") == "probe" and self.watch.execution is not None:
            self.watch.execution.add(ev)
        self.events.add(ev)
        peer = self.watch.peer_smoke
        if peer is not None and not self.run.host.node_rank:
            if ev.get("t") == "smoke_started":
                peer.started(ev.get("started"))
            elif ev.get("t") == "smoke":
                peer.answered()   # the other ranks' wait ends here (then prove.wait)
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
        if waiting or self._in_failure_grace(vs, timed_out) or self._smoke_unanswered(vs, timed_out):
            return None   # a host in flight always finishes its verdict
        self.decided(vs, elapsed)
        return vs

    def _smoke_unanswered(self, vs: list[evidence.Verdict], timed_out: bool) -> bool:
        """A success waits for the smoke requests' answers (a proof at start-up included: the
        server must also answer requests); a failure does not. A rank above 0 waits for rank 0's:
        a line it ran is called `smoke` or `traffic` by when they began, which rank 0's own
        stream may bring after this rank's record of the line."""
        if timed_out or self.events.alive is False or not all(v.status in SUCCESS for v in vs):
            return False
        peer = self.watch.peer_smoke
        if peer is not None and self.run.host.node_rank:
            waits, answered_at = peer.waited_on()
            return waits and answered_at is None
        return self.watch.smoke is not None and self.events.smoke is None

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


def waits_for_traffic(block: dict) -> bool:
    """Whether a patched file was imported and none of its added lines ran (the probe's view)."""
    from ..probe.verdict import NO_LINE_RAN
    return any(why == NO_LINE_RAN for why in (block.get("not_run") or {}).values())


def server_base_url(host: Host) -> str | None:
    """The server's base URL as the host reaches it: server.url, else its health URL's scheme and address."""
    if host.server.url:
        return host.server.url
    if not host.server.health_url:
        return None
    parts = urlsplit(host.server.health_url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def smoke_failure(event: dict | None, spec: dict | None) -> str | None:
    """Why the smoke requests failed (how many, the first bad answer's status and first body
    line), or None: not all answered yet, or every one answered with text (as the spec's
    `answer` reads it: SGLang's `text`, vLLM's choices[0].text). Pure."""
    if not event:
        return None
    from ..router import check_smoke_answer, first_line
    spec = spec or {}
    statuses = event.get("statuses") or []
    for shown in event.get("bodies") or []:
        body = protocol.unpack(shown["body"])
        why = check_smoke_answer(shown["status"], body, spec.get("answer", "text")) \
            if shown.get("status") is not None else f"no answer ({first_line(body)})"
        if why and event.get("auth"):   # a 401: the host says whether it had the server's API key
            why = f"{why}; {event['auth']}"
        if why:
            bad = sum(1 for st in statuses if st != 200) or 1
            return (f"{bad} of {len(statuses)} smoke request{'s' if len(statuses) > 1 else ''} to "
                    f"{spec.get('url', 'the server')}{spec.get('path', '/generate')} failed; the first: {why}")
    return None


def _smoke_failed(v, host: str, label: str, why: str):
    """A verdict that a failed smoke request overrides: any but a failure already final."""
    if v.final and v.status not in SUCCESS and v.status not in (Status.PENDING, Status.RESTART_FAILED,
                                                                  Status.UNPROVEN):
        return v
    died = v.status == Status.RESTART_FAILED   # the server died serving them: its last words say why
    v.status, v.final = Status.SMOKE_FAILED, True
    v.message = (f"FAIL {host}  {label} smoke-failed: the server does not answer requests\n  {why}"
                 + ("\n" + v.message if died else ""))
    return v


def smoke_spec(host: Host, patch) -> protocol.SmokeSpec | None:
    """The smoke requests a restarted server gets before its verdict (patch.yaml's `prove`), or
    None: prove.requests 0, no server.url, or a rank above 0 of a node group (rank 0 serves HTTP)."""
    prove = getattr(patch, "prove", None)
    requests = prove.requests if prove is not None else 1
    url = server_base_url(host)
    if host.node_rank or not url or requests <= 0:
        return None
    conf = host.server.smoke
    max_new_tokens = prove.max_new_tokens if prove and prove.max_new_tokens else conf.max_new_tokens
    return protocol.SmokeSpec(url=url, prompt=conf.prompt, max_new_tokens=max_new_tokens,
                              requests=requests, concurrency=prove.concurrency if prove is not None else 1,
                              timeout=SMOKE_TIMEOUT_S, **smoke_fields(host, conf.prompt, max_new_tokens))


def rollback_smoke(host: Host, patches: list) -> protocol.SmokeSpec | None:
    """The smoke requests after a rollback's restart: the deploy's (the first of `patches`' prove
    block), so the server is proven to answer requests without the patch; no added line is wanted."""
    return smoke_spec(host, patches[0]) if patches else None


def smoke_note(timings: dict) -> list[str]:
    """The line that says a restarted server answered its smoke requests (none when none were sent)."""
    statuses = (timings.get("smoke") or {}).get("statuses") or []
    if not statuses:
        return []
    what = "its smoke request" if len(statuses) == 1 else f"its {len(statuses)} smoke requests"
    return [f"  the restarted server answered {what} (HTTP {', '.join(sorted({str(s) for s in statuses}))})"]


def prove_wait(patch) -> float:
    """patch.yaml's prove.wait: how long after the smoke answers a patch none of whose lines ran is watched."""
    return float(getattr(getattr(patch, "prove", None), "wait", 10.0))


def smoke_timeline(events: EventLog, spec: dict | None) -> dict | None:
    """The smoke requests as the report keeps them: how many, and when they began and ended
    (the host's clock, as the probe's records are stamped)."""
    if spec is None:
        return None
    ev = events.smoke or {}
    return {"requests": spec.get("requests"), "concurrency": spec.get("concurrency"),
            "max_new_tokens": spec.get("max_new_tokens"), "started": ev.get("started"),
            "ended": ev.get("ended"), "statuses": ev.get("statuses")}


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


def follow_request(host: Host, job: Job, start: dict, timeout: float, probe: bool = False,
                   smoke: protocol.SmokeSpec | None = None) -> protocol.FollowRequest:
    """The follow of the log window `start` (or protocol.AFTER_RESTART); `probe`: stream the probe's
    records too; `smoke`: the smoke requests to send once the server is ready."""
    req = protocol.FollowRequest(**base_request(host, job), inode=start.get("inode"), offset=start.get("offset", 0),
                                 pid=start.get("pid"), timeout=timeout, ready_line=profile_of(host).ready_line,
                                 # a rank above 0 answers only the dummy /health
                                 server_info_url=None if host.node_rank else server_info_url(
                                     host.server.health_url, profile_of(host).server_info_path))
    if start.get("after_restart"):
        req["after_restart"] = True
    if probe:
        req["probe"] = True
    if smoke:
        req["smoke"] = smoke
    return req


def follow_ahead(job: Job, host: Host, probe: bool = False, smoke: protocol.SmokeSpec | None = None) -> dict:
    """The follow to send with a request that restarts: the agent runs it on that
    restart's window as soon as the restart is done, without waiting for the laptop
    to read the answer and ask (a round trip). A Watch from protocol.AFTER_RESTART takes it up."""
    timeout = job.timeout if job.timeout is not None else float(host.server.ready_timeout)
    return dict(follow_request(host, job, protocol.AFTER_RESTART, timeout, probe, smoke), op="follow")


def follow_and_judge(run: HostRun, watch: Watch) -> tuple[list[evidence.Verdict], dict]:
    """Stream the log from `watch.start` and judge as lines arrive. The decision goes
    back on the same channel as follow-ups: record the verdict, and release the run's
    lock when `watch.ends_work(ok)` says nothing follows under it, so verification
    costs one round trip. The timings carry the events seen (for -v)."""
    needles = Needles(run.profile, run.version, watch.patches, run.profile.ready_line)
    judging = Judging(run, watch, EventLog(run.profile.ready_line, watch.launch, needles))
    lock = run.lock
    req = follow_request(run.host, run.job, watch.start, run.timeout, probe=watch.execution is not None,
                         smoke=watch.smoke)

    def on_event(ev: dict) -> list | None:
        decided = judging.on_event(ev)
        # The window keeps what can decide; Remote keeps every event until the result,
        # so a chatty log must not stay in memory there.
        ev.pop("lines", None)
        if decided is None:
            return None
        # the verdict is in: the probe comes out first (the server keeps running, unwatched)
        followups = [run.request(op="probe_off")] if watch.execution is not None else []
        record = run.request(op="record", ledger_update=ledger_update(judging, watch.recorded_as))
        if lock is None and watch.record_lock:
            record["lock"] = lock_claim(run.job, watch.record_lock)
        followups.append(record)
        if lock is not None and watch.ends_work(judging.ok):
            followups += lock.release_followup()
        return followups

    reply = run.remote.stream("follow", req, on_event, timeout=run.timeout)
    if lock is not None:
        lock.chained_done(reply)
    if judging.verdicts is None:  # the stream ended before a decision (the server host went away)
        judging.verdicts = judging.judge(True)
    refused = next((r for r in reply.get("then") or [] if r.get("recorded") is False), None)
    if refused is not None:
        raise HostFailure(Status.LOCKED, not_recorded(run, refused.get("lock") or {}, judging))
    if reply.get("timings"):   # the agent's own CPU at the follow's end (the report's follow_timings)
        judging.timings["follow_timings"] = reply["timings"]
    judging.timings["server_facts"] = judging.events.facts()
    if watch.smoke is not None:
        judging.timings["smoke"] = smoke_timeline(judging.events, watch.smoke)
    # every line since the restart was judged; these were kept for the verdict
    judging.timings["log_lines"] = judging.events.total
    judging.timings["log_lines_kept"] = len(judging.events.kept)
    return judging.verdicts, judging.timings


def not_recorded(run: HostRun, held: dict, judging: Judging) -> str:
    """A verdict judged, not recorded: another run held the host's lock (whose, and what to do)."""
    verdict = Status.VERIFIED if judging.ok else judging.verdicts[0].status
    return (lockview.refusal(run.name, held, held.get("command"), run.job.inventory_arg)
            + f"\n  the log was judged ({verdict}) but the verdict was not recorded: the ledger is written only "
              "under the host's lock; rerun once that run has ended")


def verdict_result(run: HostRun, verdicts: list[evidence.Verdict], labels: list[str], timings: dict) -> HostResult:
    bad = [v for v in verdicts if v.status not in SUCCESS]
    main = bad[0] if bad else verdicts[0]
    markers = [m for v in verdicts for m in v.markers_seen]
    message = "\n".join(v.message for v in (bad or verdicts))
    return run.result(not bad, Status(main.status), message, patch=",".join(labels),
                      executed_path=main.executed_path, markers=markers,
                      details={"cause": main.cause, "evidence": [e.__dict__ for e in main.evidence], **timings})
