"""Did the patched code path execute?  Pure: a log window, /server_info and the
launch configuration in, a Verdict out.  No SSH, no clock (times come in the
Observation).

Which path runs is worked out by the engine profile, in this order of trust:

1. the log window: the ServerArgs dump (final values) and the version's
   routing warnings (W1/W2/W3 ...);
2. /server_info, when the server answered it;
3. the launch configuration (argv + environment), as the fallback and as the
   human cause.

The log and /server_info must agree; if they name different paths the verdict
is a final "not-executed" with an "evidence conflict" cause.  Only the marker of
the path that runs (or of a worker class it inherits from) can verify; a marker
of another path never does.

Markers are used only through `.matches(line)` and `.describe()` (and, when it
is there, `.literal`: a line matched by two markers is credited to the more
specific one, so "Dynamic speculation disable enabled" does not claim the V2
line "Dynamic speculation disable enabled ... V2").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

STATUSES = ("verified", "not-executed", "restart-failed", "timeout", "pending", "rolled-back", "error")
# Rollback check that still finds a marker of the patch: the patched code still runs.
ROLLBACK_STILL_PATCHED = "error"

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


@dataclass
class Evidence:
    source: str                    # "log" | "server_info" | "launch"
    line_no: Optional[int]
    text: str


@dataclass
class Verdict:
    status: str                    # one of STATUSES
    final: bool
    executed_path: Optional[str]
    evidence: List[Evidence]
    cause: str
    markers_seen: List[dict]       # {"path", "line_no", "text"}
    missing: List[str]             # what was not seen (ready line / markers / expect lines / health)
    message: str                   # the loud multi-line explanation (contract format)


# ----------------------------------------------------------------- helpers
_PREFIX = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[^\]]*\] ")
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::|$)")


def strip_prefix(line: str) -> str:
    """A log line without SGLang's "[2026-01-05 10:11:12 DP0 TP0] " prefix."""
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1)


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


def _show(ev: Evidence) -> str:
    if ev.source == "log":
        text = ev.text if ev.text.startswith("server_args=ServerArgs(...") else shorten(ev.text, EVIDENCE_WIDTH)
        return f'log line {ev.line_no} "{text}"'
    if ev.source == "server_info":
        return ev.text
    return ev.text


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


def _fmt_value(v) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _facts_text(values: Mapping[str, object]) -> str:
    parts = []
    if "algorithm" in values:
        parts.append(f"speculative_algorithm={_fmt_value(values['algorithm'])}")
    if "multi_layer" in values:
        parts.append(f"enable_multi_layer_eagle={values['multi_layer']}")
    if "overlap" in values:
        parts.append(f"disable_overlap_schedule={not values['overlap']}")
    return ", ".join(parts)


class _Ctx:
    """Everything one judgement needs to write its message."""

    def __init__(self, host: str, label: str, lines: List[str], first: int):
        self.host, self.label, self.lines, self.first = host, label, lines, first

    def head(self, ok: bool, text: str, tag: Optional[str] = None) -> str:
        tag = tag or ("OK" if ok else "FAIL")
        return f"{tag:<4} {self.host}  {self.label} {text}"

    def no(self, i: int) -> int:
        return self.first + i

    def quote(self, i: int, width: int = MARKER_WIDTH) -> str:
        return f'log line {self.no(i)} "{shorten(strip_prefix(self.lines[i]), width)}"'

    def tail(self) -> List[str]:
        if not self.lines:
            return ["  the log has no lines since the restart"]
        start = max(0, len(self.lines) - LAST_LINES)
        out = [f"  last {len(self.lines) - start} log lines:"]
        width = len(str(self.no(len(self.lines) - 1)))
        for i in range(start, len(self.lines)):
            line = self.lines[i].rstrip()
            if len(line) > TAIL_WIDTH:
                line = line[:TAIL_WIDTH].rstrip() + " ..."
            out.append(f"    {self.no(i):>{width}} | {line}")
        return out


