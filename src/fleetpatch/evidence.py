"""Did the patched code path execute?  Pure: a log window, /server_info and the
launch configuration in, a Verdict out.  No SSH, no clock (times come in the
Observation), and no engine: what the log lines mean (the ready line, the log
prefix, which settings pick the path) comes from the engine profile
(`fleetpatch.engines.base.EngineProfile`).

Which path runs is worked out by the engine profile, in this order of trust:

1. the log window: for SGLang the ServerArgs dump (final values) and the
   version's routing warnings;
2. /server_info, when the server answered it;
3. the launch configuration (argv + environment), as the fallback and as the
   human cause.

The log and /server_info must agree; if they name different paths the verdict
is a final "not-executed" with an "evidence conflict" cause.  Only the marker of
the path that runs (or of a code path it inherits from) can verify; a marker
of another path never does.

Markers are used only through `.matches(line)` and `.describe()` (and, when it
is there, `.literal`: a line matched by two markers is credited to the more
specific one, so "Dynamic speculation disable enabled" does not claim the V2
line "Dynamic speculation disable enabled ... V2").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .engines.base import EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution
from .errors import Status

STATUSES = (Status.VERIFIED, Status.NOT_EXECUTED, Status.RESTART_FAILED, Status.TIMEOUT, Status.PENDING,
            Status.ROLLED_BACK, Status.ERROR)
# Rollback check that still finds a marker of the patch: the patched code still runs.
ROLLBACK_STILL_PATCHED = Status.ERROR

LAST_LINES = 15
EVIDENCE_WIDTH = 50        # "Overlap scheduler is disabled when spec v2 is off ..."
MARKER_WIDTH = 72
TAIL_WIDTH = 200


@dataclass
class Observation:
    lines: List[str]               # log lines written since the restart (window), without newline
    first_line_no: int             # 1-based line number (in the current log file) of lines[0]
    server_info: Optional[dict]    # /server_info JSON if the server answered it
    alive: Optional[bool]          # server process alive
    healthy: Optional[bool]        # health_url answered 200
    since_ready_s: Optional[float]  # seconds since the ready line was first seen (None = not seen)
    timed_out: bool                # the --timeout has passed
    # A window that keeps only what can decide (steps.follow.EventLog): the line number of
    # each of `lines` (None: they are consecutive from first_line_no), and how many lines
    # the server logged since the restart in all (None: len(lines)).
    line_nos: Optional[List[int]] = None
    total_lines: Optional[int] = None


@dataclass
class Verdict:
    status: str                    # one of STATUSES
    final: bool
    executed_path: Optional[str]
    evidence: List[Evidence]
    cause: str
    markers_seen: List[dict]       # {"path", "line_no", "text"}
    missing: List[str]             # what was not seen (ready line / markers / expect lines / health)
    message: str                   # the loud multi-line explanation (the README's FAIL format)


@dataclass
class Subject:
    """The server being judged: the same for every look at one host's restart
    (but `launch`, which the agent may report once the new process runs)."""

    profile: EngineProfile
    version: Optional[str]
    launch: Optional[LaunchConfig]
    host: str
    settle_s: float = 2.0          # after the ready line, how long a missing marker may still come


@dataclass
class Check:
    """What one patch asks of the window."""

    label: str                     # "name@rev", for messages
    markers: Dict[str, Any]        # code path -> marker
    expect: List[str] = field(default_factory=list)
    forbid: List[str] = field(default_factory=list)
    want_markers: bool = True      # False: a rollback check (no marker may appear)
    # True while the probe judges execution: a path without a marker needs none (the probe proves it)
    markers_optional: bool = False

    @classmethod
    def of(cls, patch, label: str, want_markers: bool = True, markers_optional: bool = False) -> "Check":
        """The check of a patchset.Patch (anything with markers, expect and forbid)."""
        return cls(label, dict(patch.markers or {}), [e for e in (patch.expect or []) if e],
                   [f for f in (patch.forbid or []) if f], want_markers, markers_optional)


# ----------------------------------------------------------------- helpers
def shorten(text: str, width: int) -> str:
    """`text` cut at a word boundary to at most `width` characters, plus " ..."."""
    text = text.strip()
    if len(text) <= width:
        return text
    cut = text[:width]
    space = cut.rfind(" ")
    if space >= width // 2:
        cut = cut[:space]
    return cut.rstrip() + " ..."


def _matches(marker, line: str) -> bool:
    try:
        return bool(marker.matches(line))
    except Exception:  # a broken marker never matches; patchset validates them
        return False


def _narrower(q, k) -> bool:
    """Marker q is more specific than marker k: q does not match k's own literal text."""
    lit = getattr(k, "literal", None)
    return isinstance(lit, str) and bool(lit) and not _matches(q, lit)


