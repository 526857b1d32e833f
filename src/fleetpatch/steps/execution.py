"""The probe seen from the laptop: whether it watches a host's restart, what it
watches (the plan: the patched modules and the post-image line numbers that the
revision adds, where the diff really applied on that host), and its records
folded into the verdict (the report's `execution` block).

A patch passes with the probe on only if at least one added line ran in a
process of the restarted server (its main pid, its live descendants, and every
recorded process whose parent chain leads to it); where the profile knows the
path that runs, the lines that ran must be on it. Markers, expect, forbid and
health are judged as before (evidence.py); this only adds to that verdict.
"""
from __future__ import annotations

import dataclasses
import functools
import os

from .. import protocol
from ..errors import Status
from ..probe import install as probe_install
from ..probe import splice as probe_splice
from ..probe import verdict as probe_verdict


def probe_wanted(job, host, patch) -> bool:
    """The probe watches this host's restart: not --no-probe, not engine.probe: false, and
    not a patch with `executed: off`. (On a container host it goes into the container's
    interpreter: agent/container_probe.py.)"""
    return bool(getattr(job, "probe", True) and probe_on_host(host)
                and (patch is None or getattr(patch, "executed", "any") != "off"))


def probe_on_host(host) -> bool:
    return bool(getattr(host.engine, "probe", True))


@functools.lru_cache(maxsize=1)
def runtime_packed() -> str:
    return protocol.pack(probe_install.runtime_source())


def added_of(revision, states: dict | None = None) -> dict:
    """{path: [post-image line numbers]} of what `revision` adds, shifted by where each hunk
    applied on this host (diffapply's offsets)."""
    offsets = {p: list(r.offsets or []) for p, r in (states or {}).items() if getattr(r, "offsets", None)}
    return probe_verdict.added_lines(revision.diff_text, offsets)


def siblings(profile, paths, version: str | None = None) -> dict[str, list[str]]:
    """{sibling file: [the patched files of `paths` it pairs with]}: reported as imported or never
    imported, and its functions named like the patched ones counted."""
    out: dict[str, list[str]] = {}
    pairs = getattr(profile, "sibling_pairs", None)
    if not pairs and hasattr(profile, "releases"):
        # per-release pairs (vLLM): the host's release's (0.34.0 has no V1 drafter to watch), else any release's
        pairs = profile.siblings(version) if profile.knows(version) else profile.siblings_for(None)
    for a, b in pairs or []:
        for have, other in ((a, b), (b, a)):
            if have in paths and other not in paths and have not in out.setdefault(other, []):
                out[other].append(have)
    return out


def stacked_added(ledger: dict, name: str, revision=None, states: dict | None = None) -> dict:
    """{label: {path: [lines]}} of every other patch applied on the host, numbered as the files
    will be once `revision` is written on top (None: as they are now). The newest patch's record
    keeps the lines of those below it in its own numbering (`stacked`); each record its own."""
    entries = sorted(((n, e) for n, e in (ledger.get("patches") or {}).items() if n != name),
                     key=lambda item: (item[1].get("seq", 0), item[1].get("applied_at", ""), item[0]))
    now = {}
    for n, entry in entries:
        record = entry.get("record") or {}
        label = entry.get("label") or f"{n}@{entry.get('rev', '?')}"
        now.update({k: v for k, v in (record.get("stacked") or {}).items() if k in now})
        if record.get("added"):   # an entry of an older fleetpatch keeps no lines: its markers judge it
            now[label] = record["added"]
    if revision is None:
        return now
    offsets = {p: list(r.offsets or []) for p, r in (states or {}).items() if getattr(r, "offsets", None)}
    return {label: probe_verdict.carry_lines(lines, revision.diff_text, offsets) for label, lines in now.items()}