# ----------------------------------------------------------------- judge
def judge(obs: Observation, profile, version: Optional[str], launch, markers: Mapping[str, Any],
          expect: Iterable[str], forbid: Iterable[str], label: str, host: str, *,
          want_markers: bool = True, settle_s: float = 2.0) -> Verdict:
    """The verdict on one patch for one host, from what was observed since the restart.

    Only `obs.lines` is read (the caller cuts the window at the restart).  Final
    statuses: verified, not-executed, restart-failed, timeout, rolled-back and
    ROLLBACK_STILL_PATCHED ("error"); "pending" (final False) means: look again
    when more has been observed.
    """
    lines = [str(l).rstrip("\r\n") for l in (obs.lines or [])]
    first = obs.first_line_no or 1
    markers = dict(markers or {})
    expect = [e for e in (expect or []) if e]
    forbid = [f for f in (forbid or []) if f]
    ctx = _Ctx(host, label, lines, first)

    ready_line = getattr(profile, "ready_line", "The server is fired up and ready to roll!")
    ready_idx = next((i for i, l in enumerate(lines) if ready_line in l), None)
    ready = ready_idx is not None or obs.since_ready_s is not None
    settled = obs.since_ready_s is not None and obs.since_ready_s >= settle_s
    health_ok = obs.healthy is True or (obs.healthy is None and ready)

    pred = None
    if launch is not None:
        try:
            pred = profile.predict(version, launch)
        except Exception as e:  # a launch we cannot read must not hide the log's evidence
            pred = None
            launch_error = f"{type(e).__name__}: {e}"
        else:
            launch_error = None
    else:
        launch_error = None

    # markers, by path, crediting each line to its most specific marker
    hits = attribute_markers(lines, markers)
    by_key: Dict[str, List[int]] = {}
    for i, keys in hits:
        for k in keys:
            by_key.setdefault(k, []).append(i)
    markers_seen = [{"path": k, "line_no": ctx.no(i), "text": shorten(strip_prefix(lines[i]), TAIL_WIDTH)}
                    for i, keys in hits for k in keys][:100]

    # --------------------------------------------------------- failures first
    forbid_hit = next(((i, f) for i, l in enumerate(lines) for f in forbid if f in l), None)
    failures = profile.find_failures(version, lines)
    if forbid_hit is not None or failures or obs.alive is False:
        return _restart_failed(ctx, obs, pred, forbid_hit, failures, markers_seen, by_key)

    # --------------------------------------------------------- which path runs
    log_f = profile.log_facts(version, lines, first)
    si_f = profile.server_info_facts(version, obs.server_info) if obs.server_info else None
    la_f = profile.launch_facts(pred, launch) if pred is not None else None

    conflict = None
    if log_f.values and si_f is not None:
        r_log = profile.resolve(version, {**si_f.values, **log_f.values})
        r_si = profile.resolve(version, si_f.values)
        if r_log.determined and r_si.determined and r_log.path != r_si.path:
            key = next((k for k in ("algorithm", "multi_layer", "overlap")
                        if k in log_f.values and k in si_f.values
                        and _same(log_f.values[k], si_f.values[k]) is False), None)
            ev = log_f.evidence.get(key) if key else None
            ev = ev or (log_f.all_evidence() or [None])[0]
            conflict = (r_log.path, r_si.path, ev, si_f)

    combined: Dict[str, object] = {}
    provider: Dict[str, Any] = {}
    for facts in (la_f, si_f, log_f):
        if facts is None:
            continue
        for k, v in facts.values.items():
            combined[k] = v
            provider[k] = facts
    res = profile.resolve(version, combined)
    path = res.path if res.determined else None

    used: List[Evidence] = []
    for facts in (log_f, si_f, la_f):
        if facts is None:
            continue
        if facts is log_f:
            evs = [facts.evidence[k] for k in facts.evidence if provider.get(k) is facts] + list(facts.notes)
        else:
            evs = [facts.evidence[k] for k in facts.evidence if provider.get(k) is facts]
        for ev in evs:
            if ev not in used:
                used.append(ev)
    used.sort(key=lambda e: ({"log": 0, "server_info": 1, "launch": 2}.get(e.source, 3), e.line_no or 0))

    cause = _cause(res, pred, launch, combined, launch_error)
    if conflict is not None:
        return _conflict(ctx, conflict, used, markers_seen)

    file = profile.file_of_path(path, version) if path else None
    lineage = [path] + profile.ancestors(path, version) if path else []

    if not want_markers:
        return _rollback(ctx, obs, markers, by_key, markers_seen, used, cause, path, ready, settled,
                         health_ok, ready_line)

    key = next((k for k in lineage if k in markers), None)
    own = by_key.get(key, []) if key else []
    marker_ok = bool(res.determined and path and own)
    expect_missing = [e for e in expect if not any(e in l for l in lines)]

    missing: List[str] = []
    if not ready:
        missing.append("the server to be ready")
    if not marker_ok:
        if key:
            missing.append(f"marker for {key}: {markers[key].describe()}")
        elif path:
            missing.append(f"a marker for {path}")
        elif res.determined:
            missing.append("a speculative decoding worker (none runs)")
        else:
            missing.append("the code path the server runs")
    missing += [f'expected line "{e}"' for e in expect_missing]
    if ready and not health_ok:
        missing.append("a healthy /health answer")

    others = [(k, by_key[k][0]) for k in by_key if k not in lineage]

    if marker_ok and not expect_missing and ready and health_ok:
        i0 = own[0]
        via = f" via {key} code" if key != path else ""
        count = f"; seen {len(own)} times" if len(own) > 1 else ""
        msg = [ctx.head(True, f"verified on {path}{via} ({ctx.quote(i0)}{count})")]
        msg += _runs_block(path, file, used, cause)
        return Verdict("verified", True, path, used, cause, markers_seen, [], "\n".join(msg))

    if obs.timed_out and not ready:
        msg = [ctx.head(False, "timed out: the server never became ready"),
               f'  no "{ready_line}" in the {len(lines)} log lines since the restart']
        if pred is not None and not pred.starts:
            msg.append(f"    cause: {pred.cause}")
        msg += ctx.tail()
        return Verdict("timeout", True, path, used, cause, markers_seen, missing, "\n".join(msg))

    decide = obs.timed_out or (ready and settled and not marker_ok)
    if not decide:
        msg = ctx.head(False, "waiting for " + (missing[0] if missing else "the server"), tag="WAIT")
        return Verdict("pending", False, path, used, cause, markers_seen, missing, msg)

    if marker_ok and not expect_missing and not health_ok:
        msg = [ctx.head(False, "restart failed: the server is not healthy"),
               f"  {ctx.quote(own[0])} shows {path} ran, but the health check does not answer 200"]
        msg += ctx.tail()
        return Verdict("restart-failed", True, path, used, cause, markers_seen, missing, "\n".join(msg))

    # not-executed
    if not res.determined:
        msg = [ctx.head(False, "not verified: the code path the server runs is unknown"),
               "  fleetpatch cannot tell which code path the server runs"]
        msg += [f"    evidence: {_show(ev)}" for ev in _shown(used)]
        msg.append(f"    cause: {res.reason}")
        for k, i in others:
            msg.append(f"  marker for {k} seen ({ctx.quote(i)}), but a marker proves nothing unless it "
                       "belongs to the path that runs")
        if not others and markers:
            msg.append(f"  no marker of {label} was seen")
        return Verdict("not-executed", True, None, used, res.reason, markers_seen, missing, "\n".join(msg))

    title = "never executed" if not marker_ok else "not verified"
    msg = [ctx.head(False, title)]
    msg += _runs_block(path, file, used, cause, pred)
    if path is None:
        names = ", ".join(markers) if markers else "none"
        msg.append(f"  none of the patch's markers ({names}) can appear: no speculative worker runs")
    elif not marker_ok:
        if key:
            via = f" (inherited by {path})" if key != path else ""
            msg.append(f"  marker for {key}{via} not seen: {markers[key].describe()}")
        else:
            patched = ", ".join(markers) if markers else "no code path"
            msg.append(f"  {label} has no marker for {path}: it carries markers for {patched} only")
    for k, i in others:
        msg.append(f"  marker for {k} seen ({ctx.quote(i)}), but the server does not run {k}")
    for e in expect_missing:
        msg.append(f'  expected line not seen: "{e}"')
    return Verdict("not-executed", True, path, used, cause, markers_seen, missing, "\n".join(msg))