def attribute_markers(lines: Sequence[str], markers: Mapping[str, Any]) -> List[Tuple[int, List[str]]]:
    """(index, [path names]) for every line that matches a marker, crediting a line
    matched by several markers to the most specific ones."""
    out = []
    for i, line in enumerate(lines):
        keys = [k for k, m in markers.items() if _matches(m, line)]
        if len(keys) > 1:
            kept = [k for k in keys if not any(_narrower(markers[q], markers[k]) for q in keys if q != k)]
            keys = kept or keys
        if keys:
            out.append((i, keys))
    return out


class _Window:
    """One observation read through the engine profile, and how to quote it."""

    def __init__(self, obs: Observation, subject: Subject, label: str):
        self.obs, self.subject, self.profile, self.version = obs, subject, subject.profile, subject.version
        self.host, self.label = subject.host, label
        self.lines = [str(l).rstrip("\r\n") for l in (obs.lines or [])]
        self.first = obs.first_line_no or 1
        self.nos = obs.line_nos if obs.line_nos is not None and len(obs.line_nos) == len(self.lines) else None
        self.count = obs.total_lines if obs.total_lines is not None else len(self.lines)   # lines since the restart
        ready_line = self.profile.ready_line
        self.ready = obs.since_ready_s is not None or any(ready_line in l for l in self.lines)
        self.settled = obs.since_ready_s is not None and obs.since_ready_s >= subject.settle_s
        self.health_ok = obs.healthy is True or (obs.healthy is None and self.ready)
        self.unknown_release = not _knows(self.profile, self.version)

    def head(self, ok: bool, text: str, tag: Optional[str] = None) -> str:
        tag = tag or ("OK" if ok else "FAIL")
        return f"{tag:<4} {self.host}  {self.label} {text}"

    def no(self, i: int) -> int:
        return self.nos[i] if self.nos is not None else self.first + i

    def log_facts(self) -> Facts:
        """The profile's facts of the window, with the line numbers of the log."""
        if self.nos is None:
            return self.profile.log_facts(self.version, self.lines, self.first)
        facts = self.profile.log_facts(self.version, self.lines, 0)   # line_no: the index in the window
        done = set()
        for ev in list(facts.evidence.values()) + list(facts.notes):
            if id(ev) not in done and ev.line_no is not None and 0 <= ev.line_no < len(self.nos):
                done.add(id(ev))
                ev.line_no = self.nos[ev.line_no]
        return facts

    def text(self, i: int) -> str:
        return self.profile.strip_prefix(self.lines[i])

    def quote(self, i: int, width: int = MARKER_WIDTH) -> str:
        return f'log line {self.no(i)} "{shorten(self.text(i), width)}"'

    def show(self, ev: Evidence) -> str:
        if ev.source != "log":
            return ev.text
        whole = any(ev.text.startswith(p) for p in self.profile.whole_evidence)
        return f'log line {ev.line_no} "{ev.text if whole else shorten(ev.text, EVIDENCE_WIDTH)}"'

    def tail(self) -> List[str]:
        if not self.lines:
            return ["  the log has no lines since the restart"]
        start = max(0, len(self.lines) - LAST_LINES)
        out = [f"  last {len(self.lines) - start} log lines (numbered from the restart):"]
        width = len(str(self.no(len(self.lines) - 1)))
        for i in range(start, len(self.lines)):
            line = self.lines[i].rstrip()
            if len(line) > TAIL_WIDTH:
                line = line[:TAIL_WIDTH].rstrip() + " ..."
            out.append(f"    {self.no(i):>{width}} | {line}")
        return out

    def wait(self, missing: List[str], path, used, cause, seen) -> Verdict:
        msg = self.head(False, "waiting for " + (missing[0] if missing else "the server"), tag="WAIT")
        return Verdict(Status.PENDING, False, path, used, cause, seen, missing, msg)