def probe_request(host, profile, label: str, package_dir: str, added: dict, token: str,
                  stacked: dict | None = None, version: str | None = None) -> dict:
    """The `probe` field of a request that restarts: the agent installs this just before. It watches
    the lines of every patch applied (`stacked`: the others'), each patch judged by its own."""
    per_patch = {**(stacked or {}), label: added}
    union: dict = {}
    for lines in per_patch.values():
        for path, numbers in lines.items():
            union[path] = sorted(set(union.get(path, ())) | set(numbers))
    plan = probe_install.make_plan(union, package_dir, watch=siblings(profile, set(union), version))
    plan["label"] = label
    plan["patches"] = per_patch
    return {"token": token, "python": host.engine.python, "plan": plan, "runtime": runtime_packed()}


def with_splice_hints(probe: dict | None, after: dict, hints: probe_splice.Hints) -> dict | None:
    """`probe` (probe_request's) with, for each watched module whose bytes after the write are in
    `after` ({path: bytes}), the lines the agent must rewrite in functions mode (probe/splice.py):
    worked out here once for every host that gets these bytes (`hints`: the run's), not parsed
    whole on each."""
    for spec in ((probe or {}).get("plan") or {}).get("modules", {}).values():
        source = after.get(spec["path"])
        hint = hints.get(source, spec["lines"]) if source is not None and spec["lines"] else None
        if hint is not None:
            spec["splice"] = hint
    return probe


def process_pids(records: dict, pid: int | None, children) -> set | None:
    """The processes of the server: its pid, its live descendants, and each recorded process whose
    parent is one of them (a spawned scheduler that has exited since included). None: unknown pid."""
    if not pid:
        return None
    pids = {pid} | set(children or ())
    procs = []
    for key, data in records.items():
        if key.endswith("/process.json"):
            info = probe_verdict.parse_records({key: data}).get(key.split("/", 1)[0], {}).get("process") or {}
            if isinstance(info.get("pid"), int):
                procs.append((info["pid"], info.get("ppid")))
    grew = True
    while grew:
        grew = False
        for child, parent in procs:
            if parent in pids and child not in pids:
                pids.add(child)
                grew = True
    return pids


class ExecutionView:
    """What the follow stream told of the probe: its plan, its records, the server's pids."""

    def __init__(self, installed: dict | None = None):
        self.installed = installed or {}   # the restart's answer: installed, site_dir, error
        self.records: dict[str, bytes] = {}
        self.plan: dict | None = None
        self.pid: int | None = None
        self.children: list = []
        self.interpreter: dict = {}   # what the server was started with: argv0, python, venv
        self.namespace: str | None = None   # "container": the pids are those of the container's pid namespace
        self.seen_event = False
        # block() per label, until the next event: a follow judges ~15 times a host and most judgements
        # come with no new probe event, while each block() parses every record again (~1 ms a host)
        self._blocks: dict = {}

    def add(self, ev: dict) -> None:
        self.seen_event = True
        self._blocks.clear()
        for key, text in (ev.get("records") or {}).items():
            self.records[key] = text.encode("utf-8") if isinstance(text, str) else text
        if ev.get("plan") is not None:
            self.plan = ev["plan"]
        self.pid = ev.get("pid") or self.pid
        self.children = sorted(set(self.children) | set(ev.get("children") or ()))
        self.interpreter = ev.get("interpreter") or self.interpreter
        self.namespace = ev.get("pid_namespace") or self.namespace

    def block(self, label: str | None = None) -> dict:
        """What the probe saw for `label` (probe.verdict's execution block), a fresh top level each call:
        the verdict's fold writes into it."""
        if label not in self._blocks:
            self._blocks[label] = self._block(label)
        return dict(self._blocks[label])

    def _block(self, label: str | None) -> dict:
        if self.installed.get("error"):
            return probe_verdict.execution_off("unavailable", "the probe could not go in: " + self.installed["error"])
        if not self.plan:
            return probe_verdict.execution_off("unavailable", "no probe watched this restart")
        pids = process_pids(self.records, self.pid, self.children)
        per_patch = self.plan.get("patches") or {}
        if label and self.plan.get("label") and self.plan["label"] != label and label not in per_patch:
            watched = ", ".join(sorted(per_patch) or [self.plan["label"]])
            block = probe_verdict.execution_off("unavailable", f"the probe watched {watched}, not {label}")
            block["loaded"] = bool(probe_verdict.execution_block(self.records, self.plan, {}, pids)["pids"])
            return block
        if label in per_patch:
            added = per_patch[label]
        else:
            added = {spec["path"]: spec.get("lines") or [] for spec in (self.plan.get("modules") or {}).values()}
        block = probe_verdict.execution_block(self.records, self.plan, added, pids)
        block["added"] = added
        block["server_pids"] = sorted(pids) if pids else []
        if self.namespace:
            block["pid_namespace"] = self.namespace
        return block