# ----------------------------------------------------------------- pieces
def _same(a, b) -> Optional[bool]:
    if isinstance(a, str) or isinstance(b, str):
        na = None if a is None else str(a).upper().replace("NEXTN", "EAGLE")
        nb = None if b is None else str(b).upper().replace("NEXTN", "EAGLE")
        return na == nb
    return a == b


def _shown(used: List[Evidence]) -> List[Evidence]:
    """Evidence lines for a message: the log and /server_info; the launch only
    when nothing else said anything (its content is in the cause line)."""
    direct = [e for e in used if e.source in ("log", "server_info")]
    return direct or [e for e in used if e.source == "launch"]


def _runs_block(path, file, used, cause, pred=None) -> List[str]:
    if path:
        out = [f"  the server runs {path}" + (f" ({file})" if file else "")]
    else:
        out = ["  the server runs no speculative decoding worker"]
    out += [f"    evidence: {_show(ev)}" for ev in _shown(used)]
    if cause:
        out.append(f"    cause: {cause}")
    for note in (getattr(pred, "notes", None) or []):
        out.append(f"    note: {note}")
    return out


def _cause(res, pred, launch, combined, launch_error) -> str:
    src = getattr(launch, "source", "launch") if launch is not None else "launch"
    if not res.determined:
        return res.reason
    if pred is None:
        base = f"the server runs with {_facts_text(combined)}" if combined else ""
        return base + (f" (the launch configuration could not be read: {launch_error})" if launch_error else "")
    if not pred.known_version:
        return pred.cause
    if pred.starts and pred.path == res.path:
        return pred.cause
    predicted = pred.path or ("a server that does not start" if not pred.starts else "no speculative worker")
    return (f"the server runs with {_facts_text(combined)}, but the {src} launch configuration predicts "
            f"{predicted} ({pred.cause}): the server was started differently, or the model changed the settings")