@dataclass
class _Seen:
    """The patch's marker lines in the window."""

    by_key: Dict[str, List[int]]   # code path -> indexes of the lines credited to its marker
    listed: List[dict]             # Verdict.markers_seen

    @classmethod
    def of(cls, w: _Window, markers: Mapping[str, Any]) -> "_Seen":
        hits = attribute_markers(w.lines, markers)
        by_key: Dict[str, List[int]] = {}
        for i, keys in hits:
            for k in keys:
                by_key.setdefault(k, []).append(i)
        listed = [{"path": k, "line_no": w.no(i), "text": shorten(w.text(i), TAIL_WIDTH)}
                  for i, keys in hits for k in keys][:100]
        return cls(by_key, listed)


@dataclass
class _Route:
    """Which path runs, what says so, and why."""

    res: Resolution
    pred: Optional[Prediction]
    used: List[Evidence]           # the evidence that decided, log first
    cause: str
    conflict: Optional[tuple] = None   # (log path, server_info path, log evidence, server_info facts)
    lineage: List[str] = field(default_factory=list)   # the path, then the paths it inherits from
    file: Optional[str] = None

    @property
    def path(self) -> Optional[str]:
        return self.res.path if self.res.determined else None


# ----------------------------------------------------------------- judge
def judge(obs: Observation, subject: Subject, check: Check) -> Verdict:
    """The verdict on one patch (`check`) for one server (`subject`): the call steps makes."""
    return verdict(obs, subject, check)


def verdict(obs: Observation, subject: Subject, check: Check) -> Verdict:
    """The verdict on one patch for one host, from what was observed since the restart.

    Only `obs.lines` is read (the caller cuts the window at the restart).  Final
    statuses: verified, not-executed, restart-failed, timeout, rolled-back and
    ROLLBACK_STILL_PATCHED ("error"); "pending" (final False) means: look again
    when more has been observed.
    """
    w = _Window(obs, subject, check.label)
    pred, launch_error = _predict(subject)
    seen = _Seen.of(w, check.markers)
    failed = _failure(w, check, pred, seen)
    if failed is not None:
        return failed
    route = _route(w, pred, launch_error)
    if route.conflict is not None:
        return _conflict(w, route, seen)
    if not check.want_markers:
        return _rollback(w, seen, route)
    return _marker_verdict(w, check, seen, route)


def _predict(subject: Subject) -> Tuple[Optional[Prediction], Optional[str]]:
    if subject.launch is None:
        return None, None
    try:
        return subject.profile.predict(subject.version, subject.launch), None
    except Exception as e:  # a launch we cannot read must not hide the log's evidence
        return None, f"{type(e).__name__}: {e}"


# ----------------------------------------------------------------- which path runs
def _route(w: _Window, pred: Optional[Prediction], launch_error: Optional[str]) -> _Route:
    """The path from the log, /server_info and the launch (later sources win a fact)."""
    profile, version = w.profile, w.version
    log_f = w.log_facts()
    si_f = profile.server_info_facts(version, w.obs.server_info) if w.obs.server_info else None
    la_f = profile.launch_facts(pred, w.subject.launch) if pred is not None else None
    combined: Dict[str, object] = {}
    provider: Dict[str, Facts] = {}
    for facts in (la_f, si_f, log_f):
        for k, v in (facts.values.items() if facts is not None else ()):
            combined[k], provider[k] = v, facts
    res = profile.resolve(version, combined)
    route = _Route(res, pred, _used(provider, log_f, si_f, la_f),
                   _cause(profile, res, pred, w.subject.launch, combined, launch_error),
                   conflict=_log_vs_server_info(profile, version, log_f, si_f))
    if route.path:
        route.file = profile.file_of_path(route.path, version)
        route.lineage = [route.path] + profile.ancestors(route.path, version)
    return route