class Context:
    """What a folded message needs besides the verdict; `timeline` (probe.verdict.Timeline, host
    clock) says what proved a line that ran: startup, smoke or traffic."""

    def __init__(self, host: str, label: str, profile, version, settled: bool, timed_out: bool, elapsed: float,
                 timeline=None):
        self.host, self.label, self.profile, self.version = host, label, profile, version
        self.settled, self.timed_out, self.elapsed = settled, timed_out, elapsed
        self.timeline = timeline or probe_verdict.Timeline()
        # the log lines since the restart that say compiled code came from the engine's cache (Evidence);
        # the follow sets them from its window (profile.compiled_from_cache)
        self.compiled_cache: list = []


def timeline_of(given, ready_epoch: float | None, smoke_epoch: float | None = None):
    """The Timeline a follow judges by: `given` (the Watch's, or none) with the ready time this
    follow saw, and when its smoke requests began, filled in where it has none."""
    timeline = given or probe_verdict.Timeline()
    if timeline.ready_at is None and ready_epoch is not None:
        timeline = dataclasses.replace(timeline, ready_at=float(ready_epoch))
    if timeline.smoke_from is None and smoke_epoch is not None:
        timeline = dataclasses.replace(timeline, smoke_from=float(smoke_epoch))
    return timeline


def recorded_timeline(last_restart: dict | None):
    """The Timeline of the last restart as the ledger keeps it (for verify-logs): its ready time
    (else the restart's own, so that nothing after it is called start-up) and its first verdict,
    after which what ran is `traffic`."""
    last = last_restart or {}
    ready = last.get("ready_epoch") if last.get("ready_epoch") is not None else last.get("epoch")
    return probe_verdict.Timeline(ready_at=ready, smoke_to=last.get("verdict_epoch"))


def ran_on_path(block: dict, v, ctx: Context) -> dict:
    """The lines that ran in files on the path that runs (or in files that bear no path)."""
    if not v.executed_path:
        return block["ran"]
    lineage = {v.executed_path, *ctx.profile.ancestors(v.executed_path, ctx.version or "")}
    return {f: lines for f, lines in block["ran"].items()
            if not ctx.profile.paths_of_file(f) or lineage & set(ctx.profile.paths_of_file(f))}