def _restart_failed(ctx: _Ctx, obs, pred, forbid_hit, failures, markers_seen, by_key) -> Verdict:
    msg = [ctx.head(False, "restart failed")]
    shown: List[str] = []
    ev: List[Evidence] = []
    if forbid_hit is not None:
        i, f = forbid_hit
        shown.append(f'  forbidden line at {ctx.quote(i, TAIL_WIDTH)} (forbid: "{f}")')
        ev.append(Evidence("log", ctx.no(i), strip_prefix(ctx.lines[i])))
    if failures:
        i, sig = failures[0]
        if forbid_hit is None or forbid_hit[0] != i:
            shown.append(f"  {ctx.quote(i, TAIL_WIDTH)}")
            ev.append(Evidence("log", ctx.no(i), strip_prefix(ctx.lines[i])))
        exc = next((j for j in range(i, len(ctx.lines)) if _EXC_LINE.match(strip_prefix(ctx.lines[j]).strip())),
                   None)
        if exc is not None and exc != i and (forbid_hit is None or forbid_hit[0] != exc):
            shown.append(f"  {ctx.quote(exc, TAIL_WIDTH)}")
            ev.append(Evidence("log", ctx.no(exc), strip_prefix(ctx.lines[exc])))
    if obs.alive is False:
        shown.append("  the server process is not running")
    msg += shown
    cause = ""
    if pred is not None and not pred.starts:
        cause = pred.cause
        msg.append(f"    cause: {cause}")
    if by_key:
        seen = ", ".join(sorted(by_key))
        msg.append(f"  (markers seen before it failed: {seen})")
    msg += ctx.tail()
    missing = ["a server that stays up"]
    return Verdict("restart-failed", True, None, ev, cause or shown[0].strip(), markers_seen, missing,
                   "\n".join(msg))


def _conflict(ctx: _Ctx, conflict, used, markers_seen) -> Verdict:
    log_path, si_path, ev, si_f = conflict
    where = f"line {ev.line_no}" if ev is not None and ev.line_no is not None else "the log"
    cause = f"evidence conflict: log says {log_path} ({where}), server_info says {si_path}"
    si_text = next(iter(si_f.evidence.values())).text if si_f.evidence else "/server_info"
    msg = [ctx.head(False, "not verified: evidence conflict"),
           f"  the log says the server runs {log_path}",
           f"    evidence: {_show(ev)}" if ev is not None else "    evidence: the log",
           f"  /server_info says it runs {si_path}",
           f"    evidence: {si_text}",
           f"    cause: {cause}",
           "  the server may have been restarted by something else; check the log window and /server_info"]
    return Verdict("not-executed", True, None, used, cause, markers_seen, [], "\n".join(msg))


def _rollback(ctx: _Ctx, obs, markers, by_key, markers_seen, used, cause, path, ready, settled,
              health_ok, ready_line) -> Verdict:
    if by_key:
        msg = [ctx.head(False, "still executes after the rollback")]
        for k in by_key:
            i = by_key[k][0]
            count = f" ({len(by_key[k])} times)" if len(by_key[k]) > 1 else ""
            msg.append(f"  marker for {k} seen at {ctx.quote(i)}{count}: the patched code still runs")
        if path:
            msg.append(f"  the server runs {path}")
        return Verdict(ROLLBACK_STILL_PATCHED, True, path, used, "a marker of the patch appeared after the rollback",
                       markers_seen, [], "\n".join(msg))
    missing = []
    if not ready:
        missing.append("the server to be ready")
    elif not health_ok:
        missing.append("a healthy /health answer")
    if ready and health_ok and (settled or obs.timed_out):
        msg = (ctx.head(True, "rolled back: the server is ready and healthy, and no marker of the patch "
                              f"appeared in the {len(ctx.lines)} log lines since the restart"))
        return Verdict("rolled-back", True, path, used, cause, [], [], msg)
    if obs.timed_out and not ready:
        msg = [ctx.head(False, "timed out: the server never became ready after the rollback"),
               f'  no "{ready_line}" in the {len(ctx.lines)} log lines since the restart']
        msg += ctx.tail()
        return Verdict("timeout", True, path, used, cause, [], missing, "\n".join(msg))
    if obs.timed_out:
        msg = [ctx.head(False, "restart failed: the server is not healthy after the rollback")]
        msg += ctx.tail()
        return Verdict("restart-failed", True, path, used, cause, [], missing, "\n".join(msg))
    if ready and health_ok and not settled:
        missing.append("the server to settle")
    msg = ctx.head(False, "waiting for " + (missing[0] if missing else "the server"), tag="WAIT")
    return Verdict("pending", False, path, used, cause, [], missing, msg)