def _used(provider: Dict[str, Facts], log_f: Facts, *others: Optional[Facts]) -> List[Evidence]:
    """The evidence of every fact that decided, plus the log's supporting lines; log first."""
    used: List[Evidence] = []
    for facts in (log_f, *others):
        if facts is None:
            continue
        evs = [facts.evidence[k] for k in facts.evidence if provider.get(k) is facts]
        for ev in evs + (list(facts.notes) if facts is log_f else []):
            if ev not in used:
                used.append(ev)
    used.sort(key=lambda e: ({"log": 0, "server_info": 1, "launch": 2}.get(e.source, 3), e.line_no or 0))
    return used


def _log_vs_server_info(profile, version, log_f: Facts, si_f: Optional[Facts]) -> Optional[tuple]:
    """(log path, server_info path, log evidence, si facts) when the two name different paths."""
    if not log_f.values or si_f is None:
        return None
    r_log = profile.resolve(version, {**si_f.values, **log_f.values})
    r_si = profile.resolve(version, si_f.values)
    if not (r_log.determined and r_si.determined and r_log.path != r_si.path):
        return None
    key = next((k for k in profile.fact_keys if k in log_f.values and k in si_f.values
                and not profile.same_fact(k, log_f.values[k], si_f.values[k])), None)
    ev = log_f.evidence.get(key) if key else None
    return r_log.path, r_si.path, ev or (log_f.all_evidence() or [None])[0], si_f


def _cause(profile, res: Resolution, pred, launch, combined, launch_error) -> str:
    src = getattr(launch, "source", "launch") if launch is not None else "launch"
    if not res.determined:
        return res.reason
    if pred is None:
        base = f"the server runs with {profile.facts_text(combined)}" if combined else ""
        return base + (f" (the launch configuration could not be read: {launch_error})" if launch_error else "")
    if not pred.known_version or (pred.starts and pred.path == res.path):
        return pred.cause
    predicted = pred.path or ("a server that does not start" if not pred.starts else f"no {profile.short_noun()}")
    return (f"the server runs with {profile.facts_text(combined)}, but the {src} launch configuration predicts "
            f"{predicted} ({pred.cause}): the server was started differently, or the model changed the settings")


def _shown(used: List[Evidence]) -> List[Evidence]:
    """Evidence lines for a message: the log and /server_info; the launch only
    when nothing else said anything (its content is in the cause line)."""
    direct = [e for e in used if e.source in ("log", "server_info")]
    return direct or [e for e in used if e.source == "launch"]


def _runs_block(w: _Window, route: _Route, notes: bool = False) -> List[str]:
    if route.path:
        out = [f"  the server runs {route.path}" + (f" ({route.file})" if route.file else "")]
    else:
        out = [f"  the server runs no {w.profile.path_noun}"]
    out += [f"    evidence: {w.show(ev)}" for ev in _shown(route.used)]
    if route.cause:
        out.append(f"    cause: {route.cause}")
    for note in ((getattr(route.pred, "notes", None) or []) if notes else []):
        out.append(f"    note: {note}")
    return out