def fold(v, block: dict, ctx: Context, marker_seen: bool):
    """The verdict `v` of the markers (evidence.judge) with what the probe saw. Returns the verdict."""
    if v.status == Status.ROLLED_BACK and block["mode"] != "off":
        return _rolled_back(v, block)
    if v.status != Status.VERIFIED or block["mode"] == "off":
        return v
    wrong = {p: why for p, why in block["not_run"].items() if why.startswith("loaded from another file")}
    if wrong:
        lines = [f"FAIL {ctx.host}  {ctx.label} never executed",
                 "  the server loaded a patched module from another file than the patched one:"]
        lines += [f"    {p}: {why}" for p, why in sorted(wrong.items())]
        return _final(v, Status.NOT_EXECUTED, lines + _runs(v, ctx))
    done = ctx.settled or ctx.timed_out
    if block["mode"] == "unavailable":
        if not done:   # its records may still be on their way, even with the markers seen
            return _pending(v, ctx, "the probe's records of the server")
        if marker_seen:
            v.message += f"\n  note: the probe did not watch this server ({block['message']}); verified by its markers"
            return v
        if block.get("loaded"):   # it ran in the server, but this restart's plan did not hold the patch
            return _final(v, Status.NOT_EXECUTED, [
                f"FAIL {ctx.host}  {ctx.label} not verified: {block['message']} in this restart",
                f"  deploy-patch {ctx.label.split('@')[0]} again to restart with the probe watching it"] + _runs(v, ctx))
        return _final(v, Status.NOT_EXECUTED, _never_loaded(v, block, ctx))
    ran = ran_on_path(block, v, ctx)
    if ran:
        block["proved_by"] = ctx.timeline.proved_by(block.get("ran_at"))
        shown = "; ".join(f"{f} line{'s' if len(n) > 1 else ''} {', '.join(map(str, n[:8]))}"
                          for f, n in sorted(ran.items()))
        by = f"; proved by {block['proved_by']}" if block["proved_by"] else ""
        v.message += (f"\n  executed ({block['mode']} mode): {shown} (pids {', '.join(map(str, block['pids']))}"
                      f"{_where(block)}{_in_processes(block, ran, ctx)}){by}")
        return v
    if not done:
        return _pending(v, ctx, "a line this patch adds to run")
    compiled = compiled_verdict(v, block, ctx)
    if compiled is not None:
        return compiled
    reached = probe_verdict.reach(block, block.get("added") or {}, ctx.timeline) if not block["ran"] else None
    if reached and reached["status"] == probe_verdict.UNPROVEN and not _off_path(v, block, ctx):
        return _final(v, Status.UNPROVEN, [f"FAIL {ctx.host}  {ctx.label} unproven: its code was reached, "
                                           "none of the lines it adds ran yet"] + reached["lines"] + _runs(v, ctx))
    return _final(v, Status.NOT_EXECUTED, _none_ran(v, block, ctx) + (reached["lines"] if reached else []))


def _in_processes(block: dict, ran: dict, ctx: Context) -> str:
    """'; in EngineCore' where the probe's records name the processes the lines ran in (vLLM:
    API server, EngineCore, Worker), else ''."""
    role = getattr(ctx.profile, "process_role", None)
    names = {n for f in ran for n in (block.get("processes") or {}).get(f, ())}
    roles = sorted({role(n) or n for n in names}) if role else []
    if not roles:
        return ""
    block["ran_in"] = roles
    return "; in " + " and ".join(roles) if len(roles) < 3 else "; in " + ", ".join(roles)


def compiled_verdict(v, block: dict, ctx: Context):
    """No added line ran as Python, and the engine compiles (its profile names compile-cache lines):
    - added lines the probe saw traced (torch.compile's trace or a CUDA graph capture) ran under
      trace: they are in the compiled graph that serves, so the patch is verified, proved by `trace`;
    - else a log line since the restart says the compiled graph came from the cache, and a patched file
      is one whose code runs compiled: no Python line of it runs, which is not `not-executed`; the
      verdict is `unproven`, naming the line and what to do.
    None: neither (the markers' and the probe's usual verdict stands)."""
    if not getattr(ctx.profile, "compiled_cache_lines", ()):
        return None
    traced = ran_on_path(dict(block, ran=block.get("traced") or {}), v, ctx)   # on the path that runs
    if traced and v.status == Status.VERIFIED:
        block["proved_by"] = "trace"
        block["compiled"] = {"traced": traced}
        shown = "; ".join(f"{f} line{'s' if len(n) > 1 else ''} {', '.join(map(str, n[:8]))}"
                          for f, n in sorted(traced.items()))
        v.message += (f"\n  executed under trace ({block['mode']} mode): {shown} ran while torch.compile traced "
                      "them (or a CUDA graph was captured): the compiled graph the server runs holds them; "
                      "proved by trace")
        return v
    added = block.get("added") or {}
    # a file the server imported (a never-imported one is in no graph it loaded), on the path that runs
    loaded = (probe_verdict.NO_LINE_RAN, probe_verdict.ONLY_TRACED)
    compiled_files = sorted(p for p, lines in added.items() if lines and not (block.get("ran") or {}).get(p)
                            and (block.get("not_run") or {}).get(p) in loaded and ctx.profile.in_compiled_region(p))
    if not ctx.compiled_cache or not compiled_files or _off_path(v, block, ctx):
        return None
    block["proved_by"] = None
    block["compiled"] = {"from_cache": True, "files": compiled_files,
                         "evidence": [{"line_no": e.line_no, "text": e.text} for e in ctx.compiled_cache[:3]]}
    from ..evidence import shorten
    first = ctx.compiled_cache[0]
    return _final(v, Status.UNPROVEN, [
        f"FAIL {ctx.host}  {ctx.label} unproven: the patched code was compiled from the cache, no Python line of it ran",
        f'  evidence: log line {first.line_no} "{shorten(first.text, 160)}"',
        f"  {', '.join(compiled_files)}: code torch.compile compiles; the server loaded its compiled graph from "
        "the cache (keyed by the traced sources' contents), so the probe cannot see its lines run",
        "  " + ctx.profile.compiled_cache_advice] + _runs(v, ctx))


