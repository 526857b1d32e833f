"""Laptop side of the probe (pure): a diff's added lines, and the report's ``execution`` block.

`added_lines` reads a unified diff and gives, per file, the line numbers in the
patched file of the lines it adds or changes. `execution_block` turns the
records the probe wrote on a host (runtime.py says what they are) into::

    {"mode": "lines" | "functions" | "off" | "unavailable",
     "pids": [...], "ran": {path: [lines]}, "traced": {path: [lines]},
     "imported": {module: file}, "not_run": {path: reason}, "message": "..."}

``ran`` holds only lines the revision adds (in functions mode: the added lines
held by a function, class or module body that started running). ``traced``
holds lines first seen only while torch.compile traced them or a CUDA graph
was captured: they are not counted as run, and not as never run either.
``calls`` {path: {function: {"count", "exact", "lines"}}} counts the functions
that hold added lines and the sibling functions the probe watched (``lines``:
the added lines it holds, none for a sibling's); ``ran_at`` is the host-clock
time the first added line ran. `reach` turns a block into how far the code got
(verified, not-executed, unproven) and what proved it (`Timeline`).
"""
import json
import re
from dataclasses import dataclass
from typing import Optional

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

NEVER_IMPORTED = "never imported"
NOT_CHANGED = "imported, but this revision does not change it"
NO_LINE_RAN = "imported, but none of its added lines ran"
ONLY_TRACED = "imported, its added lines only traced (torch.compile or CUDA graph capture), never run"
EXACT_COUNTS = 8     # the probe's count records are exact up to this count (runtime.py, COUNT_EXACT)