# ----------------------------------------------------------------- the marker verdict
@dataclass
class _Markers:
    """The patch's markers against the path that runs."""

    key: Optional[str]             # the marker that can verify: of the path, or of a path it inherits from
    own: List[int]                 # its lines
    ok: bool                       # the path is known and its marker was seen
    expect_missing: List[str]
    others: List[Tuple[str, int]]  # markers of paths that do not run: (path, first line index)
    missing: List[str]

    @classmethod
    def of(cls, w: _Window, check: Check, seen: _Seen, route: _Route) -> "_Markers":
        key = next((k for k in route.lineage if k in check.markers), None)
        own = seen.by_key.get(key, []) if key else []
        ok = bool(route.res.determined and route.path and own) or (check.markers_optional and key is None)
        if not route.res.determined and w.unknown_release and seen.by_key:
            # A release the profile does not know: the path is not guessed, but a marker
            # is in its path's own code, so the first one that appears names the path that ran.
            key = min(seen.by_key, key=lambda k: seen.by_key[k][0])
            own, ok = seen.by_key[key], True
            route.lineage = [key]
        expect_missing = [e for e in check.expect if not any(e in l for l in w.lines)]
        others = [(k, seen.by_key[k][0]) for k in seen.by_key if k not in route.lineage]
        missing = ([] if w.ready else ["the server to be ready"])
        if not ok:
            missing.append(_missing_marker(w, check, route, key))
        missing += [f'expected line "{e}"' for e in expect_missing]
        if w.ready and not w.health_ok:
            missing.append("a healthy /health answer")
        return cls(key, own, ok, expect_missing, others, missing)


def _missing_marker(w: _Window, check: Check, route: _Route, key: Optional[str]) -> str:
    if key:
        return f"marker for {key}: {check.markers[key].describe()}"
    if route.path:
        return f"a marker for {route.path}"
    if route.res.determined:
        return f"a {w.profile.path_noun} (none runs)"
    return "the code path the server runs"


def _marker_verdict(w: _Window, check: Check, seen: _Seen, route: _Route) -> Verdict:
    m = _Markers.of(w, check, seen, route)
    path, used, cause, obs = route.path, route.used, route.cause, w.obs
    if m.ok and not m.expect_missing and w.ready and w.health_ok:
        return _verified(w, route, m, seen)
    if obs.timed_out and not w.ready:
        msg = [w.head(False, "timed out: the server never became ready"),
               f'  no "{w.profile.ready_line}" in the {w.count} log lines since the restart']
        if route.pred is not None and not route.pred.starts:
            msg.append(f"    cause: {route.pred.cause}")
        return Verdict(Status.TIMEOUT, True, path, used, cause, seen.listed, m.missing, "\n".join(msg + w.tail()))
    if not (obs.timed_out or (w.ready and w.settled and not m.ok)):
        return w.wait(m.missing, path, used, cause, seen.listed)
    if m.ok and not m.expect_missing and not w.health_ok:
        # a patch judged by the probe (markers_optional) may have no marker line to quote
        shown = (f"{w.quote(m.own[0])} shows {path or m.key} ran" if m.own
                 else "the server logged that it is ready")
        msg = [w.head(False, "restart failed: the server is not healthy"),
               f"  {shown}, but the health check does not answer 200"]
        return Verdict(Status.RESTART_FAILED, True, path, used, cause, seen.listed, m.missing,
                       "\n".join(msg + w.tail()))
    if not route.res.determined:
        return _path_unknown(w, check, seen, route, m)
    return _not_executed(w, check, seen, route, m)


def _verified(w: _Window, route: _Route, m: _Markers, seen: _Seen) -> Verdict:
    count = f"; seen {len(m.own)} times" if len(m.own) > 1 else ""
    if route.path is None and m.own:   # a release the profile does not know: the marker named the path
        note = _version_note(w.profile, w.version)
        msg = [w.head(True, f"verified on {m.key} by its marker ({w.quote(m.own[0])}{count})")]
        msg += [f"  {note}" if note else "  the engine profile does not know this release",
                f"  the path was not predicted: the marker of {m.key} shows that its patched code ran"]
        return Verdict(Status.VERIFIED, True, m.key, route.used, route.res.reason, seen.listed, [], "\n".join(msg))
    via = f" via {m.key} code" if m.key != route.path else ""
    if m.own:
        head = f"verified on {route.path}{via} ({w.quote(m.own[0])}{count})"
    else:   # no marker for this path: the probe's records prove it (steps/execution.py)
        head = f"verified on {route.path or 'the server'} by the lines it ran"
    msg = [w.head(True, head)] + _runs_block(w, route)
    return Verdict(Status.VERIFIED, True, route.path, route.used, route.cause, seen.listed, [], "\n".join(msg))