def _rolled_back(v, block: dict):
    """After a rollback the probe watched the imports only: which files the restarted server loaded.
    The restore is judged by sha256 and the markers; this says whether those files are what runs."""
    wrong = {p: why for p, why in block["not_run"].items() if why.startswith("loaded from another file")}
    if wrong:
        v.message += ("\n  note: the restarted server does not run the restored files: "
                      + "; ".join(f"{p}: {why}" for p, why in sorted(wrong.items())))
    elif block["imported"]:
        v.message += "\n  the restarted server imported the restored modules from the restored files: " + ", ".join(sorted(block["imported"]))
    return v


def _none_ran(v, block: dict, ctx: Context) -> list:
    pids = block.get("server_pids") or block["pids"]
    who = f"pid {pids[0]} and {len(pids) - 1} children" if pids else "its processes"
    if len(pids) == 1:
        who = f"pid {pids[0]}"
    elif len(pids) == 2:
        who = f"pid {pids[0]} and 1 child"
    who += _where(block)
    lines = [f"FAIL {ctx.host}  {ctx.label} never executed",
             f"  no line this patch adds ran in the server ({who}) within {int(round(ctx.elapsed))} s of its restart"]
    for path, why in sorted(block["not_run"].items()):
        lines.append(f"    {path}: {_contract_reason(why)}")
    for path in sorted(set(block["ran"]) - set(block["not_run"])):
        lines.append(f"    {path}: ran, but the server does not run its code path")
    if block.get("traced"):
        lines.append("    (lines seen only while traced or captured: "
                     + ", ".join(f"{p} {n}" for p, n in sorted(block["traced"].items())) + ")")
    lines += _runs(v, ctx)
    if _off_path(v, block, ctx):
        paths = sorted({p for f in block.get("changed_files") or [] for p in ctx.profile.paths_of_file(f) or []})
        lines.append(f"  {ctx.label} changes code of {', '.join(paths)} only")
    return lines


def _off_path(v, block: dict, ctx: Context) -> bool:
    """The profile knows the path that runs, and the patch changes no file of it."""
    paths = {p for f in block.get("changed_files") or [] for p in ctx.profile.paths_of_file(f) or []}
    if not (paths and v.executed_path):
        return False
    # a base class of the path that runs is on it (vLLM's EagleSpeculator runs TargetDependentARSpeculator's code)
    return not paths & {v.executed_path, *ctx.profile.ancestors(v.executed_path, ctx.version or "")}


def _where(block: dict) -> str:
    """Where the pids are numbered: nothing on a plain host, the container's namespace on a container host."""
    return " in the container" if block.get("pid_namespace") == "container" else ""