def diff_path(header):
    """'+++ b/python/sglang/x.py\\t2024-..' -> 'sglang/x.py' (None for /dev/null)."""
    path = header[4:].split("\t")[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == "/dev/null":
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if len(parts) > 1 and parts[0] in ("a", "b"):
        parts = parts[1:]
    if len(parts) > 2 and parts[0] == "python":
        parts = parts[1:]
    return "/".join(parts)


@dataclass(frozen=True)
class DiffHunk:
    """One hunk of a unified diff: its header's numbers and the kind of each of its body lines."""
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    kinds: str      # one character a body line: '+' added, '-' removed, ' ' context ('\\' lines left out)


def diff_files(diff_text, deleted=False):
    """[(path, [DiffHunk])]: one entry a '---'/'+++' header pair of a unified diff, in order, keyed
    by its '+++' path as `diff_path` gives it; with `deleted`, by its '---' path where it has one
    (a deleted file's too). An entry whose path is None (/dev/null) has its hunks left unread.
    The one walk of a diff's hunks that `added_lines` and `hunk_maps` share."""
    files = []
    lines = diff_text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            path = diff_path(line)
            files.append(((diff_path(lines[i - 1]) or path) if deleted else path, []))
        elif line.startswith("@@") and files and files[-1][0] is not None and HUNK_RE.match(line):
            hunk, i = read_hunk(lines, i)
            files[-1][1].append(hunk)
        i += 1
    return files


def read_hunk(lines, at):
    """The hunk whose header is lines[at], and the index of its last body line."""
    m = HUNK_RE.match(lines[at])
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    kinds, old_left, new_left = [], old_len, new_len
    while (old_left > 0 or new_left > 0) and at + 1 < len(lines):
        at += 1
        kind = lines[at][:1] or " "     # an empty line is a context line whose editor dropped its space
        if kind in ("+", "-", " "):
            kinds.append(kind)
        if kind in (" ", "-"):
            old_left -= 1
        if kind in (" ", "+"):
            new_left -= 1
        # '\\ No newline at end of file' counts on neither side
    return DiffHunk(int(m.group(1)), old_len, int(m.group(3)), new_len, "".join(kinds)), at


def hunk_shift(offsets, path, number):
    """How far hunk `number` (from 0) of `path` sits from its header's line (`offsets` as in `added_lines`)."""
    shift = (offsets or {}).get(path, [])
    return shift[number] if number < len(shift) else 0


def added_lines(diff_text, offsets=None):
    """{path: [post-image line numbers of '+' lines]} of a unified diff.

    `offsets` {path: [per-hunk offset]} (diffapply's FileResult.offsets) shifts
    each hunk to where it really applied in the file."""
    out = {}
    for path, hunks in diff_files(diff_text):
        if path is None:      # a deleted file adds no line
            continue
        found = out.setdefault(path, [])
        for number, hunk in enumerate(hunks):
            at = hunk.new_start + hunk_shift(offsets, path, number)
            for kind in hunk.kinds:
                if kind == "+":
                    found.append(at)
                if kind in ("+", " "):
                    at += 1
    return {p: sorted(set(v)) for p, v in out.items()}


def hunk_maps(diff_text, offsets=None):
    """{path: [(first old line, old length, new length, {old line: new line} of its context)]}
    of a unified diff, each hunk where it really applied (`offsets` as in `added_lines`)."""
    out = {}
    for path, hunks in diff_files(diff_text, deleted=True):
        maps = out.setdefault(path, [])
        for number, hunk in enumerate(hunks):
            drift = hunk_shift(offsets, path, number)
            o, n = hunk.old_start + drift, hunk.new_start + drift
            kept = {}
            for kind in hunk.kinds:
                if kind == " ":
                    kept[o] = n
                if kind in (" ", "-"):
                    o += 1
                if kind in (" ", "+"):
                    n += 1
            first = hunk.old_start + drift if hunk.old_len else hunk.old_start + drift + 1
            maps.append((first, hunk.old_len, hunk.new_len, kept))
    return out


def carry_lines(lines_by_path, diff_text, offsets=None):
    """{path: [lines]} of a patch already on the files, numbered as they are once the diff
    `diff_text` is applied on top: shifted past its hunks; a line that the diff removes or
    changes is gone (it no longer holds that patch's code)."""
    maps = hunk_maps(diff_text, offsets)
    out = {}
    for path, lines in lines_by_path.items():
        hunks = maps.get(path)
        if hunks is None:
            out[path] = sorted(lines)
            continue
        moved = set()
        for line in lines:
            delta, new = 0, None
            for first, old_len, new_len, kept in hunks:
                if line < first:
                    new = line + delta
                    break
                if line < first + old_len:
                    new = kept.get(line)
                    break
                delta += new_len - old_len
            else:
                new = line + delta
            if new is not None:
                moved.add(new)
        out[path] = sorted(moved)
    return out


def parse_records(files):
    """{process dir: {"process": {...}, "records": [(name, obj)]}} from {"<dir>/<name>": bytes}."""
    procs = {}
    for key in sorted(files):
        folder, _, name = key.partition("/")
        if not name:
            continue
        try:
            obj = json.loads(files[key].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            obj = {"unreadable": True}
        entry = procs.setdefault(folder, {"process": None, "records": []})
        if name == "process.json":
            entry["process"] = obj
        else:
            entry["records"].append((name, obj))
    return procs


def pid_of(folder, proc):
    if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
        return proc["pid"]
    head = folder.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def collect(procs, plan_modules, added, pids):
    """Walk every process's records; returns the pieces execution_block reports."""
    seen = {"ran": {}, "traced": {}, "files": {}, "pids": set(), "modes": set(), "disabled": [],
            "calls": {}, "ran_at": None, "procs": {}}
    for folder, entry in procs.items():
        pid = pid_of(folder, entry["process"])
        if pids is not None and pid not in pids:
            continue
        seen["pids"].add(pid)
        if entry["process"]:
            seen["modes"].add(entry["process"].get("mode"))
        for name, obj in entry["records"]:
            take_record(seen, name, obj, pid, plan_modules, added)
    return seen


def take_record(seen, name, obj, pid, plan_modules, added):
    if name == "disabled":
        seen["disabled"].append((pid, str(obj.get("reason", "unknown reason"))))
        return
    module = obj.get("module")
    path = obj.get("path") or (plan_modules.get(module) or {}).get("path")
    if not path:
        return
    if name.startswith("M-"):
        seen["files"].setdefault(module, []).append((obj.get("file"), bool(obj.get("same")), obj.get("note") or ""))
        return
    if name.startswith("C-"):
        take_count(seen, path, obj)
        return
    lines = obj.get("lines") if "lines" in obj else [obj.get("line")]
    wanted = set(added.get(path, ()))
    got = {n for n in lines or () if isinstance(n, int) and n in wanted}
    if name.startswith(("L-", "F-")):
        seen["ran"].setdefault(path, set()).update(got)
        if got and isinstance(obj.get("proc"), str):   # the process's multiprocessing name (runtime.process_name)
            seen["procs"].setdefault(path, set()).add(obj["proc"])
        at = obj.get("t")
        if got and isinstance(at, (int, float)) and (seen["ran_at"] is None or at < seen["ran_at"]):
            seen["ran_at"] = float(at)
    elif name.startswith("T-"):
        seen["traced"].setdefault(path, set()).update(got)


def take_count(seen, path, obj):
    """A count record (C-): a watched function ran `count` times in one process (the probe writes
    it at counts 1 to EXACT_COUNTS, then at each power of two: from EXACT_COUNTS on it is a lower bound)."""
    unit, count = obj.get("unit"), obj.get("count")
    if not isinstance(unit, str) or not isinstance(count, int) or count < 1:
        return
    entry = seen["calls"].setdefault(path, {}).setdefault(unit, {"count": 0, "exact": True, "lines": []})
    entry["count"] += count
    entry["exact"] = entry["exact"] and count < EXACT_COUNTS    # the next write after 8 is at 16
    entry["lines"] = sorted(set(entry["lines"]) | {n for n in obj.get("lines") or () if isinstance(n, int)})


def imported_files(plan_modules, files):
    """(imported {module: file}, wrong {path: reason}) from the import records."""
    imported = {}
    wrong = {}
    for module, loads in sorted(files.items()):
        spec = plan_modules.get(module) or {}
        good = [f for f, same, _ in loads if same]
        other = sorted({f for f, same, _ in loads if not same and f})
        imported[module] = good[0] if good else (other[0] if other else None)
        if other:
            wrong[spec.get("path") or module] = "loaded from another file (%s instead of %s)" % (
                other[0], spec.get("expected") or "the patched file")
    return imported, wrong


def mode_of(seen):
    modes = seen["modes"] - {None}
    if not seen["pids"]:
        return "unavailable"
    if len(seen["disabled"]) >= len(seen["pids"]):
        return "unavailable"
    return "functions" if "functions" in modes or not modes else "lines"


def execution_block(files, plan, added, pids=None):
    """The report's execution block from the records `files` of one restart (install.read_records),
    the `plan` the probe ran with, and `added` {path: [lines]}. `pids`: only these processes count."""
    plan_modules = plan.get("modules") or {}
    seen = collect(parse_records(files), plan_modules, added, pids)
    imported, wrong = imported_files(plan_modules, seen["files"])
    ran = {p: sorted(v) for p, v in sorted(seen["ran"].items()) if v}
    traced = {p: sorted(v - seen["ran"].get(p, set())) for p, v in sorted(seen["traced"].items())}
    traced = {p: v for p, v in traced.items() if v}
    not_run = {}
    for module, spec in sorted(plan_modules.items()):
        path = spec.get("path") or module
        if path in ran:
            continue
        if path in wrong:
            not_run[path] = wrong[path]
        elif module not in imported:
            not_run[path] = NEVER_IMPORTED
        elif not added.get(path):
            not_run[path] = NOT_CHANGED
        else:
            not_run[path] = ONLY_TRACED if path in traced else NO_LINE_RAN
    mode = mode_of(seen)
    return {"mode": mode, "pids": sorted(p for p in seen["pids"] if p is not None), "ran": ran,
            "imported": imported, "not_run": not_run, "traced": traced, "calls": seen["calls"],
            "ran_at": seen["ran_at"], "siblings": sibling_paths(plan_modules, added),
            "processes": {p: sorted(v) for p, v in sorted(seen["procs"].items()) if p in ran},
            "message": summary(mode, seen, ran, traced)}


def sibling_paths(plan_modules, added):
    """{sibling path: [the patched paths it is the sibling of]} that this patch does not change."""
    out = {}
    for spec in plan_modules.values():
        path = spec.get("path")
        twins = [t for t in spec.get("twins") or () if added.get(t)]
        if path and twins and not added.get(path):
            out[path] = sorted(twins)
    return out


def summary(mode, seen, ran, traced):
    procs = len(seen["pids"])
    off = "; ".join("pid %s: %s" % (pid, why) for pid, why in sorted(seen["disabled"], key=str)[:3])
    if not procs:
        return "the probe recorded no process of the server: it never loaded there"
    if mode == "unavailable":
        return "the probe turned itself off in every process (%s)" % off
    n_ran = sum(len(v) for v in ran.values())
    text = "%d added line%s ran in %d file%s, seen in %d process%s" % (
        n_ran, "" if n_ran == 1 else "s", len(ran), "" if len(ran) == 1 else "s", procs, "" if procs == 1 else "es")
    if traced:
        text += "; %d only traced" % sum(len(v) for v in traced.values())
    if off:
        text += "; the probe turned itself off in %s" % off
    return text


def execution_off(mode, message):
    """The block when the probe did not watch: mode 'off' (asked so) or 'unavailable' (could not)."""
    return {"mode": mode, "pids": [], "ran": {}, "imported": {}, "not_run": {}, "traced": {}, "message": message}


# ---------------------------------------------------------------------- how far the code got

VERIFIED, NOT_EXECUTED, UNPROVEN = "verified", "not-executed", "unproven"
PROVE_HOW = ("to prove it, send requests that take that branch: more at once (the patch's prove.concurrency), "
             "real traffic (--bake S), or verify-logs later")


@dataclass(frozen=True)
class Timeline:
    """When things happened on the host, on the host's clock (time.time() there, as the probe's
    records are stamped), each None where unknown:

    - ready_at: the server logged that it was ready (SGLang logs it after its own warmup request);
    - smoke_from, smoke_to: fleetpatch's smoke requests began, and the wait after the last answer
      ended (the smoke step fills these; a deploy's verdict time may stand in for smoke_to).

    An added line that first ran before ready_at was proved by `startup`, from smoke_from (or
    ready_at) to smoke_to by `smoke`, after smoke_to by `traffic`."""

    ready_at: Optional[float] = None
    smoke_from: Optional[float] = None
    smoke_to: Optional[float] = None

    def proved_by(self, ran_at):
        """'startup', 'smoke' or 'traffic' for a first run at host time `ran_at` (None: unknown)."""
        if ran_at is None:
            return None
        if self.ready_at is not None and ran_at < self.ready_at:
            return "startup"
        if self.smoke_to is not None:
            return "smoke" if ran_at <= self.smoke_to else "traffic"
        if self.smoke_from is not None and ran_at >= self.smoke_from:
            return "smoke"
        return "traffic" if self.ready_at is not None else None


def times(entry):
    """'once', '3 times', 'at least 64 times' of a count entry."""
    n = entry["count"]
    if n == 1 and entry["exact"]:
        return "once"
    return ("%d times" if entry["exact"] else "at least %d times") % n


def short_name(path):
    return path.rsplit("/", 1)[-1]


def reach(block, added, timeline=None):
    """How far the patch's code got, from its execution `block` (execution_block) and its `added`
    {path: [lines]}: {"status": verified | not-executed | unproven, "proved_by": startup | smoke |
    traffic | None, "lines": [message lines]}.

    verified: an added line ran. unproven: a function that holds an added line ran but none of the
    lines did, or the patched files were imported and nothing on their path ran yet. not-executed:
    no patched file was imported, or a sibling's function ran while no added line did."""
    if block.get("ran"):
        return {"status": VERIFIED, "proved_by": (timeline or Timeline()).proved_by(block.get("ran_at")), "lines": []}
    calls = block.get("calls") or {}
    holders = [(path, unit, entry) for path, units in sorted(calls.items()) if added.get(path)
               for unit, entry in sorted(units.items()) if set(entry["lines"]) & set(added[path])]
    if holders:
        path, unit, entry = max(holders, key=lambda h: h[2]["count"])
        first = min(set(entry["lines"]) & set(added[path]))
        return {"status": UNPROVEN, "proved_by": None, "lines": [
            "  %s (%s) ran %s, but no line this patch adds ran: line %d of %s never did (its condition never held)"
            % (unit, short_name(path), times(entry), first, path), "  " + PROVE_HOW]}
    sibling = sibling_ran(block, calls)
    if sibling:
        return {"status": NOT_EXECUTED, "proved_by": None, "lines": [sibling]}
    imported = [p for p, why in sorted((block.get("not_run") or {}).items())
                if added.get(p) and why in (NO_LINE_RAN, ONLY_TRACED)]
    if imported:
        return {"status": UNPROVEN, "proved_by": None, "lines": [
            "  %s: imported, but no function that holds its added lines ran yet (first added line %d)"
            % (path, min(added[path])) for path in imported] + ["  " + PROVE_HOW]}
    return {"status": NOT_EXECUTED, "proved_by": None, "lines": []}


def sibling_ran(block, calls):
    """The message line naming the sibling function that ran most, or ''."""
    ran = [(path, unit, entry) for path, twins in sorted((block.get("siblings") or {}).items())
           for unit, entry in sorted((calls.get(path) or {}).items())]
    if not ran:
        return ""
    path, unit, entry = max(ran, key=lambda r: r[2]["count"])
    twins = block["siblings"][path]
    return "  %s (%s) ran %s; this patch changes only %s" % (
        unit, short_name(path), times(entry), ", ".join(short_name(t) for t in twins))