def _knows(profile, version: Optional[str]) -> bool:
    try:
        return bool(version) and bool(profile.knows(version))
    except Exception:   # a profile that cannot say: treat as known (its routing decides, as before)
        return True


def _version_note(profile, version: Optional[str]) -> Optional[str]:
    note = getattr(profile, "version_note", None)
    return note(version) if note is not None else None


def _path_unknown(w: _Window, check: Check, seen: _Seen, route: _Route, m: _Markers) -> Verdict:
    msg = [w.head(False, "not verified: the code path the server runs is unknown"),
           "  fleetpatch cannot tell which code path the server runs"]
    msg += [f"    evidence: {w.show(ev)}" for ev in _shown(route.used)]
    msg.append(f"    cause: {route.res.reason}")
    for k, i in m.others:
        msg.append(f"  marker for {k} seen ({w.quote(i)}), but a marker proves nothing unless it "
                   "belongs to the path that runs")
    if not m.others and check.markers:
        msg.append(f"  no marker of {check.label} was seen")
    return Verdict(Status.NOT_EXECUTED, True, None, route.used, route.res.reason, seen.listed, m.missing,
                   "\n".join(msg))


def _not_executed(w: _Window, check: Check, seen: _Seen, route: _Route, m: _Markers) -> Verdict:
    path, markers = route.path, check.markers
    msg = [w.head(False, "never executed" if not m.ok else "not verified")] + _runs_block(w, route, notes=True)
    if path is None:
        names = ", ".join(markers) if markers else "none"
        msg.append(f"  none of the patch's markers ({names}) can appear: no {w.profile.short_noun()} runs")
    elif not m.ok and m.key:
        via = f" (inherited by {path})" if m.key != path else ""
        msg.append(f"  marker for {m.key}{via} not seen: {markers[m.key].describe()}")
    elif not m.ok:
        patched = ", ".join(markers) if markers else "no code path"
        msg.append(f"  {check.label} has no marker for {path}: it carries markers for {patched} only")
    for k, i in m.others:
        msg.append(f"  marker for {k} seen ({w.quote(i)}), but the server does not run {k}")
    for e in m.expect_missing:
        msg.append(f'  expected line not seen: "{e}"')
    return Verdict(Status.NOT_EXECUTED, True, path, route.used, route.cause, seen.listed, m.missing,
                   "\n".join(msg))


# ----------------------------------------------------------------- the other verdicts
def _failure(w: _Window, check: Check, pred, seen: _Seen) -> Optional[Verdict]:
    """restart-failed when a forbidden line, an engine failure line or a dead process is seen."""
    forbid_hit = next(((i, f) for i, l in enumerate(w.lines) for f in check.forbid if f in l), None)
    failures = w.profile.find_failures(w.version, w.lines)
    if forbid_hit is None and not failures and w.obs.alive is not False:
        return None
    quoted = _failure_lines(w, forbid_hit, failures)
    shown = [f'  forbidden line at {w.quote(forbid_hit[0], TAIL_WIDTH)} (forbid: "{forbid_hit[1]}")'] \
        if forbid_hit is not None else []
    shown += [f"  {w.quote(i, TAIL_WIDTH)}" for i in quoted if forbid_hit is None or i != forbid_hit[0]]
    if w.obs.alive is False:
        shown.append("  the server process is not running")
    cause = pred.cause if pred is not None and not pred.starts else ""
    msg = [w.head(False, "restart failed")] + shown + ([f"    cause: {cause}"] if cause else [])
    if seen.by_key:
        msg.append(f"  (markers seen before it failed: {', '.join(sorted(seen.by_key))})")
    ev = [Evidence("log", w.no(i), w.text(i)) for i in quoted]
    return Verdict(Status.RESTART_FAILED, True, None, ev, cause or shown[0].strip(), seen.listed,
                   ["a server that stays up"], "\n".join(msg + w.tail()))