def _contract_reason(why: str) -> str:
    return "imported, but the patch does not change it" if why == probe_verdict.NOT_CHANGED else why


def _never_loaded(v, block: dict, ctx: Context) -> list:
    lines = [f"FAIL {ctx.host}  {ctx.label} not verified: the probe never loaded in the server",
             f"  {block['message']}"]
    started = block.get("interpreter") or {}
    python = started.get("python")
    where = block.get("python") or "engine.python"
    who = f"the server (pid {block.get('server_pid') or '?'})"
    if python and python.startswith("/"):
        venv = f" (venv {started['venv']})" if started.get("venv") else ""
        if _same_interpreter(python, started.get("venv"), block.get("python")):
            lines += [f"  {who} was started with {python}{venv}, engine.python itself: its site step did not run "
                      f"the probe's .pth{' in ' + block['site_dir'] if block.get('site_dir') else ''} (python -S, "
                      "or site-packages reached through PYTHONPATH only)",
                      "  start the server so that it reads its site-packages, or add markers to the patch"]
        else:
            lines += [f"  {who} was started with {python}{venv}, not {where} (where the probe went in)",
                      f"  set engine.python to {python}, or add markers to the patch"]
    else:   # argv[0] not a path the agent could follow: no advice it cannot stand behind
        lines += [f"  {who} was started with {python or 'an interpreter that /proc does not name'}, "
                  f"not {where} (where the probe went in)",
                  "  set engine.python to the interpreter the server was started with, or add markers to the patch"]
    return lines + _runs(v, ctx)


def _same_interpreter(python: str, venv: str | None, engine_python: str | None) -> bool:
    """The server's interpreter is engine.python: the same path, or a python of the same venv."""
    if not engine_python:
        return False
    if os.path.normpath(python) == os.path.normpath(engine_python):
        return True
    return bool(venv) and os.path.dirname(os.path.dirname(os.path.normpath(engine_python))) == os.path.normpath(venv)


def _runs(v, ctx: Context) -> list:
    if not v.executed_path:
        return []
    from ..evidence import EVIDENCE_WIDTH, shorten
    file = ctx.profile.file_of_path(v.executed_path, ctx.version)
    out = [f"  the server runs {v.executed_path}" + (f" ({file})" if file else "")]
    for ev in v.evidence or []:   # what said which path runs, as the markers' verdict quotes it
        if ev.source == "log":
            out.append(f'    evidence: log line {ev.line_no} "{shorten(ev.text, EVIDENCE_WIDTH)}"')
        elif ev.source == "server_info":
            out.append(f"    evidence: {ev.text}")
    if v.cause:
        out.append(f"    cause: {v.cause}")
    return out


def _final(v, status, lines: list):
    v.status, v.final, v.message = status, True, "\n".join(lines)
    v.missing = v.missing or ["an added line that runs"]
    return v


def _pending(v, ctx: Context, what: str):
    v.status, v.final = Status.PENDING, False
    v.missing = [what]
    v.message = f"WAIT {ctx.host}  {ctx.label} waiting for {what}"
    return v


def describe_install(reply: dict | None) -> dict:
    """The `probe` answer of a restart, as the report keeps it."""
    reply = reply or {}
    out = {k: reply[k] for k in ("installed", "site_dir", "python", "python_version", "error") if k in reply}
    if reply.get("stale_removed"):
        out["stale_removed"] = reply["stale_removed"]
    return out


def exe_note(block: dict, view: ExecutionView) -> dict:
    """The block with what /proc said of the server, for the never-loaded message."""
    block = dict(block)
    block["server_pid"] = view.pid
    block["interpreter"] = view.interpreter
    block["python"] = (view.plan or {}).get("python") or view.installed.get("python")
    block["site_dir"] = view.installed.get("site_dir")
    block["changed_files"] = sorted(m["path"] for m in ((view.plan or {}).get("modules") or {}).values()
                                    if m.get("lines"))
    return block