def _failure_lines(w: _Window, forbid_hit, failures) -> List[int]:
    """The lines a failure message quotes: the forbidden line, the engine's first
    failure line and the exception after it (each once)."""
    out = [forbid_hit[0]] if forbid_hit is not None else []
    if failures:
        i = failures[0][0]
        exc = next((j for j in range(i, len(w.lines)) if w.profile.exception_line.match(w.text(j).strip())), None)
        out += [j for j in (i, exc) if j is not None and j not in out]
    return out


def _conflict(w: _Window, route: _Route, seen: _Seen) -> Verdict:
    log_path, si_path, ev, si_f = route.conflict
    where = f"line {ev.line_no}" if ev is not None and ev.line_no is not None else "the log"
    log_path, si_path = (p or f"no {w.profile.path_noun}" for p in (log_path, si_path))
    cause = f"evidence conflict: log says {log_path} ({where}), server_info says {si_path}"
    si_text = next(iter(si_f.evidence.values())).text if si_f.evidence else "/server_info"
    msg = [w.head(False, "not verified: evidence conflict"),
           f"  the log says the server runs {log_path}",
           f"    evidence: {w.show(ev)}" if ev is not None else "    evidence: the log",
           f"  /server_info says it runs {si_path}",
           f"    evidence: {si_text}",
           f"    cause: {cause}",
           "  the server may have been restarted by something else; check the log window and /server_info"]
    return Verdict(Status.NOT_EXECUTED, True, None, route.used, cause, seen.listed, [], "\n".join(msg))


def _rollback(w: _Window, seen: _Seen, route: _Route) -> Verdict:
    """After a rollback: no marker of the patch may appear, and the server must come up."""
    path, used, cause, obs = route.path, route.used, route.cause, w.obs
    if seen.by_key:
        return _still_patched(w, seen, route)
    missing = [] if w.ready and w.health_ok else ["the server to be ready" if not w.ready
                                                    else "a healthy /health answer"]
    lines = w.count
    if w.ready and w.health_ok and (w.settled or obs.timed_out):
        msg = w.head(True, "rolled back: the server is ready and healthy, and no marker of the patch "
                           f"appeared in the {lines} log lines since the restart")
        return Verdict(Status.ROLLED_BACK, True, path, used, cause, [], [], msg)
    if obs.timed_out and not w.ready:
        msg = [w.head(False, "timed out: the server never became ready after the rollback"),
               f'  no "{w.profile.ready_line}" in the {lines} log lines since the restart'] + w.tail()
        return Verdict(Status.TIMEOUT, True, path, used, cause, [], missing, "\n".join(msg))
    if obs.timed_out:
        msg = [w.head(False, "restart failed: the server is not healthy after the rollback")] + w.tail()
        return Verdict(Status.RESTART_FAILED, True, path, used, cause, [], missing, "\n".join(msg))
    if w.ready and w.health_ok and not w.settled:
        missing.append("the server to settle")
    return w.wait(missing, path, used, cause, [])


def _still_patched(w: _Window, seen: _Seen, route: _Route) -> Verdict:
    msg = [w.head(False, "still executes after the rollback")]
    for k, found in seen.by_key.items():
        count = f" ({len(found)} times)" if len(found) > 1 else ""
        msg.append(f"  marker for {k} seen at {w.quote(found[0])}{count}: the patched code still runs")
    if route.path:
        msg.append(f"  the server runs {route.path}")
    return Verdict(ROLLBACK_STILL_PATCHED, True, route.path, route.used,
                   "a marker of the patch appeared after the rollback", seen.listed, [], "\n".join(msg))
